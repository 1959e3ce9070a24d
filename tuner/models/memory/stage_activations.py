"""A pipeline stage's activations (saved tensors, working set, stage extras, Megatron's global
buffer), shared by the configs that differ only in knobs these terms do not read.

The activations of a stage read every knob of the config but :data:`STATE_ONLY_KNOBS` (the
distributed optimizer, the ZeRO stage and TP-comm overlap, whose userbuffers live outside
PyTorch's allocator and are added per config by tuner.models.memory.estimate), so the configs
of a space that differ only in those share them: :func:`stage_activation_terms` computes them
once per combination of what they read (:func:`stage_activation_terms_uncached` is the
definition; tests/test_stage_states.py holds the two equal on every stage of whole spaces).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import held_layer_microbatches, in_flight
from tuner.models.memory.allocator import NO_TENSORS, GroupSums, Tensors, extended_sums
from tuner.models.memory.fp8 import fp8_layer_activations
from tuner.models.memory.fsdp2 import op_sac_bytes
from tuner.models.memory.kept import Kept, knobs_but
from tuner.models.memory.recompute import selective_activations
from tuner.models.memory.step_tensors import activation_tensors
from tuner.models.memory.terms import (
    LayerActivations,
    global_buffer_bytes,
    layer_activations,
    layers_activation_bytes,
    padded_vocab,
    stage_extras,
)
from tuner.models.moe import allgather_gathered_bytes, moe_layers_on, moe_stage_memory
from tuner.spec.frameworks import traits
from tuner.spec.study import Framework, ModelSpec, Precision

STATE_ONLY_KNOBS = frozenset({"distributed_optimizer", "zero_stage", "tp_comm_overlap"})
"""The config's knobs a stage's activation terms never read: what
:func:`stage_activation_terms` leaves out of its key."""
_activation_knobs = knobs_but(STATE_ONLY_KNOBS)


@dataclass(frozen=True, slots=True)
class ActivationTerms:
    """One rank of a stage: what its layers and extras keep at the forward/backward's peak."""

    held: float
    """Micro-batches whose activations the stage holds (weighed by chunk layers with vp > 1)."""
    activations: float
    """The layers' saved bytes of the held micro-batches plus one layer's working set."""
    extras: float
    """Embedding / final-norm / logits activations (``terms.stage_extras``)."""
    scratch: float
    """Megatron-core's global memory buffer (a persistent workspace)."""
    tensors: tuple[Tensors, Tensors]
    """(saved tensors, recompute working set) as the allocator sees them."""
    sums: GroupSums
    """``allocator.group_sums`` of the saved tensors and the working set, in that order."""


def stage_activation_terms(
    model: ModelSpec, c: ParallelConfig, stage: int, layers: int, framework: Framework,
    precision: Precision,
) -> ActivationTerms:  # fmt: skip
    """:func:`stage_activation_terms_uncached`, kept per (model, the config's knobs but
    :data:`STATE_ONLY_KNOBS`, stage, layers, framework, precision)."""
    knobs = _activation_knobs(c)
    key = (model, knobs, stage, layers, framework, precision)
    terms = _TERMS.get(key)
    if terms is None:
        base = _kept_base_terms(model, c, stage, layers, framework, precision)
        terms = _TERMS.put(key, _recomputed(model, c, layers, framework, precision, base))
    return terms


_TERMS: Kept[ActivationTerms] = Kept()


def stage_activation_terms_uncached(
    model: ModelSpec, c: ParallelConfig, stage: int, layers: int, framework: Framework,
    precision: Precision,
) -> ActivationTerms:  # fmt: skip
    """The activation terms of rank ``stage`` holding ``layers`` layers, computed afresh."""
    base = _base_terms(model, c, stage, layers, framework, precision)
    return _recomputed(model, c, layers, framework, precision, base)


RECOMPUTE_KNOBS = frozenset(
    {"recompute", "recompute_method", "recompute_num_layers", "recompute_modules"}
)
"""The knobs only the recompute part of a stage's activations reads (:func:`_recomputed`): what
:func:`_kept_base_terms` leaves out of its key besides :data:`STATE_ONLY_KNOBS`."""
_base_knobs = knobs_but(STATE_ONLY_KNOBS | RECOMPUTE_KNOBS)


