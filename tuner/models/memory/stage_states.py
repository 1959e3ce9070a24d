"""A pipeline stage's parameters and model states (weights, gradients, optimizer), shared by the
configs that differ only in knobs these terms do not read.

The states of a stage read the model, the stage's index and layer count, the framework, the
precision, the ZeRO settings and the config's parallel sizes and optimizer knobs: not
:data:`ACTIVATION_KNOBS`, which only the activations read (sequence parallelism, recompute,
the MoE dispatcher, TP-comm overlap). A space lists every combination, so each stage's states
recur across a dozen to a hundred configs; :func:`stage_state_terms` computes them once per
combination of what they read (:func:`stage_state_terms_uncached` is the definition;
tests/test_stage_states.py holds the two equal on every stage of whole spaces).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from tuner.config.parallel import ParallelConfig
from tuner.models.memory.allocator import GroupSums, group_sums
from tuner.models.memory.kept import Kept, knobs_but
from tuner.models.memory.step_tensors import StateTensors, state_tensors
from tuner.models.memory.terms import padded_vocab, param_counts, stage_params
from tuner.models.moe import expert_config, moe_layers_on, moe_stage_params
from tuner.models.optimizer_layout import LayerSizes, StageStates, StateBytes, stage_states
from tuner.spec.fp8 import fp8_weight_copy_bytes
from tuner.spec.frameworks import traits
from tuner.spec.study import Framework, ModelSpec, Precision

ACTIVATION_KNOBS = frozenset({
    "sequence_parallel", "recompute", "recompute_method", "recompute_num_layers",
    "recompute_modules", "moe_token_dispatcher", "tp_comm_overlap",
})  # fmt: skip
"""The config's knobs the stage's parameters and states never read (only its activations,
buffers and communicators do): what :func:`stage_state_terms` leaves out of its key."""
_state_knobs = knobs_but(ACTIVATION_KNOBS)


@dataclass(frozen=True, slots=True)
class StateTerms:
    """One rank of a stage: its parameters and their states."""

    params: float
    """Dense parameters (the MoE router and shared experts in, the replaced MLPs out)."""
    nonexpert_delta: float
    """What the MoE layers add to the dense count (``moe.moe_stage_params``)."""
    expert_params: float
    """Routed-expert parameters (their states shard over the expert-data-parallel group)."""
    states: StageStates
    """Both groups' states side by side, with TE's FP8 weight copies under FP8."""
    tensors: StateTensors
    """The states' tensors (``step_tensors.state_tensors`` of the above)."""
    sums: tuple[GroupSums, GroupSums, GroupSums]
    """``allocator.group_sums`` of the resident, lazy and step tensors of ``tensors``."""


def stage_state_terms(
    model: ModelSpec, c: ParallelConfig, stage: int, layers: int, framework: Framework,
    precision: Precision, zero_settings: Mapping[str, float] | None, views: bool = False,
) -> StateTerms:  # fmt: skip
    """:func:`stage_state_terms_uncached`, kept per (model, the config's knobs but
    :data:`ACTIVATION_KNOBS`, stage, layers, framework, precision, ZeRO settings, views), and
    computed once per class of stages (first, last, MoE layers) with those."""
    zero = tuple(sorted(zero_settings.items())) if zero_settings else ()
    knobs = _state_knobs(c)
    key = (model, knobs, stage, layers, framework, precision, zero, views)
    terms = _TERMS.get(key)
    if terms is None:
        # the terms read the stage's index only as first, last and its MoE layers
        # (terms.stage_params, moe.moe_stage_params): a middle stage of a deep pipeline has the
        # terms of another with the same layers and MoE layers
        alike = (model, knobs, stage == 0, stage == c.pp - 1,
                 moe_layers_on(model, c, stage, framework), layers, framework, precision, zero,
                 views)  # fmt: skip
        terms = _ALIKE.get(alike)
        if terms is None:
            terms = _ALIKE.put(alike, stage_state_terms_uncached(
                model, c, stage, layers, framework, precision, zero_settings, views))  # fmt: skip
        _TERMS.put(key, terms)
    return terms


_TERMS: Kept[StateTerms] = Kept()
_ALIKE: Kept[StateTerms] = Kept()  # the same terms by the stage's class (stage_state_terms)


def stage_state_terms_uncached(
    model: ModelSpec, c: ParallelConfig, stage: int, layers: int, framework: Framework,
    precision: Precision, zero_settings: Mapping[str, float] | None, views: bool = False,
) -> StateTerms:  # fmt: skip
    """The parameters and states of rank ``stage`` holding ``layers`` layers, computed afresh;
    ``views``: as a figure that counts tensor views sees them (CPU ranks,
    :func:`tuner.models.optimizer_layout.stage_states`)."""
    fp8 = precision == "fp8"
    precision = "bf16" if fp8 else precision  # fp8: bf16 weights and grads (tuner.spec.fp8)
    vocab = padded_vocab(model.vocab_size, c.tp, framework)
    nonexpert, experts = moe_stage_params(model, c, stage, layers, framework)
    params = stage_params(model, c, stage, layers, vocab) + nonexpert
    sizes = _layer_sizes(model, c, layers)
    if traits(framework).fsdp2:  # FSDP2 gathers whole units: the output layer may be largest
        output = vocab * model.hidden_size / c.tp
        sizes = dataclasses.replace(sizes, largest=max(sizes.largest, output))
    states = stage_states(params, c, framework, precision, sizes, zero_settings, views)
    if experts:  # [MP] expert states shard over the expert-data-parallel group
        grid = expert_config(c)
        states = _add_states(
            states, stage_states(experts, grid, framework, precision, sizes, zero_settings, views)
        )
    if fp8:  # TE's cached FP8 weight copies of the stage's GEMM weights (tuner.spec.fp8)
        gemm = layers * param_counts(model).layer_sharded / c.tp + nonexpert
        states = _add_states(states, _weights_only(fp8_weight_copy_bytes(
            gemm + experts, "delayed"), states.layout))  # fmt: skip
    tensors = state_tensors(model, c, layers, params, states)
    sums = group_sums(tensors.resident), group_sums(tensors.lazy), group_sums(tensors.step)
    return StateTerms(params, nonexpert, experts, states, tensors, sums)


def _layer_sizes(model: ModelSpec, c: ParallelConfig, layers: int) -> LayerSizes:
    counts = param_counts(model)
    # ZeRO-3 gathers one layer's TP shard; norms (under the persistence threshold) stay whole.
    return LayerSizes(
        largest=counts.layer_sharded / c.tp + counts.layer_replicated,
        small=layers * counts.layer_replicated + counts.final_norm,
        small_tensor=float(model.hidden_size),
    )


def _add_states(a: StageStates, b: StageStates) -> StageStates:
    """Two parameter groups' states side by side (dense and expert parameters)."""

    def add(x: StateBytes, y: StateBytes) -> StateBytes:
        return StateBytes(
            x.weights + y.weights, x.grads + y.grads, x.optimizer + y.optimizer,
            x.buffers + y.buffers,
        )  # fmt: skip

    # dataclasses.replace's fields, built directly (asked per stage of every MoE config)
    return StageStates(add(a.fwd_bwd, b.fwd_bwd), add(a.step, b.step), a.layout,
                       a.moments + b.moments, a.flat)  # fmt: skip


def _weights_only(weights: float, layout: str) -> StageStates:
    both = StateBytes(weights, 0.0, 0.0, 0.0)
    return StageStates(both, both, layout)
