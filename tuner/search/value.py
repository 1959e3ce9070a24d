"""What one more launch is worth: expected improvement per node-hour, and when to stop paying.

The model sampler (:mod:`tuner.search.sampler`) holds, for every untried config, a belief about
its log step time: Student's t (Gaussian before its width is learned) with location ``mu`` and
scale ``spread``, the correlated posterior's predictive sd rescaled by how far the corrected
model has really been off (:meth:`~.sampler.Belief.spread`), and ``dof`` degrees of freedom.
From these and a config's predicted trial node-hours (:func:`tuner.space.cost.trial_cost`:
start-up charged per launch, plus the warm-up and the iterations the step-time estimate needs,
at the corrected predicted step time) this module decides three things:

1. **Which config next**: the highest expected improvement *per node-hour* of its trial, the
   improvement of the config the run would use once the launch is measured, over every config
   the measurement moves (:mod:`tuner.search.knowledge`; :func:`improvement` of the config's
   own figure when no such value is given). Two configs equally likely to win are not equally
   worth launching when one trial costs twice the other, nor when one's measurement also
   settles configs that share its knob values.
2. **Never a long shot just to explore**: a config whose chance of beating the best by
   :data:`IMPROVEMENT` is under :data:`NEGLIGIBLE_CHANCE` is not launched while any config has
   more. Expected improvement alone would pick an uncertain config that is all but sure to be
   slower, only because its spread is wide.
3. **When the next launch is not worth its cost**: its expected gain, valued as
   ``expected improvement x search.train_node_hours`` (a fraction of the step time saved over the
   training run the answer is for), is below its predicted node-hours, for every config left.
   The improvement is that of the config the run would use *after* the launch is measured
   (:func:`lookahead_spread`, the knowledge gradient): a lucky figure is no gain to a run that
   pays the true step time, and a config that shares its doubt with the incumbent moves with
   it. A model that keeps being wrong widens ``scale`` and keeps the search going.

The exchange rate. A launch pays off when the node-hours it is expected to save on the training
run exceed its own. With ``search.train_node_hours`` unset, the run is taken to be
:data:`DEFAULT_RUN_TRIALS` trials long (of the model's fastest config): one more launch must be
expected to save at least 1/200 = 0.5 % of the step time. Set ``train_node_hours`` to the real
run's size (a 1,000-node-hour run and 2-node-hour trials: a launch must be expected to gain 0.2 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tuner.calibrate.correction import Posterior, expected_improvement, normal_cdf
from tuner.search.ranking import RowPosterior, cross_covariance

IMPROVEMENT = 0.01
"""A gain smaller than this (1 % of the step time) is within run-to-run noise of a short run."""

NEGLIGIBLE_CHANCE = 0.01
"""A config with less than this chance of beating the best by :data:`IMPROVEMENT` is never
launched while another has more: exploring it would almost surely buy a slower figure."""

DEFAULT_RUN_TRIALS = 200.0
"""With ``search.train_node_hours`` unset: the training run is worth this many trials of the
model's fastest config, so a launch must be expected to gain 1/200 = 0.5 % of the step time."""

Purpose = Literal["exploitation", "exploration", "confirmation"]
"""Why a config was launched: *exploitation*, the belief's mean says it beats the best measured
(or nothing is measured yet and it is the model's fastest); *exploration*, its mean is slower and
it was picked for its spread; *confirmation*, a full-scale run of a config already measured at a
smaller scale (proxy trials, ``search.proxy``)."""

PURPOSE_ATTR = "purpose"
"""The trial attribute (a system attribute set by the model sampler; a user attribute set by
whoever launches a confirmation) that holds the trial's :data:`Purpose`."""


def purpose_of(system_attrs: dict[str, Any], user_attrs: dict[str, Any]) -> str | None:
    """A trial's :data:`Purpose` from its attributes, or None when no one recorded it (another
    sampler than the model's)."""
    found = user_attrs.get(PURPOSE_ATTR) or system_attrs.get(PURPOSE_ATTR)
    return None if found is None else str(found)


