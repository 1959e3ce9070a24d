"""What a trial costs before it runs: its predicted minutes, its time limit and its node-hours.

A trial is start-up (``search.startup_min``: processes, rendezvous, model build, data loaders),
then the warm-up (``launch.warmup_iters``), then the iterations the steady-state estimator
(:mod:`tuner.logs.steady`) needs before the step time can be known: ``search.min_batches``
batches of at least :data:`RECORDS_PER_BATCH` records each (Megatron logs one record per
iteration in the shipped templates). That is the *shortest useful trial*; the study loop ends a
trial as soon as its step time is known to ``search.precision``, and ``launch.train_iters`` caps
it. The trial time limit is ``search.trial_timeout_min`` when the user set one, else
:data:`LIMIT_MARGIN` times the predicted shortest useful trial (never less than
:data:`MIN_LIMIT_MIN`): noisy step times that need more iterations are cut there, and the
figure is recorded when the log already holds enough steady batches.

``search.startup_min`` is the user's estimate until trials of the same setup have run on the
cluster; from then on the start-up they measured replaces it (:func:`with_startup`, fed by
:func:`tuner.calibrate.store.measured_startup_s`): the sampler's trial costs and the cost preview
read what a launch really took.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.spec.study import StudySpec

RECORDS_PER_BATCH = 2
"""The fewest records per batch: the estimator's batch is ``ceil(2 * tau)`` records and the
autocorrelation time ``tau`` is at least 1."""

LIMIT_MARGIN = 1.5
"""Default time limit over the predicted shortest useful trial: room for a slower start-up, a
slower first step and a noisier step time than predicted."""

MIN_LIMIT_MIN = 2.0
"""The shortest default time limit, minutes (a trial of a tiny model still needs its start-up)."""


def node_hours(value: float) -> str:
    """Node-hours as every table and line prints them (the CLI's units and the stop reason):
    two decimals from 1 up (``31.93``), two significant digits below (``0.12``, ``0.50``, a CPU
    demo's ``0.0021``), so a small figure never shows as ``0.00`` and a column never mixes
    ``0.5`` with ``0.53``."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:#.2g}"


def with_startup(spec: StudySpec, startup_s: float | None) -> StudySpec:
    """``spec`` with ``search.startup_min`` replaced by a measured start-up of ``startup_s``
    seconds (unchanged when None): what every cost of this module then charges per launch."""
    if startup_s is None or startup_s <= 0:
        return spec
    search = dataclasses.replace(spec.search, startup_min=startup_s / 60)
    return dataclasses.replace(spec, search=search)


def useful_iterations(spec: StudySpec) -> int:
    """Iterations of the shortest useful trial (warm-up + the estimator's minimum), capped by
    ``train_iters``."""
    needed = spec.launch.warmup_iters + spec.search.min_batches * RECORDS_PER_BATCH
    return min(needed, spec.launch.train_iters)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialCost:
    """The predicted duration and cost of one config's trial."""

    minutes: float
    """The shortest useful trial: start-up + warm-up + the estimator's minimum iterations."""
    cap_minutes: float
    """The trial if it runs all ``train_iters`` (its precision never reached)."""
    limit_minutes: float
    """The trial time limit (the user's, or the default from ``minutes``)."""
    nodes: int
    """Nodes the trial holds."""
    fits: bool
    """The predicted iterations of the shortest useful trial (warm-up and the estimator's
    minimum) fit the time limit. Start-up is left out of this check: it is the user's estimate
    (``search.startup_min``), not the model's, and a limit shorter than it is the user's call."""

    @property
    def node_hours(self) -> float:
        """Expected node-hours: the shortest useful trial on its nodes, or the time limit where
        the predicted start-up leaves the trial less (it is ended there: never more than
        :attr:`worst_node_hours`)."""
        return min(self.minutes, self.limit_minutes, self.cap_minutes) * self.nodes / 60

    @property
    def worst_node_hours(self) -> float:
        """Node-hours if the trial runs to its time limit or its cap, whichever comes first."""
        return min(self.limit_minutes, self.cap_minutes) * self.nodes / 60


def trial_cost(spec: StudySpec, step_s: float | None) -> TrialCost:
    """The cost of a trial whose predicted step time is ``step_s`` (None: unknown, start-up
    only)."""
    step = step_s or 0.0
    startup = spec.search.startup_min
    iterations = useful_iterations(spec) * step / 60
    minutes = startup + iterations
    cap = startup + spec.launch.train_iters * step / 60
    limit = spec.search.trial_timeout_min
    if limit is None:
        limit = max(MIN_LIMIT_MIN, LIMIT_MARGIN * minutes)
    return TrialCost(minutes=minutes, cap_minutes=cap, limit_minutes=limit,
                     nodes=spec.nodes_per_trial, fits=iterations <= limit)  # fmt: skip


def trial_limit_s(spec: StudySpec, step_s: float | None) -> float:
    """The time limit of a trial whose predicted step time is ``step_s``, seconds."""
    return trial_cost(spec, step_s).limit_minutes * 60


def too_slow_fix(spec: StudySpec, need_min: float) -> str:
    """What lets configs whose shortest useful trial takes up to ``need_min`` minutes run."""
    raise_it = (f"raise search.trial_timeout_min to {math.ceil(need_min)} or more (or leave it "
                "unset for a limit per config)")  # fmt: skip
    if spec.search.fewer_microbatches:  # already tried: even pp micro-batches do not fit
        return raise_it + " (a proxy, search.proxy, saves node-hours, not minutes)"
    return (
        raise_it + ", or set search.fewer_microbatches to measure fewer micro-batches per "
        "step and extrapolate the full step (a proxy saves node-hours, not minutes)"
    )


def too_slow_reason(spec: StudySpec, cost: TrialCost, pp: int | None = None) -> str:
    """Why a config whose shortest useful trial does not fit the limit is not launched, and the
    fix; ``pp``: the config's pipeline size, when fewer micro-batches per step were tried too
    (``search.fewer_microbatches``: even ``pp`` of them do not fit)."""
    fewest = ""
    if pp is not None and spec.search.fewer_microbatches:
        fewest = (f"; at its fewest micro-batches per step ({max(pp, 1)}, one per pipeline "
                  "stage) its trial does not fit either")  # fmt: skip
    return (
        f"its shortest useful trial takes {cost.minutes:.1f} min (start-up "
        f"{spec.search.startup_min:g} min + {useful_iterations(spec)} iterations in "
        f"{cost.minutes - spec.search.startup_min:.1f} min), and the iterations alone exceed "
        f"search.trial_timeout_min {spec.search.trial_timeout_min:g}{fewest}: "
        f"{too_slow_fix(spec, cost.minutes)}"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetCost:
    """The node-hours a study's budget may spend."""

    launches: int
    """Launches counted: ``n_trials``, or fewer when the space has fewer configs that fit (the
    viable ones and the memory probes): what ``tune run`` launches at most, each config once
    (one interrupted or on a failed node runs again: ``tuner.space.trials.RETRYABLE``)."""
    expected_node_hours: float
    """The configs launched first (predicted fastest), each stopped at its shortest useful
    trial."""
    worst_node_hours: float
    """Every launch running to its limit (or cap), the costliest configs counted."""


def budget_cost(costs_fastest_first: Sequence[TrialCost], n_trials: int) -> BudgetCost:
    """The budget's node-hours over the costs of the configs that may launch, in the order the
    search starts from (the viable ones by predicted step, then the memory probes); configs
    that do not fit are never launched."""
    fitting = [c for c in costs_fastest_first if c.fits]
    n = min(n_trials, len(fitting))
    worst = sorted((c.worst_node_hours for c in fitting), reverse=True)[:n]
    return BudgetCost(
        launches=n, expected_node_hours=sum(c.node_hours for c in fitting[:n]),
        worst_node_hours=sum(worst),
    )  # fmt: skip


def require_measurable(spec: StudySpec, costs: Sequence[TrialCost], pp: int | None = None,
                       ) -> None:  # fmt: skip
    """:class:`ConfigError` when not one viable config's shortest useful trial fits the time
    limit the user set: the study would launch nothing but time-outs. ``pp``: the quickest
    config's, when fewer micro-batches per step were tried too (:func:`too_slow_reason`)."""
    if not costs or any(c.fits for c in costs):
        return
    quickest = min(costs, key=lambda c: c.minutes)
    raise ConfigError(
        f"no config can be measured within {spec.search.trial_timeout_min:g} min: "
        + too_slow_reason(spec, quickest, pp),
        path="search.trial_timeout_min",
    )
