"""A config of the space with its predictions, the counts over a space, and the memory verdict.

:class:`Candidate` holds its memory breakdown, or the way to compute it when first read: a
config whose verdict bounds on its peak settled (:class:`MemoryJudge`) is kept without running
the allocator simulation, and its breakdown, whenever something reads it, is the one
:func:`~tuner.models.memory.estimate.estimate_memory` gives. The ranking orders configs whose
steps tie by their bounds where those are apart (:func:`_tied_peaks`), narrowing them a
simulated stage at a time, and computes a breakdown only where they still meet.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import stage_layers
from tuner.models.memory.bound import (
    ENVELOPE_MARGIN,
    peak_between,
    stage_dominators,
    stage_peak,
)
from tuner.models.memory.estimate import (
    GIB,
    PHASE_TIE_BYTES,
    MemoryBreakdown,
    estimate_memory,
    stage_plan,
    stage_plans,
    with_slack,
)
from tuner.models.memory.stage_figures import StageFigures, iter_stage_figures_but, stage_figures
from tuner.models.stack import StackTerms
from tuner.models.time.estimate import TimeBreakdown
from tuner.models.uncertainty import max_memory_sigma
from tuner.space.collection import paused_collection
from tuner.space.deferred import ANY_SIGMA as ANY_SIGMA
from tuner.space.deferred import DeferredMemory as DeferredMemory
from tuner.space.probes import may_probe, probe_ceiling_gib
from tuner.spec.study import Framework, ModelSpec, Precision

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, slots=True)
class Candidate:
    """A valid configuration with its predicted memory and whether it fits."""

    config: ParallelConfig
    breakdown: MemoryBreakdown | DeferredMemory
    """The predicted memory, or how to compute it (configs judged out of memory on a bound)."""
    fits: bool
    time: TimeBreakdown | None = None

    @property
    def memory(self) -> MemoryBreakdown:
        """The predicted memory per stage and phase (``estimate_memory``'s, exactly)."""
        b = self.breakdown
        return b if isinstance(b, MemoryBreakdown) else b()


@dataclass(frozen=True, slots=True)
class MemoryJudge:
    """Whether a config fits, with the allocator simulation only where it can change the verdict.

    Bounds on the peak (``tuner.models.memory.bound``) settle most configs: a lower bound over
    the headroom limit means out of memory (one stage's lower bound over it settles that before
    the other stages' terms are computed; :meth:`DeferredMemory.complete` bounds them if the
    config's step leaves it a would-be probe), an upper bound within the limit a fit. The
    others get the exact estimate, so every verdict is the exact path's; ``fast=False`` is that
    path for every config. Whether an out-of-memory config may be a memory probe is decided on
    its exact peak, later and only for the few the step time leaves in the running
    (:meth:`may_probe`)."""

    model: ModelSpec
    gpu: GPUSpec
    framework: Framework
    precision: Precision
    limit: float
    """Bytes: a peak up to this fits (``tuner.models.memory.estimate.fits``)."""
    ceiling: float
    """Bytes: a peak over this neither fits nor may be probed."""
    fast: bool = True
    """Settle verdicts on the bounds where they can; False: simulate every config."""
    terms: StackTerms | None = None
    """Measured terms (tuner.models.stack); the bounds are the catalog's, so give fast=False."""

    @classmethod
    def of(
        cls, model: ModelSpec, gpu: GPUSpec, framework: Framework, precision: Precision,
        headroom: float, probes: bool, fast: bool = True, terms: StackTerms | None = None,
    ) -> MemoryJudge:  # fmt: skip
        """The judge for a study's GPU, headroom and whether it launches memory probes."""
        limit = headroom * gpu.memory_gib * GIB  # as tuner.models.memory.estimate.fits has it
        ceiling = (
            max(limit, probe_ceiling_gib(gpu.memory_gib, ANY_SIGMA) * GIB) if probes else limit
        )
        return cls(model, gpu, framework, precision, limit, ceiling, fast, terms)

    def memory(self, config: ParallelConfig) -> tuple[MemoryBreakdown | DeferredMemory, bool]:
        """(``config``'s exact breakdown, whether it fits the headroom limit), with the
        allocator simulation only where bounds on the peak (``tuner.models.memory.bound``)
        leave the verdict open: a :class:`DeferredMemory` holding the bounds instead of the
        breakdown when they settle it (over the limit: no fit; under it: a fit). Whether an
        out-of-memory one may be a memory probe is :meth:`may_probe`'s."""
        if not self.fast:
            every = estimate_memory(self.model, config, self.gpu, self.framework, self.precision,
                                    terms=self.terms)  # fmt: skip
            return every, every.peak <= self.limit
        # stages bounded by an earlier one are planned only if that one's bound leaves the
        # fit open (bound.stage_dominators)
        dominated: list[tuple[int | None, ...]] = []

        def dominators() -> tuple[int | None, ...]:  # after the first stage, if asked
            dominated.append(stage_dominators(self.model, config, self.framework))
            return dominated[0]

        # each stage's bounds from its kept terms, without its plan (stage_figures: the
        # plan's stage_bound and stage_envelope to the bit); plans only for what is simulated
        maybe: list[StageFigures | None] = []
        stages: list[tuple[float, float]] = []
        share = 0.0  # the most the slack can be of any phase's device figure
        for figures in iter_stage_figures_but(
            self.model, config, self.gpu, self.framework, self.precision, dominators
        ):  # fmt: skip
            maybe.append(figures)
            if figures is None:
                stages.append((0.0, float("inf")))  # bounded below, if needed
                continue
            least, most, most_share, _ = figures
            stages.append((least, most))
            share = max(share, most_share)
            low = least - 2 * PHASE_TIE_BYTES  # the peak is at least this (peak_between)
            if low > self.limit:
                # out of memory whatever the other stages hold (over the ceiling: no probe
                # either); whether it may be a memory probe waits for its step: only one faster
                # than every fit may be, and that one's other stages are bounded then
                # (DeferredMemory.complete, enumerate.probes_of)
                return self.deferred(config, low), False
        skip = dominated[0] if dominated else (None,)
        unplanned, share, low = self._bound_dominated(config, maybe, stages, skip, share)
        if low > self.limit:
            return self.deferred(config, low), False
        # the stages that could be over the limit, most loaded first, each simulated alone
        # until the verdict is settled (the simulation is cached, so the full estimate below
        # reuses them)
        doubtful = sorted((i for i, (_, hi) in enumerate(stages) if hi > self.limit),
                          key=lambda i: -stages[i][1])  # fmt: skip
        for i in (None, *doubtful):
            if i is not None:
                assert maybe[i] is not None  # an unplanned stage's bound is within the limit
                plan = stage_plan(self.model, config, self.gpu, self.framework, self.precision, i)
                figure = stage_peak(plan, self.gpu)
                stages[i] = (figure, figure)
            low, high = peak_between(stages)
            if low > self.limit or high <= self.limit:
                if low > self.limit and unplanned:  # the sd bound reads every stage's share
                    share = max(share, self._plan(config, maybe, stages, unplanned))
                    low = max(low, peak_between(stages)[0])
                # the share's last bit may round down: a billionth more keeps it a bound; a
                # stage left unplanned has no share known (a fit: its sd is never read)
                loose = [s for s in unplanned if maybe[s] is None]
                sigma = None if loose else max_memory_sigma(slack_share=share * (1 + 1e-9))
                return self.deferred(config, low, high, sigma, stages, loose), high <= self.limit
        plans = stage_plans(self.model, config, self.gpu, self.framework, self.precision)
        memory = MemoryBreakdown(with_slack(plans, self.gpu))
        return memory, memory.peak <= self.limit

    def _bound_dominated(
        self, config: ParallelConfig, maybe: list[StageFigures | None],
        stages: list[tuple[float, float]], dominators: tuple[int | None, ...], share: float,
    ) -> tuple[list[int], float, float]:  # fmt: skip
        """Bound each stage left unplanned by its dominator's envelope
        (``bound.stage_dominators``: at least the stage's own upper bound) where that is within
        the limit (the stage then cannot decide a fit and is kept at (0, the envelope)); plan
        and bound the others. (the stages still unplanned, the largest slack share so far, a
        lower bound on the peak: over the limit settles it out of memory)."""
        unplanned: list[int] = []
        envelopes: dict[int, float] = {}
        for s, d in enumerate(dominators):
            if d is None:
                continue
            if d not in envelopes:
                dominator = maybe[d]
                assert dominator is not None  # a dominator is planned (stage_dominators)
                envelopes[d] = dominator[3] * (1 + ENVELOPE_MARGIN)  # bound.stage_envelope
            if envelopes[d] <= self.limit:
                stages[s] = (0.0, envelopes[d])
                unplanned.append(s)
                continue
            share = max(share, self._plan(config, maybe, stages, [s]))
            if stages[s][0] - 2 * PHASE_TIE_BYTES > self.limit:
                return unplanned, share, stages[s][0] - 2 * PHASE_TIE_BYTES
        return unplanned, share, 0.0

    def _plan(
        self, config: ParallelConfig, maybe: list[StageFigures | None],
        stages: list[tuple[float, float]], which: list[int],
    ) -> float:  # fmt: skip
        """Bound the stages ``which`` in place (``stage_figures``: their plans' bounds); the
        largest slack share among them."""
        share = 0.0
        layers = stage_layers(self.model, config, self.framework)
        for s in which:
            maybe[s] = figures = stage_figures(self.model, config, s, layers[s], self.gpu,
                                               self.framework, self.precision)  # fmt: skip
            least, most, most_share, _ = figures
            stages[s] = (least, most)
            share = max(share, most_share)
        return share

    def may_probe(self, memory: MemoryBreakdown | DeferredMemory) -> bool:
        """Whether an out-of-memory config may be a memory probe: exactly for a breakdown
        (``probes.may_probe``), and for one still deferred unless its lower bound is over the
        probes' ceiling at the most its sd can be (``DeferredMemory.sigma_high``; the caller
        decides on the exact peak, ``enumerate.probes_of``, for the few that the step time leaves
        in the running). Why that is exact: a peak over the ceiling at an sd over its own is
        over its own ceiling too (``probes.probe_ceiling_gib`` grows with the sd)."""
        if isinstance(memory, MemoryBreakdown):
            return may_probe(memory.peak / GIB, self.gpu.memory_gib, memory.sigma)
        if memory.low > self.ceiling:
            return False
        return memory.low <= probe_ceiling_gib(self.gpu.memory_gib, memory.sigma_high) * GIB

    def deferred(
        self, config: ParallelConfig, low: float = 0.0, high: float = float("inf"),
        sigma_high: float | None = None, stages: list[tuple[float, float]] | None = None,
        loose: list[int] | None = None,
    ) -> DeferredMemory:  # fmt: skip
        """The exact breakdown of ``config``, when read (its peak known to lie in [low, high],
        its sd at most ``sigma_high``, None: ``max_memory_sigma()``; ``stages``: every stage's
        bounds, ``bound.stage_bounds``, where known; ``loose``: those of them bounded by
        another stage's envelope)."""
        return DeferredMemory(self.model, config, self.gpu, self.framework, self.precision,
                              low, high, self.terms, sigma_high, stages, loose)  # fmt: skip


def step_of(c: Candidate) -> float:
    """``c``'s predicted step seconds (inf without a time: last in the ranking)."""
    return c.time.step if c.time else float("inf")


def _peak_range(c: Candidate) -> tuple[float, float]:
    """Bytes (low, high) between which ``c``'s exact peak lies: the peak itself once known."""
    b = c.breakdown
    if isinstance(b, MemoryBreakdown):
        return b.peak, b.peak
    return b.low, b.high


def _tied_peaks(tied: list[Candidate]) -> list[float]:
    """A figure per candidate that orders them as their exact peaks do: the exact peak of each
    whose bounds meet another's, the lower bound of the others. Why that is exact: a peak lies
    within its bounds, so a candidate whose bounds are strictly apart from every other's
    compares with each of them the same way through any figure within its own (and equals
    none); only the ones whose bounds meet need the breakdown computed. Narrowed one at a
    time, the lowest meeting another first (a third fewer simulations than all per round)."""
    deferred = [c.breakdown for c in tied if isinstance(c.breakdown, DeferredMemory)]
    while True:  # narrow one stage of the lowest bounds that meet another's, then look again
        ranges = [_peak_range(c) for c in tied]
        meets = _meeting(ranges)
        lowest = sorted((ranges[i][0], i) for i, m in enumerate(meets) if m)
        if not any(isinstance(b := tied[i].breakdown, DeferredMemory) and b.narrow()
                   for _, i in lowest):  # fmt: skip
            break
    out = [_exact_peak(c) if meets[i] else ranges[i][0] for i, c in enumerate(tied)]
    for d in deferred:
        d.forget()
    return out


def _exact_peak(c: Candidate) -> float:
    b = c.breakdown
    return b.peak() if isinstance(b, DeferredMemory) else b.peak


def _meeting(ranges: list[tuple[float, float]]) -> list[bool]:
    """Per closed range, whether it meets another of ``ranges``."""
    order = sorted(range(len(ranges)), key=lambda i: ranges[i])
    meets = [True] * len(ranges)
    reach = -float("inf")  # the largest high bound of the ranges before (in low order)
    for n, i in enumerate(order):
        low, high = ranges[i]
        after = ranges[order[n + 1]][0] if n + 1 < len(order) else float("inf")
        meets[i] = low <= reach or high >= after
        reach = max(reach, high)
    return meets


@dataclass(slots=True)
class SpaceReport:
    """Counts over the whole space, and the viable candidates."""

    total: int = 0
    invalid: int = 0
    invalid_by_rule: Counter[str] = field(default_factory=Counter)
    predicted_oom: int = 0
    viable: list[Candidate] = field(default_factory=list)
    oom: list[Candidate] = field(default_factory=list)
    probes: list[Candidate] = field(default_factory=list)
    """Configs predicted over the headroom that are launched as memory probes
    (``tuner.space.probes``; also counted in ``predicted_oom``), fastest first."""

    def ranked(self) -> list[Candidate]:
        """Viable candidates, fastest predicted step first (ties: less memory first, then by
        key). The peak is read only where the steps tie, so a breakdown that waits until read
        (:class:`DeferredMemory`) is computed for those alone."""
        out: list[Candidate] = []
        by_step = sorted(self.viable, key=step_of)  # a tie's order is (peak, key)'s below
        with paused_collection():  # it makes no cycles (tuner.space.collection)
            for _, run in itertools.groupby(by_step, key=step_of):
                tied = list(run)
                if len(tied) > 1:
                    peaks = _tied_peaks(tied)
                    order = sorted(
                        range(len(tied)), key=lambda i: (peaks[i], tied[i].config.key())
                    )
                    tied = [tied[i] for i in order]
                out += tied
        return out

    def to_frame(self, include_oom: bool = False) -> pd.DataFrame:
        """The viable configs, fastest predicted first, as a pandas DataFrame (the knobs under
        the leaderboard's column names; ``include_oom``: the predicted-OOM ones after them)."""
        from tuner.space.columns import space_frame

        return space_frame(self.ranked() + (self.oom if include_oom else []))

    def restricted(self, keys: Collection[str]) -> SpaceReport:
        """The report over the configs named in ``keys`` (``ParallelConfig.key()``) alone: the
        configs outside were never candidates. Needs the predicted-OOM list (``enumerate_space``
        with ``keep_oom``) to count the kept ones; a kept key that names no valid config of the
        space counts as invalid (rule ``not in the space``)."""
        keep = frozenset(keys)
        viable = [c for c in self.viable if c.config.key() in keep]
        oom = [c for c in self.oom if c.config.key() in keep]
        invalid = len(keep) - len(viable) - len(oom)
        return SpaceReport(
            total=len(keep), invalid=invalid,
            invalid_by_rule=Counter({"not in the space": invalid} if invalid else {}),
            predicted_oom=len(oom), viable=viable, oom=oom,
            probes=[c for c in self.probes if c.config.key() in keep],
        )  # fmt: skip

    def counts(self) -> dict[str, Any]:
        """Counts for ``tune space --json``; an invalid config counts under its first rule."""
        return {
            "total": self.total,
            "invalid": self.invalid,
            "invalid_by_rule": dict(self.invalid_by_rule.most_common()),
            "predicted_oom": self.predicted_oom,
            "memory_probes": len(self.probes),
            "viable": len(self.viable),
        }