@dataclass(frozen=True, slots=True)
class _BaseTerms:
    """A stage's activation terms before recompute: what no recompute knob changes."""

    layer_act: LayerActivations
    """The stage's average layer for one micro-batch (MoE layers weighed, FP8's saved inputs)."""
    share: float
    """The share of the stage's layers that are MoE layers."""
    dispatch: float
    """One MoE layer's transient dispatch bytes less the allgather's gathered tokens."""
    scratch: float
    """Megatron-core's global memory buffer."""
    held: float
    """Micro-batches the stage holds (weighed by chunk layers with vp > 1)."""
    extras: float
    """Embedding / final-norm / logits activations."""


def _kept_base_terms(
    model: ModelSpec, c: ParallelConfig, stage: int, layers: int, framework: Framework,
    precision: Precision,
) -> _BaseTerms:  # fmt: skip
    """:func:`_base_terms`, kept per (model, the config's knobs but :data:`STATE_ONLY_KNOBS`
    and :data:`RECOMPUTE_KNOBS`, stage, layers, framework, precision): the configs of a space
    that differ only in recompute knobs (a handful per stage) compute them once."""
    key = (model, _base_knobs(c), stage, layers, framework, precision)
    base = _BASE.get(key)
    if base is None:
        base = _BASE.put(key, _base_terms(model, c, stage, layers, framework, precision))
    return base


_BASE: Kept[_BaseTerms] = Kept()


def _base_terms(
    model: ModelSpec, c: ParallelConfig, stage: int, layers: int, framework: Framework,
    precision: Precision,
) -> _BaseTerms:  # fmt: skip
    """The terms of :func:`stage_activation_terms_uncached` that read no recompute knob."""
    fp8 = precision == "fp8"
    precision = "bf16" if fp8 else precision  # fp8: bf16 activations (tuner.spec.fp8)
    vocab = padded_vocab(model.vocab_size, c.tp, framework)
    act = layer_activations(model, c.micro_batch_size, c.cp, precision)
    moe = moe_stage_memory(model, c, stage, layers, framework, precision, act)
    layer_act = moe.activations
    share = moe_layers_on(model, c, stage, framework) / layers if layers else 0.0
    if fp8:  # TE saves GEMM inputs as FP8 (tuner.models.memory.fp8)
        layer_act = fp8_layer_activations(model, c, layer_act, share)
    # Megatron-core keeps the allgather dispatcher's gathered tokens in its global memory
    # buffer, a persistent scratch tensor (tuner.models.memory.terms.global_buffer_bytes), not in
    # the dispatch transient.
    core = traits(framework).megatron_core
    gathered = allgather_gathered_bytes(model, c, precision) if moe.dispatch and core else 0.0
    scratch = global_buffer_bytes(model, c, stage, precision, gathered) if core else 0.0
    held = stage_held(model, c, stage, layers, framework)
    extras = stage_extras(model, c, stage, vocab, precision)
    return _BaseTerms(layer_act, share, moe.dispatch - gathered, scratch, held, extras)


def stage_held(
    model: ModelSpec, c: ParallelConfig, stage: int, layers: int, framework: Framework
) -> float:
    """Micro-batches whose activations rank ``stage`` holds (``pipeline.in_flight``; weighed
    by chunk layers with vp > 1)."""
    if c.vp > 1 and layers:
        # Interleaved chunks of unequal sizes: weigh each held chunk micro-batch by its layers
        # (Megatron's schedule walked per rank; equal chunks give exactly ``in_flight``).
        return held_layer_microbatches(model, c, framework, stage) / layers
    return in_flight(c, stage)


def _recomputed(
    model: ModelSpec, c: ParallelConfig, layers: int, framework: Framework,
    precision: Precision, base: _BaseTerms,
) -> ActivationTerms:  # fmt: skip
    """The activation terms from ``base`` under the config's recompute knobs."""
    fp8 = precision == "fp8"
    precision = "bf16" if fp8 else precision
    # selective recompute's modules (tuner.models.memory.recompute)
    layer_act, rebuilt = selective_activations(
        model, c, base.layer_act, base.share, precision, fp8
    )
    saved, working = layers_activation_bytes(layer_act, c, layers)
    if c.recompute == "selective" and traits(framework).fsdp2:  # torchtitan's per-op SAC
        saved, working = op_sac_bytes(model, c, precision, layers, layer_act)
    working += base.dispatch + rebuilt
    activations = base.held * saved + working
    tensors = activation_tensors(model, layer_act, c, layers, base.held)
    sums = extended_sums(NO_TENSORS, tensors[0] + tensors[1])
    return ActivationTerms(base.held, activations, base.extras, base.scratch, tensors, sums)
