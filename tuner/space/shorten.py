"""A config too slow for the user's time limit, measured at fewer micro-batches per step.

Under ``search.trial_timeout_min`` a config whose shortest useful trial (``tuner.space.cost``)
does not fit the limit would only time out. With ``search.fewer_microbatches`` (on by default)
it is measured instead with fewer micro-batches per step: the same tp, pp, cp, ep, vp, dp and
micro-batch, a smaller global batch, so each step is shorter and the trial fits. Its full step
is then predicted from the measured one plus what the time model says changes with the number
of micro-batches ``m`` (:func:`tuner.models.time.proxy.extrapolate`, the same function that
extrapolates a proxy's DP: it takes any pair of configs): every micro-batch's forward and
backward and its pipeline hops scale with ``m``; the pipeline's fill and drain
(``(pp - 1)`` micro-batch slots, a bubble fraction ``(pp - 1) / m`` of the step) and the
per-step parts (the DP gradient reduction and parameter gather, exposed during the last
micro-batch's backward and the first forward, and the optimizer step) do not. The per-rank work
the measurement shows rescales the model's compute before the difference is taken, as for a
proxy.

The measured ``m`` is the most micro-batches whose shortest useful trial, start-up included,
fits the limit with the margin a default limit leaves (``LIMIT_MARGIN``: room for a slower
start-up or step; without it when no count keeps it), so the least is extrapolated; never fewer
than ``pp``: with at least ``pp``
micro-batches the 1F1B schedule keeps its steady phase and the first stage holds the full
step's ``pp`` micro-batches of activations, so only the length of the steady phase changes.
A config that does not fit even at the fewest is refused with the minutes and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.config.rules import validate
from tuner.models.rates import Rates
from tuner.models.stack import StackTerms
from tuner.models.time.estimate import estimate_time
from tuner.space.cost import LIMIT_MARGIN, TrialCost, trial_cost
from tuner.spec.study import StudySpec

SHORTENED = ("measured_microbatches", "full_microbatches", "measured_predicted_step_s")
"""The trial attributes of a config measured at fewer micro-batches (:func:`shortened_attrs`)."""


@dataclass(frozen=True, slots=True)
class Shortened:
    """What runs in place of a config too slow for the limit."""

    config: ParallelConfig
    """The config at ``microbatches`` micro-batches per step (its global batch)."""
    microbatches: int
    """Micro-batches per step measured."""
    full_microbatches: int
    """Micro-batches per step of the config itself."""
    step_s: float
    """The time model's step at ``microbatches``."""
    cost: TrialCost
    """Its trial: minutes, the user's limit, node-hours."""


def at_microbatches(config: ParallelConfig, m: int) -> ParallelConfig:
    """``config`` with ``m`` micro-batches per step (the same DP and micro-batch)."""
    gbs = m * config.micro_batch_size * config.dp
    return dataclasses.replace(config, global_batch_size=gbs)


def batch_spec(spec: StudySpec, config: ParallelConfig) -> StudySpec:
    """``spec`` with ``config``'s global batch: what the launch template renders and the log
    parser reads for a config measured at fewer micro-batches (or a proxy's)."""
    training = dataclasses.replace(spec.training, global_batch_size=config.global_batch_size)
    return dataclasses.replace(spec, training=training)


def needs_shortening(spec: StudySpec, step_s: float | None) -> bool:
    """Whether a config of predicted step ``step_s`` cannot be measured within the user's limit
    as it is (always False without a limit: each config then gets its own)."""
    return spec.search.trial_timeout_min is not None and not trial_cost(spec, step_s).fits


def shorten(spec: StudySpec, config: ParallelConfig, gpu: GPUSpec, rates: Rates | None = None,
            terms: StackTerms | None = None) -> Shortened | None:  # fmt: skip
    """``config`` at the most micro-batches per step (at least ``pp``, fewer than its own) whose
    shortest useful trial, with the margin a default limit gives (``LIMIT_MARGIN``), fits
    ``search.trial_timeout_min``; without the margin when no count keeps it. Its step from the
    time model at ``rates`` and ``terms``. None when none fits or ``search.fewer_microbatches``
    is off."""
    if not spec.search.fewer_microbatches or spec.search.trial_timeout_min is None:
        return None
    full_m, floor = config.num_microbatches, max(config.pp, 1)
    limit = spec.search.trial_timeout_min
    steps: dict[int, float] = {}

    def step(m: int) -> float:
        if m not in steps:
            steps[m] = estimate_time(spec.model, spec.training, at_microbatches(config, m), gpu,
                                     spec.cluster.gpus_per_node, spec.framework, rates,
                                     terms=terms).step  # fmt: skip
        return steps[m]

    for margin in (LIMIT_MARGIN, 1.0):  # room for a slower start-up or step, if there is any
        if full_m <= floor or margin * trial_cost(spec, step(floor)).minutes > limit:
            continue
        lo, hi = floor, full_m - 1  # lo fits; the step grows with m: the largest m that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            fits = margin * trial_cost(spec, step(mid)).minutes <= limit
            lo, hi = (mid, hi) if fits else (lo, mid - 1)
        for m in range(lo, floor - 1, -1):  # the framework's rules at the smaller batch
            shorter = at_microbatches(config, m)  # (interleaved: m a multiple of pp)
            ran = batch_spec(spec, shorter)
            if not validate(shorter, ran.model, ran.world_size, ran.framework, ran.training,
                            ran.cluster.gpus_per_node):  # fmt: skip
                return Shortened(shorter, m, full_m, step(m), trial_cost(spec, step(m)))
    return None


def too_slow(spec: StudySpec, configs: Sequence[ParallelConfig], steps: Sequence[float | None],
             gpu: GPUSpec | None = None, rates: Rates | None = None,
             terms: StackTerms | None = None) -> dict[str, Shortened | None]:  # fmt: skip
    """The configs of ``configs`` (their predicted full steps ``steps``) too slow for the user's
    limit as they are (:func:`needs_shortening`), by key, each with what runs instead
    (:func:`shorten`, at ``rates`` and ``terms``; None: not even its fewest micro-batches fit,
    it is refused); a config missing from the map runs as it is. The one definition of which
    configs are measured at fewer micro-batches that the dry run
    (:func:`tuner.cli.cost.launch_plans`), the sampler's prices
    (:func:`tuner.space.proxy_cost.launch_scales`) and the study's screen
    (:class:`tuner.study.screen.Screen`) read, so the three agree by construction. ``gpu``: the
    study's (looked up only when some config is too slow)."""
    found: dict[str, Shortened | None] = {}
    for config, step in zip(configs, steps, strict=True):
        if needs_shortening(spec, step):
            if gpu is None:
                from tuner.space.enumerate import study_gpu  # the catalog: only when needed

                gpu = study_gpu(spec)
            found[config.key()] = shorten(spec, config, gpu, rates, terms)
    return found


def shortened_attrs(shorter: Shortened) -> dict[str, int | float]:
    """The trial attributes that say a config is measured at fewer micro-batches per step:
    the loop launches it so (``tuner.study.proxy``) and its figure is extrapolated."""
    values = (shorter.microbatches, shorter.full_microbatches, shorter.step_s)
    return dict(zip(SHORTENED, values, strict=True))
