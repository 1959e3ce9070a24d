"""A stage's bounds straight from its kept terms, without building its plan.

The memory judge (``tuner.space.candidates.MemoryJudge``) bounds every stage it looks at
(``bound.stage_bound``) and most stages never need more: their bounds settle the verdict. Each
bound was the stage's plan (``estimate.stage_plan``: two ``PhaseMemory``, a ``StageMemory``, the
``StepTensors``) read by ``stage_bound`` (two ``Reserved`` and the slacks at each): most of a
bounded stage's cost was building those frozen objects, not their arithmetic. :func:`stage_figures`
reads the same kept terms (the stage's states, ``stage_states.stage_state_terms``; its
activations, ``stage_activations.stage_activation_terms``; the fixed terms,
``estimate.stage_fixed``) and the same byte sums of the same tensors (``allocator.step_sums``
of ``step_tensors``, here each group's kept first tensors' sums extended by the rest:
``allocator.extended_sums``, without joining the groups), and repeats the bound's sums in the
same order, as floats: ``stage_bound`` of the plan, and
``bound.stage_envelope``, to the bit. The plan is built only for the stages simulated
(``bound.stage_peak``) or wanted whole. ``stage_bound`` and ``stage_envelope`` of the plan stay
the definition; tests/test_stage_figures.py holds the two equal on every stage of whole spaces,
many of them near the fit limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import stage_layers
from tuner.models.memory.allocator import extended_sums
from tuner.models.memory.bound import stage_bound, stage_envelope
from tuner.models.memory.estimate import stage_fixed, stage_plan
from tuner.models.memory.stage_activations import stage_activation_terms
from tuner.models.memory.stage_states import stage_state_terms
from tuner.models.memory.step_tensors import extra_tensors, workspace_tensors
from tuner.spec.study import Framework, ModelSpec, Precision

StageFigures = tuple[float, float, float, float]
"""(least, most, share, envelope): ``bound.stage_bound``'s three and ``bound.stage_envelope``."""


def stage_figures(
    model: ModelSpec, c: ParallelConfig, stage: int, layers: int, gpu: GPUSpec,
    framework: Framework, precision: Precision,
) -> StageFigures:  # fmt: skip
    """``(*stage_bound(plan, gpu), stage_envelope(plan, gpu))`` for the plan of rank ``stage``
    holding ``layers`` layers (``estimate.stage_plan`` without ZeRO settings, as the judge
    plans), computed without the plan: the same terms, sums and order (module docstring)."""
    if gpu.name == "cpu":  # no allocator, a tensor accounting by views: the plan's own figures
        plan = stage_plan(model, c, gpu, framework, precision, stage)
        return (*stage_bound(plan, gpu), stage_envelope(plan, gpu))
    fp8 = precision == "fp8"
    held = stage_state_terms(model, c, stage, layers, framework, precision, None, False)
    acts = stage_activation_terms(model, c, stage, layers, framework, precision)
    states = held.states
    workspaces, context, buffers = stage_fixed(
        model, c, stage, gpu, framework, fp8, held.expert_params, acts.scratch
    )
    # allocator.step_sums of step_tensors' four groups, each the kept sums of its first
    # tensors extended by the rest (allocator.extended_sums: the same folds, to the bit)
    resident, (lazy, lazy_lo, lazy_hi, lazy_each), step_sums = held.sums
    res, res_lo, res_hi, res_each = extended_sums(resident, workspace_tensors(workspaces))
    extras = extra_tensors(acts.extras, "bf16" if fp8 else precision, stage == c.pp - 1)
    transient, fwd_lo, fwd_hi, fwd_each = extended_sums(
        extended_sums(acts.sums, extras), held.tensors.fwd_bwd
    )
    temporaries, step_lo, step_hi, step_each = step_sums
    fwd, step = states.fwd_bwd, states.step
    # PhaseMemory.allocated of the two phases (estimate._stage_memory's fields), in its order
    fwd_a = (fwd.weights + fwd.grads + fwd.optimizer + acts.activations + acts.extras
             + fwd.buffers + workspaces)  # fmt: skip
    step_a = step.weights + step.grads + step.optimizer + 0.0 + 0.0 + step.buffers + workspaces
    # allocator.reserved_bounds: (total, fwd_bwd, step) at the least and at the most
    lows = (float(res_lo + lazy_lo + max(fwd_lo, step_lo)), float(res_lo + max(fwd_lo, lazy_lo)),
            float(res_lo + lazy_lo + step_lo))  # fmt: skip
    high = float(res_hi + lazy_hi + 2 * (fwd_hi + step_hi))
    highs = (high, high, float(res_hi + lazy_hi + step_hi))
    # overheads.allocator_slacks at each
    held_bytes = res + lazy
    inside = gpu.allocator_fragmentation * transient
    fwd_alloc, step_alloc = held_bytes + transient, held_bytes + temporaries
    slacks = []
    for total_r, fwd_r, step_r in (lows, highs):
        total = total_r + inside
        if fwd_alloc >= step_alloc:
            f, s = total, min(step_r, total)
        else:
            f, s = min(fwd_r + inside, total), total
        slacks.append((max(f - fwd_alloc, 0.0), max(s - step_alloc, 0.0)))
    (low_f, low_s), (high_f, high_s) = slacks
    # bound.stage_bound
    least = max(fwd_a + low_f + context + buffers, step_a + low_s + context + buffers)
    most_f = fwd_a + high_f + context + buffers
    most_s = step_a + high_s + context + buffers
    share = max(high_f / most_f if most_f > 0 else 0.0, high_s / most_s if most_s > 0 else 0.0)
    # bound.stage_envelope (allocator.total_per_request, one segment per request)
    total = float(res_each + lazy_each + 2 * (fwd_each + step_each)) + inside
    envelope = max(fwd_a + max(total - fwd_alloc, 0.0) + context + buffers,
                   step_a + max(total - step_alloc, 0.0) + context + buffers)  # fmt: skip
    return least, max(most_f, most_s), share, envelope


def iter_stage_figures_but(
    model: ModelSpec, c: ParallelConfig, gpu: GPUSpec, framework: Framework,
    precision: Precision, skip: Callable[[], Sequence[int | None]],
) -> Iterator[StageFigures | None]:  # fmt: skip
    """:func:`stage_figures` of each stage, first to last, with None for each stage whose
    ``skip()`` entry is not None (``bound.stage_dominators``: a stage bounded by another,
    bounded on its own only if needed); ``skip`` is called once the first stage is bounded (a
    caller that stops there never asks), and its first entry is not read (the first stage is
    always bounded)."""
    layers = stage_layers(model, c, framework)
    yield stage_figures(model, c, 0, layers[0], gpu, framework, precision)
    skipped = skip() if len(layers) > 1 else ()
    for i in range(1, len(layers)):
        yield None if skipped[i] is not None else stage_figures(
            model, c, i, layers[i], gpu, framework, precision)  # fmt: skip
