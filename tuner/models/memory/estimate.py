"""Analytical per-GPU memory model: every pipeline stage, each phase of a step, three figures.

Per stage and phase (``fwd_bwd``: activations live; ``step``: the optimizer's temporaries live):
``allocated`` (live tensors, what ``torch.cuda.max_memory_allocated`` measures), ``reserved``
(allocated + the caching allocator's slack, ``torch.cuda.max_memory_reserved``) and ``device``
(reserved + CUDA context + NCCL buffers: what nvidia-smi shows and what decides OOM). The
config's ``peak`` is the largest ``device`` figure over all stages and phases.

Terms: parameter counts and activations in tuner.models.memory.terms ([K] Korthikanti et al. 2022,
[Z] ZeRO, [M] Megatron-LM); optimizer layouts per framework in tuner.models.optimizer_layout ([DSE]
DeepSpeed sources); stack overheads and allocator slack in tuner.models.memory.overheads (GPU
catalog).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import stage_layers
from tuner.models.memory.allocator import StepTensors
from tuner.models.memory.overheads import (
    allocator_slack,
    context_bytes,
    grouped_gemm_workspace_bytes,
    stage_nccl_bytes,
    workspace_bytes,
)
from tuner.models.memory.stage_activations import stage_activation_terms
from tuner.models.memory.stage_states import stage_state_terms
from tuner.models.memory.step_tensors import step_tensors
from tuner.models.memory.terms import (
    DEEPSPEED_ESTIMATOR,
    ZERO_PAPER,
    LayerActivations,
    ModelStateBytes,
    ParamCounts,
    layer_activations,
    model_state_bytes,
    padded_vocab,
    param_counts,
    zero_model_state_total,
)
from tuner.models.stack import StackTerms, composed_memory
from tuner.models.time.tp_overlap import ub_buffer_bytes
from tuner.spec.frameworks import traits
from tuner.spec.study import Framework, ModelSpec, Precision

__all__ = [
    "DEEPSPEED_ESTIMATOR", "GIB", "MEMORY_UNCERTAINTY", "ZERO_PAPER", "LayerActivations",
    "MemoryBreakdown", "ModelStateBytes", "ParamCounts", "PhaseMemory", "StageMemory",
    "estimate_memory", "fits", "layer_activations", "model_state_bytes",
    "padded_vocab", "param_counts", "zero_model_state_total",
]  # fmt: skip

from tuner.models.memory.breakdown import GIB as GIB
from tuner.models.memory.breakdown import MEMORY_UNCERTAINTY as MEMORY_UNCERTAINTY
from tuner.models.memory.breakdown import PARTS as PARTS
from tuner.models.memory.breakdown import PHASE_TIE_BYTES as PHASE_TIE_BYTES
from tuner.models.memory.breakdown import MemoryBreakdown as MemoryBreakdown
from tuner.models.memory.breakdown import Phase as Phase
from tuner.models.memory.breakdown import PhaseMemory as PhaseMemory
from tuner.models.memory.breakdown import StageMemory as StageMemory


def _stage_memory(
    model: ModelSpec,
    c: ParallelConfig,
    stage: int,
    layers: int,
    gpu: GPUSpec,
    framework: Framework,
    precision: Precision,
    zero_settings: Mapping[str, float] | None,
) -> StagePlan:
    fp8, original = precision == "fp8", precision
    precision = (
        "bf16" if fp8 else precision
    )  # fp8: bf16 weights, grads, activations (tuner.spec.fp8)
    # the parameters and their states, shared by the configs that differ in activation knobs,
    # and the activations, shared by those that differ in state-only knobs
    views = gpu.name == "cpu"  # CPU ranks report a tensor accounting by views, no allocator
    held_states = stage_state_terms(
        model, c, stage, layers, framework, original, zero_settings, views
    )
    params, states, experts = held_states.params, held_states.states, held_states.expert_params
    acts = stage_activation_terms(model, c, stage, layers, framework, original)
    workspaces, context, buffers = stage_fixed(model, c, stage, gpu, framework, fp8, experts,
                                               acts.scratch)  # fmt: skip
    tensors = step_tensors(
        model, c, layers, params, states, acts.tensors, acts.extras, workspaces,
        precision, stage == c.pp - 1, held_states.tensors,
    )  # fmt: skip
    # The step runs after the last backward: activations and logits are freed by then.
    # (PhaseMemory's fields in order: phase, the states' four, the activations' two in between,
    # workspaces, slack, cuda_context, comm_buffers)
    fwd, step = states.fwd_bwd, states.step
    phases = (
        PhaseMemory("fwd_bwd", fwd.weights, fwd.grads, fwd.optimizer, acts.activations,
                    acts.extras, fwd.buffers, workspaces, 0.0, context, buffers),
        PhaseMemory("step", step.weights, step.grads, step.optimizer, 0.0, 0.0, step.buffers,
                    workspaces, 0.0, context, buffers),
    )  # fmt: skip
    memory = StageMemory(
        stage, layers, acts.held, params + experts, states.layout, phases, states.moments
    )
    return memory, tensors


def stage_fixed(
    model: ModelSpec, c: ParallelConfig, stage: int, gpu: GPUSpec, framework: Framework,
    fp8: bool, experts: float, scratch: float,
) -> tuple[float, float, float]:  # fmt: skip
    """(workspaces, CUDA context, communication buffers) of rank ``stage``, the terms of its
    phases besides the states and activations (``experts``: its routed-expert parameters;
    ``scratch``: Megatron-core's global memory buffer, ``stage_activations``)."""
    ub = 0.0
    if c.tp_comm_overlap and traits(framework).megatron_core:
        # TE userbuffers, allocated outside PyTorch's allocator
        tokens = model.seq_length * c.micro_batch_size / c.cp  # (tuner.models.time.tp_overlap)
        ub = ub_buffer_bytes(tokens, model.hidden_size, fp8)
    comms = stage_nccl_bytes(c, stage, framework, model.tied_embeddings, experts > 0, gpu)
    grouped = model.moe is not None and model.moe.grouped_gemm and experts > 0
    workspaces = (
        workspace_bytes(gpu, framework)
        + (grouped_gemm_workspace_bytes(gpu) if grouped else 0)
        + scratch
    )
    return workspaces, context_bytes(gpu), comms + ub


def estimate_memory(
    model: ModelSpec,
    config: ParallelConfig,
    gpu: GPUSpec,
    framework: Framework = "megatron",
    precision: Precision = "bf16",
    zero_settings: Mapping[str, float] | None = None,
    terms: StackTerms | None = None,
) -> MemoryBreakdown:
    """Per-stage, per-phase memory of ``config``; ``.peak`` is the worst device figure.

    Layer counts per stage come from tuner.config.pipeline.stage_layers (uneven splits included),
    the in-flight micro-batches per stage from tuner.config.pipeline.in_flight. ``zero_settings``:
    the ds_config's ``zero_optimization`` values (bucket sizes) when they differ from DeepSpeed's
    defaults (tuner.models.optimizer_layout.DEEPSPEED_ZERO_DEFAULTS). ``terms``: what a
    framework probe measured on the stack (tuner.models.stack.composed_memory).
    """
    zero = tuple(sorted(zero_settings.items())) if zero_settings else ()
    memory = _estimate(model, config, gpu, framework, precision, zero)
    return memory if terms is None else composed_memory(memory, config, terms)


@functools.lru_cache(maxsize=1 << 16)
def _estimate(
    model: ModelSpec, config: ParallelConfig, gpu: GPUSpec, framework: Framework,
    precision: Precision, zero: tuple[tuple[str, float], ...],
) -> MemoryBreakdown:  # fmt: skip
    """:func:`estimate_memory` for hashable arguments, cached: the space, the sampler, the
    screen and the report each ask for the same configs (pure, and the result is frozen)."""
    plans = stage_plans(model, config, gpu, framework, precision, dict(zero))
    return MemoryBreakdown(with_slack(plans, gpu))


StagePlan = tuple[StageMemory, StepTensors]  # a stage with no slack yet, and its tensors


def stage_plans(
    model: ModelSpec, config: ParallelConfig, gpu: GPUSpec, framework: Framework,
    precision: Precision, zero_settings: Mapping[str, float] | None = None,
) -> tuple[StagePlan, ...]:  # fmt: skip
    """Every stage of ``config`` but the allocator's slack (uncached; :func:`with_slack`)."""
    return tuple(iter_stage_plans(model, config, gpu, framework, precision, zero_settings))


def iter_stage_plans(
    model: ModelSpec, config: ParallelConfig, gpu: GPUSpec, framework: Framework,
    precision: Precision, zero_settings: Mapping[str, float] | None = None,
) -> Iterator[StagePlan]:  # fmt: skip
    """:func:`stage_plans` one stage at a time, first to last (a caller that has seen enough
    stops early)."""
    layers, z = enumerate(stage_layers(model, config, framework)), zero_settings or None
    return (_stage_memory(model, config, i, n, gpu, framework, precision, z) for i, n in layers)


def stage_plan(
    model: ModelSpec, config: ParallelConfig, gpu: GPUSpec, framework: Framework,
    precision: Precision, stage: int, zero_settings: Mapping[str, float] | None = None,
) -> StagePlan:  # fmt: skip
    """Stage ``stage`` of :func:`stage_plans` alone (the same plan: each stage's terms read
    only its own index and layer count)."""
    layers = stage_layers(model, config, framework)[stage]
    return _stage_memory(model, config, stage, layers, gpu, framework, precision,
                         zero_settings or None)  # fmt: skip


def with_slack(plans: tuple[StagePlan, ...], gpu: GPUSpec) -> tuple[StageMemory, ...]:
    """The stages with their allocator slack (``overheads.allocator_slack``, simulated)."""
    out = []
    for stage, tensors in plans:
        slacks = zip(stage.phases, allocator_slack(tensors, gpu), strict=True)
        phases = tuple(PhaseMemory(**{**_fields(p), "slack": x}) for p, x in slacks)
        out.append(StageMemory(**{**_fields(stage), "phases": phases}))
    return tuple(out)


def _fields(obj: Any) -> dict[str, Any]:  # dataclasses.replace's work, without its checks
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


def fits(breakdown: MemoryBreakdown, gpu: GPUSpec, headroom: float) -> bool:
    """Whether the predicted peak stays within ``headroom`` x the GPU's memory."""
    return breakdown.peak <= headroom * gpu.memory_gib * GIB
