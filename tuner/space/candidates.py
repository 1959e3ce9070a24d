"""A config of the space with its predictions, the counts over a space, and the memory verdict.

:class:`Candidate` holds its memory breakdown, or the way to compute it when first read: a
config whose verdict bounds on its peak settled (:class:`MemoryJudge`) is kept without running
the allocator simulation, and its breakdown, whenever something reads it, is the one
:func:`~tuner.models.memory.estimate.estimate_memory` gives.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.bound import peak_between, stage_bounds, stage_peak
from tuner.models.memory.estimate import (
    GIB,
    MemoryBreakdown,
    estimate_memory,
    stage_plans,
    with_slack,
)
from tuner.models.time.estimate import TimeBreakdown
from tuner.models.uncertainty import max_memory_sigma
from tuner.space.probes import probe_ceiling_gib
from tuner.spec.study import Framework, ModelSpec, Precision

if TYPE_CHECKING:
    import pandas as pd


class DeferredMemory:
    """The exact memory breakdown of one config, computed on first use and then kept."""

    __slots__ = ("_args", "_value")

    def __init__(
        self, model: ModelSpec, config: ParallelConfig, gpu: GPUSpec, framework: Framework,
        precision: Precision,
    ) -> None:  # fmt: skip
        self._args = (model, config, gpu, framework, precision)
        self._value: MemoryBreakdown | None = None

    def __call__(self) -> MemoryBreakdown:
        if self._value is None:
            self._value = estimate_memory(*self._args)
        return self._value


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
    both the headroom limit and, when probes are wanted, the probes' ceiling
    (``tuner.space.probes.probe_ceiling_gib``) means out of memory and no probe; an upper bound
    within the limit means a fit. The others get the exact estimate, so every verdict is the
    exact path's; ``fast=False`` is that path for every config."""

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

    @classmethod
    def of(
        cls, model: ModelSpec, gpu: GPUSpec, framework: Framework, precision: Precision,
        headroom: float, probes: bool, fast: bool = True,
    ) -> MemoryJudge:  # fmt: skip
        """The judge for a study's GPU, headroom and whether it launches memory probes."""
        limit = headroom * gpu.memory_gib * GIB  # as tuner.models.memory.estimate.fits has it
        ceiling = (
            max(limit, probe_ceiling_gib(gpu.memory_gib, max_memory_sigma()) * GIB)
            if probes
            else limit
        )
        return cls(model, gpu, framework, precision, limit, ceiling, fast)

    def memory(self, config: ParallelConfig) -> tuple[MemoryBreakdown | None, bool]:
        """(``config``'s exact breakdown, whether it fits the headroom limit), with the
        allocator simulation only where bounds on the peak (``tuner.models.memory.bound``)
        leave the verdict open: None instead of the breakdown when they settle it (over the
        ceiling: no fit and no probe; under the limit: a fit)."""
        if not self.fast:
            every = estimate_memory(self.model, config, self.gpu, self.framework, self.precision)
            return every, every.peak <= self.limit
        plans = stage_plans(self.model, config, self.gpu, self.framework, self.precision)
        stages = stage_bounds(plans, self.gpu)
        # the stages that could be over the limit, most loaded first, each simulated alone
        # until the verdict is settled (the simulation is cached, so the full estimate below
        # reuses them)
        doubtful = sorted((i for i, (_, hi) in enumerate(stages) if hi > self.limit),
                          key=lambda i: -stages[i][1])  # fmt: skip
        for i in (None, *doubtful):
            if i is not None:
                figure = stage_peak(plans[i], self.gpu)
                stages[i] = (figure, figure)
            low, high = peak_between(stages)
            if low > self.ceiling:
                return None, False
            if high <= self.limit:
                return None, True
        memory = MemoryBreakdown(with_slack(plans, self.gpu))
        return memory, memory.peak <= self.limit

    def deferred(self, config: ParallelConfig) -> DeferredMemory:
        """The exact breakdown of ``config``, when read."""
        return DeferredMemory(self.model, config, self.gpu, self.framework, self.precision)


def _step(c: Candidate) -> float:
    return c.time.step if c.time else float("inf")


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
        by_step = sorted(self.viable, key=lambda c: (_step(c), c.config.key()))
        for _, run in itertools.groupby(by_step, key=_step):
            tied = list(run)
            if len(tied) > 1:
                tied.sort(key=lambda c: (c.memory.peak, c.config.key()))
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
