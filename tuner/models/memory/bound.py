"""Bounds on the predicted peak, for judging a config without the allocator simulation.

The caching-allocator simulation (:mod:`tuner.models.memory.allocator`) is most of the cost of a
memory estimate, while most configs of a space are further from the GPU's limit than the
allocator's slack could move them: far over it, or far under. :func:`peak_bounds` takes the
stages' plans (``estimate.stage_plans``: every term of the exact estimate but the slack, and the
tensors the allocator sees) and finishes them with the allocator's reserved bytes at their
bounds (``allocator.reserved_bounds``) instead of simulated. Why ``low <= peak <= high``:

- each figure of the lower ``Reserved`` is at most the simulation's, of the upper at least;
- the allocator's slack is non-decreasing in each of them (``overheads.allocator_slack``: sums,
  ``min`` and ``max``), and a phase's device figure is its allocated bytes plus the slack plus
  fixed terms, summed in the same order (``PhaseMemory.device_with``; floating-point addition is
  monotone), so every (stage, phase) device figure lies between its two bounds;
- the exact ``peak`` is the device figure of the worst stage's worst phase: at most the largest
  figure, and at least that less ``PHASE_TIE_BYTES`` (``StageMemory.worst`` may pick the other
  phase within it) and a rounding, so the lower bound subtracts twice that.

So ``low > limit`` proves the exact estimate is over ``limit``, and ``high <= limit`` that it
fits, whatever the simulation would say. A stage simulated alone (:func:`stage_peak`) narrows
its own interval to its exact figure, so a verdict the bounds leave open often needs only the
stages near the limit simulated.
"""

from __future__ import annotations

from tuner.catalog import GPUSpec
from tuner.models.memory.allocator import reserved_bounds
from tuner.models.memory.estimate import PHASE_TIE_BYTES, StagePlan
from tuner.models.memory.overheads import allocator_slack, allocator_slacks


def stage_bounds(plans: tuple[StagePlan, ...], gpu: GPUSpec) -> list[tuple[float, float]]:
    """Per stage, bytes (least, most) between which its exact largest device figure lies (the
    largest over its phases of ``MemoryBreakdown(with_slack(plans, gpu))``)."""
    return [stage_bound(plan, gpu)[:2] for plan in plans]


def stage_bound(plan: StagePlan, gpu: GPUSpec) -> tuple[float, float, float]:
    """One stage's (least, most) largest device figure (:func:`stage_bounds`) and the most its
    allocator slack can be of any of its phases' device figure (what
    ``tuner.models.uncertainty.max_memory_sigma`` reads). Why the share bounds: a phase's
    device figure is its slack plus terms the slack does not change (``device_with``), and
    ``x / (k + x)`` grows with ``x``, so the upper slack gives the largest share."""
    stage, tensors = plan
    (low_f, low_s), (high_f, high_s) = allocator_slacks(tensors, gpu, reserved_bounds(tensors))
    fwd, step = stage.phases
    # PhaseMemory.device_with's sum, each phase's allocated bytes read once
    fwd_a, step_a = fwd.allocated, step.allocated
    least = max(fwd_a + low_f + fwd.cuda_context + fwd.comm_buffers,
                step_a + low_s + step.cuda_context + step.comm_buffers)  # fmt: skip
    most_f = fwd_a + high_f + fwd.cuda_context + fwd.comm_buffers
    most_s = step_a + high_s + step.cuda_context + step.comm_buffers
    share = max(high_f / most_f if most_f > 0 else 0.0, high_s / most_s if most_s > 0 else 0.0)
    return least, max(most_f, most_s), share


def stage_peak(plan: StagePlan, gpu: GPUSpec) -> float:
    """One stage's exact largest device figure (its allocator simulated)."""
    stage, tensors = plan  # with_slack's phases' device figures, without building them
    slacks = allocator_slack(tensors, gpu)
    return max(p.device_with(x) for p, x in zip(stage.phases, slacks, strict=True))


def peak_between(stages: list[tuple[float, float]]) -> tuple[float, float]:
    """Bytes (low, high) with ``low <= peak <= high`` for the config's exact ``peak``, from
    each stage's (least, most) largest device figure: the peak is the worst stage's worst
    phase, at most the largest figure and at least that less ``PHASE_TIE_BYTES`` and a
    rounding (``StageMemory.worst``), so ``low`` subtracts twice that."""
    return max(lo for lo, _ in stages) - 2 * PHASE_TIE_BYTES, max(hi for _, hi in stages)


def peak_bounds(plans: tuple[StagePlan, ...], gpu: GPUSpec) -> tuple[float, float]:
    """Bytes (low, high) with ``low <= peak <= high`` for the ``peak`` of
    ``MemoryBreakdown(with_slack(plans, gpu))``, the exact estimate (see the module docstring
    for why), without simulating the allocator."""
    return peak_between(stage_bounds(plans, gpu))
