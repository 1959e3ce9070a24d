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

from typing import Any

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import MAX_CACHED_SPLITS, stage_layers
from tuner.models.memory.allocator import reserved_bounds, step_sums, total_per_request
from tuner.models.memory.estimate import PHASE_TIE_BYTES, StagePlan
from tuner.models.memory.overheads import allocator_slack, allocator_slacks
from tuner.models.memory.stage_activations import stage_held
from tuner.models.moe import moe_layers_per_stage
from tuner.spec.study import Framework, ModelSpec

ENVELOPE_MARGIN = 1e-9
"""Relative: a dominated stage's envelope is its dominator's times ``1 +`` this at the most
(the same sums, each term no larger, in another order: float rounding moves a sum by about
``1e-15`` of it, so a billionth keeps it a bound; :func:`stage_dominators`)."""


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
    sums = step_sums(tensors)  # one lookup per group for the bounds and the slacks
    bounds = reserved_bounds(tensors, sums)
    (low_f, low_s), (high_f, high_s) = allocator_slacks(tensors, gpu, bounds, sums)
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


def stage_envelope(plan: StagePlan, gpu: GPUSpec) -> float:
    """Bytes at least the stage's upper bound (:func:`stage_bound`'s ``most``), by a formula
    monotone in its activations (:func:`stage_dominators` reads it for that). With ``T`` a
    bound on ``Reserved.total`` at least the upper ``Reserved``'s (one new segment per request,
    ``allocator.total_per_request``) plus the fragmentation inside blocks
    (``overheads.allocator_slacks``), each phase's upper device figure is its allocated bytes
    plus ``max(X - alloc, 0)`` plus its fixed terms, where ``alloc`` is the phase's tensor
    bytes and ``X`` is the upper ``Reserved.total`` (at most ``T``) or, for the phase the
    cache's peak is not charged to, the smaller ``min(Reserved.step, total)``: so ``X <= T``
    in both branches, and replacing ``X`` by ``T`` in both phases bounds them without the
    branch (which flips as the activations grow, so the branch's figure is not monotone in
    them; this one is)."""
    stage, t = plan
    fwd, step = stage.phases
    if gpu.name == "cpu":  # no allocator: no slack (overheads.allocator_slacks)
        return max(p.allocated + p.cuda_context + p.comm_buffers for p in (fwd, step))
    sums = step_sums(t)
    (res, *_), (lazy, *_), (transient, *_), (temporaries, *_) = sums
    states = res + lazy
    total = total_per_request(t, sums) + gpu.allocator_fragmentation * transient
    figures = []
    for p, alloc in ((fwd, states + transient), (step, states + temporaries)):
        figures.append(p.allocated + max(total - alloc, 0.0) + p.cuda_context + p.comm_buffers)
    return max(figures)


def stage_dominators(
    model: ModelSpec, config: ParallelConfig, framework: Framework
) -> tuple[int | None, ...]:
    """:func:`stage_dominators_uncached`, kept per (model, framework, pp, vp, the split, tp,
    the micro-batch count, the pipeline schedule): what it reads of the config (the chunks'
    layers, ``pipeline.chunk_layers``: pp, vp, the split and tp; the MoE layers on them; the
    held micro-batches, ``stage_activations.stage_held``: pp, vp, the micro-batches and the
    schedule). The configs of a space share a few dozen such keys;
    tests/test_bound.py holds kept = fresh over whole spaces and each other knob without
    effect."""
    if config.pp < 4:  # no two middle stages
        return (None,) * config.pp
    key = (model, framework, config.pp, config.vp, config.pipeline_split, config.tp,
           config.num_microbatches, config.pp_schedule)  # fmt: skip
    out = _DOMINATORS.get(key)
    if out is None:
        if len(_DOMINATORS) >= MAX_CACHED_SPLITS:
            _DOMINATORS.clear()
        out = _DOMINATORS[key] = stage_dominators_uncached(model, config, framework)
    return out


_DOMINATORS: dict[tuple[Any, ...], tuple[int | None, ...]] = {}


def stage_dominators_uncached(
    model: ModelSpec, config: ParallelConfig, framework: Framework
) -> tuple[int | None, ...]:
    """Per stage, an earlier stage whose :func:`stage_envelope` bounds its upper bound, or
    None (then its own bounds are needed); the first and last stages are never bounded so.

    Why stage ``j`` is bounded by stage ``i < j`` when both are middle stages (neither first nor
    last: no embedding, head, logits, tied-embedding communicator or last-stage buffer) with
    the same layers and MoE layers, and ``i`` holds at least as many micro-batches (1F1B:
    ``min(p - s, m)``, non-increasing in ``s``): a stage's terms read its index only through
    whether it is first or last (``terms.stage_params``, ``stage_extras``,
    ``global_buffer_bytes``, ``overheads.stage_nccl_bytes``, the last stage's logits in
    ``step_tensors``), its MoE layers (``moe.moe_layers_on``) and its held micro-batches
    (``stage_activations.stage_held``). So the two plans have the same states, workspaces,
    buffers, context and step tensors, and differ only in the held micro-batches' saved
    activations: bytes ``held * saved`` (``saved >= 0``) and tensors of the same sizes whose
    counts are ``round(held * k)`` (``step_tensors.activation_tensors``), both non-decreasing
    in ``held`` (a float with interleaved chunks of unequal sizes; the rounding keeps the
    order). In the envelope the forward phase is ``max(a, a + T - alloc) + fixed``: ``a``
    grows with the held bytes, and ``T - alloc`` adds, per saved tensor of ``x`` bytes,
    ``2 * segment(x) - (1 - fragmentation) * x >= 0`` (``T`` counts two iterations' segments,
    one per request, each at least the request: the upper ``Reserved``'s segments per call
    grow in steps, so the envelope does not read them); the step phase is
    ``a + max(T - alloc, 0) + fixed`` with its own ``a`` and ``alloc`` the same in both. So
    stage ``j``'s envelope, hence its upper bound, is at most stage ``i``'s (up to rounding:
    :data:`ENVELOPE_MARGIN`). Nothing is claimed of the simulated figures (best fit is not
    monotone in what it is given), so a stage whose dominator's envelope is over a limit is
    planned and bounded on its own. tests/test_bound.py checks the premise and the envelope
    on every dominated stage of whole spaces."""
    p = config.pp
    if p < 4:  # no two middle stages
        return (None,) * p
    layers = stage_layers(model, config, framework)
    moe = moe_layers_per_stage(model, config, framework) if model.moe is not None else (0,) * p
    out: list[int | None] = [None] * p
    seen: dict[tuple[int, int], tuple[int, float]] = {}
    for s in range(1, p - 1):
        held = stage_held(model, config, s, layers[s], framework)
        first = seen.get((layers[s], moe[s]))
        if first is not None and first[1] >= held:
            out[s] = first[0]
        else:
            seen[(layers[s], moe[s])] = (s, held)
    return tuple(out)
