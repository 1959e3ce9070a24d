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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.bound import (
    ENVELOPE_MARGIN,
    peak_between,
    stage_bound,
    stage_bounds,
    stage_dominators,
    stage_envelope,
    stage_peak,
)
from tuner.models.memory.breakdown import phase_sigma
from tuner.models.memory.estimate import (
    GIB,
    PHASE_TIE_BYTES,
    MemoryBreakdown,
    PhaseMemory,
    StagePlan,
    estimate_memory,
    iter_stage_plans_but,
    stage_plan,
    stage_plans,
    with_slack,
)
from tuner.models.stack import StackTerms
from tuner.models.time.estimate import TimeBreakdown
from tuner.models.uncertainty import max_memory_sigma
from tuner.space.collection import paused_collection
from tuner.space.probes import may_probe, probe_ceiling_gib
from tuner.spec.study import Framework, ModelSpec, Precision

if TYPE_CHECKING:
    import pandas as pd


ANY_SIGMA = max_memory_sigma()
"""The most any catalog breakdown's sd can be (``uncertainty.max_memory_sigma``)."""


class DeferredMemory:
    """The exact memory breakdown of one config, computed on first use and then kept, with
    bounds on its peak known before (``low <= peak <= high``, ``tuner.models.memory.bound``)."""

    __slots__ = (
        "_args", "_loose", "_plans", "_stages", "_terms", "_value", "_worst", "high", "low",
        "sigma_high",
    )  # fmt: skip

    def __init__(
        self, model: ModelSpec, config: ParallelConfig, gpu: GPUSpec, framework: Framework,
        precision: Precision, low: float = 0.0, high: float = float("inf"),
        terms: StackTerms | None = None, sigma_high: float | None = None,
        stages: list[tuple[float, float]] | None = None, loose: list[int] | None = None,
    ) -> None:  # fmt: skip
        self._args = (model, config, gpu, framework, precision)
        self.sigma_high = ANY_SIGMA if sigma_high is None else sigma_high
        """At least the breakdown's ``sigma`` (``uncertainty.max_memory_sigma``)."""
        self._terms = terms
        self._value: MemoryBreakdown | None = None
        self.low, self.high = low, high
        self._plans: dict[int, StagePlan] = {}
        self._worst: PhaseMemory | None = None  # the worst phase, once peak_sigma finds it
        self._stages: list[tuple[float, float]] = stages or []
        """Per stage, (least, most) largest device figure (``bound.stage_bounds``; a stage
        simulated: its exact figure twice), given by the judge or made on first narrowing."""
        self._loose: set[int] = set(loose or ())
        """Stages whose upper bound is another stage's envelope, not their own
        (``MemoryJudge._bound_dominated``): narrowing bounds them before it simulates them."""

    def __call__(self) -> MemoryBreakdown:
        if self._value is None:
            self._value = estimate_memory(*self._args, terms=self._terms)
            self.low = self.high = self._value.peak
            self._plans, self._stages, self._loose = {}, [], set()
        return self._value

    @property
    def known(self) -> bool:
        """Whether the breakdown has been computed."""
        return self._value is not None

    def _plan(self, i: int) -> StagePlan:
        """Stage ``i``'s plan (kept until :meth:`forget`)."""
        plan = self._plans.get(i)
        if plan is None:
            plan = self._plans[i] = stage_plan(*self._args, i)
        return plan

    def narrow(self) -> bool:
        """Tighten the bounds on the peak by simulating the allocator of one more stage, the
        one with the largest upper bound (``tuner.models.memory.bound``), or by bounding it
        where its upper bound was another stage's envelope; False when that stage is exact
        already (the bounds are as tight as stages make them: within ``2 *
        PHASE_TIE_BYTES``). Plans only the stages it simulates or bounds where the judge gave
        the stages' bounds; keeps the plans until :meth:`forget`."""
        if self._value is not None or self.low == self.high:  # the peak is known
            return False
        if self._terms is not None and not self._terms.is_catalog:  # plans hold no measured terms
            self()
            return False
        model, config, gpu, framework, precision = self._args
        if not self._stages:
            plans = stage_plans(model, config, gpu, framework, precision)
            self._plans = dict(enumerate(plans))
            self._stages = stage_bounds(plans, gpu)
        stages = self._stages
        i = max(range(len(stages)), key=lambda j: stages[j][1])
        if stages[i][0] == stages[i][1]:
            return False
        if i in self._loose:  # its own bounds first: a plan and a sum, no simulation
            self._loose.discard(i)
            least, most, _ = stage_bound(self._plan(i), gpu)
            stages[i] = (least, min(most, stages[i][1]))
        else:
            figure = stage_peak(self._plan(i), gpu)
            stages[i] = (figure, figure)
        low, high = peak_between(stages)
        self.low, self.high = max(self.low, low), min(self.high, high)
        return True

    def peak(self) -> float:
        """The exact peak (``estimate_memory``'s), from the stage that sets it alone when
        narrowing has left that stage exact and every other stage's upper bound below its
        figure (:meth:`_worst_alone`); from the whole breakdown otherwise."""
        if self.low == self.high:  # bounds that meet hold only the peak
            return self.low
        worst = self._worst_alone()
        if worst is not None:
            self.low = self.high = worst.device  # kept for the next ranking
            return self.low
        return self().peak

    def peak_sigma(self) -> tuple[float, float]:
        """(the exact peak, its relative sd: the breakdown's ``peak`` and ``sigma``), both
        from the worst stage's worst phase, found by narrowing a stage at a time until one is
        exact and over every other stage's upper bound (:meth:`_worst_alone`); from the whole
        breakdown where narrowing stops short of that, or with measured terms (the sd reads
        their provenance; the plans hold none)."""
        if self._worst is not None:
            return self._worst.device, phase_sigma(self._worst)
        if self._terms is None or self._terms.is_catalog:
            while True:
                worst = self._worst_alone()
                if worst is not None:  # kept, and the peak too (as peak() does)
                    self._worst, self.low, self.high = worst, worst.device, worst.device
                    self.forget()
                    return worst.device, phase_sigma(worst)
                if not self.narrow():
                    break
        value = self()
        return value.peak, value.sigma

    def _worst_alone(self) -> PhaseMemory | None:
        """The breakdown's ``worst`` (stage, phase) from one stage, when narrowing has left the
        stage with the largest upper bound exact and every other stage's upper bound below its
        figure: that stage is then the worst (``MemoryBreakdown.worst_stage``, the largest
        device figure, no tie), and ``with_slack`` finishes each stage on its own; else None."""
        stages = self._stages
        if self._value is not None or not stages:
            return None
        i = max(range(len(stages)), key=lambda j: stages[j][1])
        if stages[i][0] != stages[i][1]:
            return None
        (top,) = with_slack((self._plan(i),), self._args[2])
        if all(hi < top.device for j, (_, hi) in enumerate(stages) if j != i):
            return top.worst
        return None

    def complete(self) -> None:
        """Bound every stage where the judge stopped at the first one over the limit: the
        peak's bounds and the sd bound from all of them, as :meth:`MemoryJudge.memory` makes
        them (``bound.stage_bound``)."""
        if self._value is not None or self._stages:
            return
        if self._terms is not None and not self._terms.is_catalog:  # plans hold no measured terms
            self()
            return
        model, config, gpu, framework, precision = self._args
        plans = stage_plans(model, config, gpu, framework, precision)
        bounds = [stage_bound(plan, gpu) for plan in plans]
        self._stages = [(least, most) for least, most, _ in bounds]
        low, high = peak_between(self._stages)
        self.low, self.high = max(self.low, low), min(self.high, high)
        # the share's last bit may round down: a billionth more keeps it a bound (as the judge)
        share = max(most_share for _, _, most_share in bounds)
        self.sigma_high = min(self.sigma_high, max_memory_sigma(slack_share=share * (1 + 1e-9)))

    def forget(self) -> None:
        """Drop the plans :meth:`narrow` keeps (the bounds, the stages' included, stay)."""
        self._plans = {}


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

        maybe: list[StagePlan | None] = []
        stages: list[tuple[float, float]] = []
        share = 0.0  # the most the slack can be of any phase's device figure
        for plan in iter_stage_plans_but(
            self.model, config, self.gpu, self.framework, self.precision, dominators
        ):  # fmt: skip
            maybe.append(plan)
            if plan is None:
                stages.append((0.0, float("inf")))  # bounded below, if needed
                continue
            least, most, most_share = stage_bound(plan, self.gpu)
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
                plan = maybe[i]
                assert plan is not None  # an unplanned stage's bound is within the limit
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
        self._plan(config, maybe, stages, unplanned)
        plans = tuple(plan for plan in maybe if plan is not None)
        memory = MemoryBreakdown(with_slack(plans, self.gpu))
        return memory, memory.peak <= self.limit

    def _bound_dominated(
        self, config: ParallelConfig, maybe: list[StagePlan | None],
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
                envelopes[d] = stage_envelope(dominator, self.gpu) * (1 + ENVELOPE_MARGIN)
            if envelopes[d] <= self.limit:
                stages[s] = (0.0, envelopes[d])
                unplanned.append(s)
                continue
            share = max(share, self._plan(config, maybe, stages, [s]))
            if stages[s][0] - 2 * PHASE_TIE_BYTES > self.limit:
                return unplanned, share, stages[s][0] - 2 * PHASE_TIE_BYTES
        return unplanned, share, 0.0

    def _plan(
        self, config: ParallelConfig, maybe: list[StagePlan | None],
        stages: list[tuple[float, float]], which: list[int],
    ) -> float:  # fmt: skip
        """Plan and bound the stages ``which`` in place; the largest slack share among them."""
        share = 0.0
        for s in which:
            maybe[s] = plan = stage_plan(self.model, config, self.gpu, self.framework,
                                         self.precision, s)  # fmt: skip
            least, most, most_share = stage_bound(plan, self.gpu)
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