def student_cdf(z: np.ndarray, dof: int | None) -> np.ndarray:
    """The distribution function of Student's t with ``dof`` (a positive integer) degrees of
    freedom, elementwise; the standard normal's when ``dof`` is None. The finite sums of
    Abramowitz and Stegun (1964, 26.7.3 and 26.7.4) for ``P(|T| <= t)`` with
    ``theta = atan(t / sqrt(dof))``: vectorised, no special-function library."""
    z = np.asarray(z, dtype=float)
    if dof is None:
        return np.asarray(normal_cdf(z))
    theta = np.arctan(np.abs(z) / math.sqrt(dof))
    c2 = np.cos(theta) ** 2
    if dof % 2:  # odd: (2 / pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, total = np.ones_like(z), np.ones_like(z)
        for k in range(1, (dof - 1) // 2):
            term = term * c2 * (2 * k) / (2 * k + 1)
            total = total + term
        inner = np.sin(theta) * np.cos(theta) * total if dof > 1 else 0.0
        inside = 2 / math.pi * (theta + inner)
    else:  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term, total = np.ones_like(z), np.ones_like(z)
        for k in range(1, dof // 2):
            term = term * c2 * (2 * k - 1) / (2 * k)
            total = total + term
        inside = np.sin(theta) * total
    return np.asarray(0.5 + np.sign(z) * inside / 2)


def student_pdf(z: np.ndarray, dof: int | None) -> np.ndarray:
    """The density of Student's t with ``dof`` degrees of freedom (None: the normal's)."""
    z = np.asarray(z, dtype=float)
    if dof is None:
        return np.asarray(np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi))
    log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    return np.asarray(math.exp(log_c) * (1 + z**2 / dof) ** (-(dof + 1) / 2))


def improvement(mu: np.ndarray, spread: np.ndarray, best: float, dof: int | None) -> np.ndarray:
    """Expected decrease below ``best`` of each config's log step time, read as Student's t
    (location ``mu``, scale ``spread``, ``dof`` degrees of freedom; None: Gaussian):
    ``(best - mu) F(z) + spread (dof + z^2) / (dof - 1) f(z)``, ``z = (best - mu) / spread``
    (the Gaussian's ``(best - mu) Phi(z) + spread phi(z)`` as ``dof`` grows; Shah, Wilson and
    Ghahramani 2014, Student-t processes, section 5)."""
    if dof is None:
        return np.asarray(expected_improvement(mu, spread, best))
    z = (best - mu) / spread
    gain = (best - mu) * student_cdf(z, dof)
    return np.asarray(gain + spread * (dof + z**2) / (dof - 1) * student_pdf(z, dof))


def chance(
    mu: np.ndarray, spread: np.ndarray, best: float, margin: float = IMPROVEMENT,
    dof: int | None = None,
) -> np.ndarray:  # fmt: skip
    """Probability that each config's log step time (location ``mu``, scale ``spread``;
    Student's t with ``dof`` degrees of freedom, Gaussian when None) is below ``best`` by more
    than ``margin`` (a fraction of the step time)."""
    return student_cdf((best + math.log1p(-margin) - mu) / spread, dof)


@dataclass(frozen=True, slots=True)
class Belief:
    """What the corrected time model believes about the configs not tried yet."""

    open_: list[int]
    """Indices (into the ranked candidates) of the configs still to try."""
    mu: np.ndarray
    """Posterior mean of the log step time of each."""
    sd: np.ndarray
    """Posterior standard deviation of the correction (weights only, no run noise), at the
    prior's stated scale."""
    best: float | None
    """log of the best step time measured in this study, or None."""
    scale: float | None = None
    """How far the corrected model has really been off on configs it had not seen, in units of
    what its posterior predicted for them: the root mean square of this study's leave-one-out
    residuals each divided by its own leave-one-out predictive sd
    (:func:`~tuner.search.ranking.loo_scale`; None below
    :data:`~tuner.search.sampler.MIN_ERROR_RUNS` measured configs)."""
    dof: int | None = None
    """The degrees of freedom :attr:`scale` is known with: each config's log step time is
    Student's t with these around ``mu`` (None: Gaussian, before the scale is learned)."""
    fitted: Posterior | RowPosterior | None = None
    """The correction's posterior the belief was read from (None: nothing measured yet): what
    :func:`tuner.search.ranking.covariance` reads how configs' errors move together from."""
    incumbent: int | None = None
    """Index (into the ranked candidates) of the best measured config, or None: the config the
    training run would use today, which one more launch may replace (:func:`lookahead_spread`)."""

    def lookahead(self, x: np.ndarray, noise: float) -> np.ndarray:
        """How far one launch of each untried config is expected to move the choice of the
        config to train with (:func:`lookahead_spread`: its correction's posterior variance
        and covariance with the incumbent's, the run-to-run ``noise``, the study's leave-one-out
        scale; ``sd`` before anything was fitted); ``x``: every candidate's features."""
        if self.fitted is None:
            return np.asarray(np.maximum(self.sd, 1e-12))
        z = x[np.asarray(self.open_)]
        cov = (np.zeros(len(self.open_)) if self.incumbent is None
               else cross_covariance(self.fitted, z, x[self.incumbent]))  # fmt: skip
        scale = 1.0 if self.scale is None else self.scale
        spread = lookahead_spread(np.square(self.sd), cov, noise, scale)
        return np.asarray(np.maximum(spread, 1e-12))

    def spread(self, noise: float) -> np.ndarray:
        """How far each untried config's log step time may be from ``mu``: its posterior
        predictive sd (the correction's, plus the run-to-run ``noise``) times :attr:`scale`,
        never under the noise. The posterior is correlated through shared knob values, so a
        config whose values (and pairs of values) were measured has a narrow spread and one
        with a value never measured keeps the prior's doubt about it; :attr:`scale` restates
        the prior's width to the error the model has shown on held-out configs (1 before it
        is known)."""
        predictive = np.sqrt(np.square(self.sd) + noise**2)
        if self.scale is None:
            return np.asarray(predictive)
        return np.asarray(np.maximum(self.scale * predictive, noise))


JOINT_DRAWS = 4000
"""Draws of the joint belief :func:`joint_chance` counts: its answer is within about 0.5 % of
the exact probability near the 10 % a stop is judged at (binomial sd
``sqrt(0.1 x 0.9 / 4000)``)."""

JOINT_CONTENDERS = 256
"""The untried configs, likeliest first, whose joint belief :func:`joint_chance` draws: the
rest each have a smaller chance than the last of these, and most share its knob values."""


def joint_chance(
    mu: np.ndarray, spread: np.ndarray, corr: np.ndarray, best: float,
    margin: float = IMPROVEMENT, dof: int | None = None,
) -> float:  # fmt: skip
    """Probability that *at least one* of the configs beats ``best`` by more than ``margin``:
    their log step times drawn together, multivariate Student's t (Gaussian when ``dof`` is
    None) with location ``mu``, scales ``spread`` and correlation ``corr``; one chi-square
    draw scales every config of a draw, since the width's doubt is shared (Kotz and
    Nadarajah, Multivariate t Distributions, 2004, section 1.1). At least the largest
    single chance and at most their sum: configs sharing an unmeasured knob value win or
    lose together, configs with independent doubts add up. :data:`JOINT_DRAWS` draws from a
    fixed seed, so the same beliefs always give the same answer."""
    rng = np.random.default_rng(0)
    values, vectors = np.linalg.eigh(corr)  # a square root that holds when corr is singular
    root = vectors * np.sqrt(np.clip(values, 0.0, None))
    g = root @ rng.standard_normal((len(mu), JOINT_DRAWS))
    if dof is not None:
        g = g / np.sqrt(rng.chisquare(dof, JOINT_DRAWS) / dof)
    below = mu[:, None] + spread[:, None] * g < best + math.log1p(-margin)
    return float(below.any(axis=0).mean())


@dataclass(frozen=True, slots=True)
class Pick:
    """The config chosen among the open ones, and why."""

    index: int
    """Position in the arrays passed to :func:`pick`."""
    purpose: Purpose
    per_node_hour: float
    """Its expected improvement of the log step time per node-hour of its trial."""


def pick(
    mu: np.ndarray, sd: np.ndarray, spread: np.ndarray, cost: np.ndarray, best: float,
    dof: int | None = None, gain: np.ndarray | None = None,
) -> tuple[Pick, np.ndarray]:  # fmt: skip
    """The config with the highest expected improvement per node-hour (``cost``) among those with
    at least :data:`NEGLIGIBLE_CHANCE` of beating ``best`` by :data:`IMPROVEMENT` (all of them
    when none has), and the indices of the ties (the caller breaks them at random).
    ``gain``: each config's expected improvement, when the caller has it (the model sampler's:
    that of the config the run would use once the launch is measured,
    :func:`tuner.search.knowledge.launch_values`); else that of the config's own figure, under
    ``sd`` (the posterior's spread). ``spread`` is the one the chance is judged by; ``dof``,
    the degrees of freedom both are read with (None: Gaussian). A ``gain`` that is nothing for
    every config the chance admits ranks none: the figure's own then decides."""
    p = chance(mu, spread, best, dof=dof)
    eligible = p >= NEGLIGIBLE_CHANCE
    if not eligible.any():
        eligible = np.ones_like(eligible)
    if gain is None or not (gain[eligible] > 0).any():
        gain = improvement(mu, np.maximum(sd, 1e-12), best, dof)
    # An expected improvement is never below zero, but far in the tail (a long study, every
    # open config many spreads behind the best) the t distribution's series leaves it within
    # ~1e-16 of zero on either side: each open config's score was then a hair below zero,
    # none reached the top's bound and the ask failed (an IndexError ended the run at 10,000
    # stored trials). Read below zero (or no number) as nothing: the ties then go at random.
    gain = np.nan_to_num(np.maximum(gain, 0.0), nan=0.0)
    score = np.where(eligible, gain / cost, -1.0)
    top = np.flatnonzero(score >= score.max() * (1 - 1e-9))
    i = int(top[0])
    purpose: Purpose = "exploitation" if mu[i] <= best else "exploration"
    return Pick(i, purpose, float(score[i])), top


def lookahead_spread(
    var: np.ndarray, cov: np.ndarray, noise: float, scale: float
) -> np.ndarray:  # fmt: skip
    """How far one launch of each config is expected to move the *decision*: the scale of
    the change its measurement makes to the gap between the incumbent's and its own believed
    (noise-free) log step time, ``scale |var - cov| / sqrt(var + noise^2)``.

    ``var`` is each config's posterior variance of the correction (no run-to-run noise),
    ``cov`` its posterior covariance with the incumbent's (the best measured config),
    ``noise`` the run-to-run sd of one measured figure and ``scale`` the factor the study's
    leave-one-out misses put on the predictive covariance (:attr:`Belief.scale`; noise and
    correction scaled together, as that factor was learned). A measurement ``y = T + e`` of a
    config moves the posterior mean of its true log step time by ``var / sqrt(var + noise^2)``
    standard normals and the incumbent's by ``cov / sqrt(var + noise^2)`` of the same draw
    (the Gaussian update of a correlated belief): the expected gain of then training with the
    better of the two is the expected improvement of that gap (the knowledge gradient of
    correlated beliefs, Frazier, Powell and Dayanik, INFORMS J. Computing 21(4), 2009, for the
    two alternatives the run would choose between).

    Against :meth:`Belief.spread` (the spread of one *measured figure*), two things go: the
    measurement's own noise is not a gain (the training run pays the config's true step time,
    not a lucky figure), and what the config shares with the incumbent moves both alike. A
    config the correction already knows (``var`` near 0) teaches nothing, however noisy its
    figure would be."""
    denominator = np.sqrt(np.asarray(var) + noise**2)
    return np.asarray(scale * np.abs(np.asarray(var) - np.asarray(cov)) / denominator)


@dataclass(frozen=True, slots=True)
class Worth:
    """The best next launch judged by what it is expected to save against what it costs."""

    index: int
    """Position of the config with the highest expected net worth."""
    gain_node_hours: float
    """Its expected improvement (a fraction of the step time) times the run's node-hours."""
    cost_node_hours: float
    """Its predicted trial node-hours."""

    @property
    def pays(self) -> bool:
        """Whether the launch is expected to save more than it costs."""
        return self.gain_node_hours > self.cost_node_hours


def best_worth(
    mu: np.ndarray, spread: np.ndarray, cost: np.ndarray, best: float, run_node_hours: float,
    dof: int | None = None,
) -> Worth:  # fmt: skip
    """The open config whose launch is worth most: expected improvement (under ``spread``, in
    log step time, i.e. about the fraction of the step saved) times ``run_node_hours``, less its
    ``cost`` in node-hours. The model sampler passes the :func:`lookahead_spread`: the change
    the launch's measurement is expected to make to the choice, not the spread of its figure."""
    gain = improvement(mu, spread, best, dof) * run_node_hours
    i = int(np.argmax(gain - cost))
    return Worth(i, float(gain[i]), float(cost[i]))
