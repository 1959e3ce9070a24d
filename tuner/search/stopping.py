"""When a search stops by itself: once the answer is known, or once it stops improving.

Three rules, checked before each launch (:meth:`tuner.study.loop.StudyLoop.budget_reason`):

1. **The answer is known** (model sampler only, ``search.stop_chance``): the corrected time model
   (:meth:`tuner.search.sampler.ModelGuidedSampler.chance_to_beat`) gives the untried configs,
   together, less than ``stop_chance`` (10 % by default) probability that one of them beats the
   best measured step time by more than :data:`IMPROVEMENT`: ten independent 2 % chances are an
   18 % one, not ten negligible ones. The probability comes from the sampler's belief about the log
   step time of each config: the posterior of the correction fitted to measured/predicted ratios
   (this study's and the cluster's saved calibration), plus the run-to-run noise, its width
   rescaled by the study's leave-one-out misses and read as Student's t (:class:`~tuner.search.
   sampler.Belief`). A config
   whose corrected prediction is 5 % slower than the best, with a spread of 2 %, has about a 0.1 %
   chance; one predicted as fast as the best, with any spread, has about 40 % or more.
2. **Not worth its cost** (model sampler only, on with ``stop_chance``): the untried config
   whose launch is worth most still has an expected gain below its predicted node-hours
   (:func:`tuner.search.value.best_worth`: the expected improvement of the step time of the
   config the training run would use once that launch is measured, times
   ``search.train_node_hours``, the training run the answer is for). The gain is the
   knowledge gradient (:func:`tuner.search.value.lookahead_spread`): the run pays a config's
   true step time, so the run-to-run noise of the figure is no gain, and what a config shares
   with the best measured one moves both. Rule 1 asks "can anything still win?"; this one "is
   what it might win worth a launch?".
3. **No improvement** (every sampler, ``search.early_stop_trials``: the fallback): the best has
   not improved by :data:`IMPROVEMENT` within the last N launched trials.

The model rule is only asked when the trials changed since it last answered (a fit costs
milliseconds to a second on big spaces, and the loop checks several times a second). It is asked
while trials run too: the sampler counts a running config as tried, at its believed step time,
and asks again when each one finishes, so a stop found meanwhile only holds the next launches
back, and a finished trial whose figure reopens a chance lets them go on. (Waiting for every
running trial first, as it once did, meant that with room for several trials at once the loop
refilled each freed slot before the rules could fire: they never stopped a parallel study.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optuna.trial import FrozenTrial

from tuner.config.spelling import spell
from tuner.search.value import IMPROVEMENT
from tuner.space.cost import node_hours
from tuner.space.trials import measured_value
from tuner.spec.study import StudySpec


class Stopper:
    """The stop rules of one study loop; call it with the study's trials."""

    def __init__(self, spec: StudySpec, sampler: Any) -> None:
        self.spec = spec
        self.sampler = sampler
        self._seen: tuple[int, int] | None = None
        self._answer: str | None = None

    def __call__(self, trials: Sequence[FrozenTrial]) -> str | None:
        """Why the search should stop launching (None: go on)."""
        return self.known(trials) or self.no_improvement(trials)

    def known(self, trials: Sequence[FrozenTrial]) -> str | None:
        """Rule 1, then rule 2, or None when neither applies."""
        chance = self.spec.search.stop_chance
        if not chance or not hasattr(self.sampler, "chance_to_beat"):
            return None
        state = (sum(t.state.is_finished() for t in trials), len(trials))
        if state == self._seen:
            return self._answer
        self._seen = state
        self._answer = None
        found = self.sampler.chance_to_beat(trials, IMPROVEMENT)
        if found is not None and found[0] < chance:
            p, config = found
            self._answer = (
                f"the answer is known: the untried configs have a {p:.1%} chance, together, of "
                f"beating the best by {IMPROVEMENT:.0%}, under {chance:.0%} (likeliest: "
                f"{spell(config)})"
            )
        elif hasattr(self.sampler, "next_launch_worth"):
            self._answer = self.not_worth(trials)
        return self._answer

    def not_worth(self, trials: Sequence[FrozenTrial]) -> str | None:
        """Rule 2, or None (asked by :meth:`known`, which caches the answer)."""
        found = self.sampler.next_launch_worth(trials)
        if found is None or found[0].pays:
            return None
        worth, config = found
        gain, cost = node_hours(worth.gain_node_hours), node_hours(worth.cost_node_hours)
        return (
            f"not worth another launch: the most promising untried config ({spell(config)}) "
            f"is expected to save {gain} node-hours of the training run "
            f"(by how its measurement may change the config the run uses) and would cost "
            f"{cost} node-hours"
        )

    def no_improvement(self, trials: Sequence[FrozenTrial]) -> str | None:
        """Rule 3, or None."""
        k = self.spec.search.early_stop_trials
        if not k:
            return None  # off: no pass over the trials
        launched = [t for t in trials if t.user_attrs.get("launched") and t.state.is_finished()]
        if len(launched) <= k:
            return None
        launched.sort(key=lambda t: t.number)
        steps = [measured_value(t) for t in launched]  # a stored non-figure is no step
        before = [v for v in steps[:-k] if v is not None]
        recent = [v for v in steps[-k:] if v is not None]
        if before and (not recent or min(recent) > min(before) * (1 - IMPROVEMENT)):
            return f"no 1% improvement in the last {k} trials (early stop)"
        return None
