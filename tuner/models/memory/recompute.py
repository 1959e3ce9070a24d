"""What selective recompute's modules drop from a layer's saved activations
(``tuner.models.memory.estimate``).

A recomputed module's forward runs again in backward, so what it saved is not kept between the
two; its input stays (it is the checkpoint's). Per module, in Megatron-LM core_v0.15 and with
Transformer Engine (``--transformer-impl`` default, which the templates keep), counted with the
terms of tuner.models.memory.terms ([K] Table 2), tuner.models.moe and tuner.models.memory.fp8:

- ``core_attn``: the attention scores (``LayerActivations.scores``), as before.
- ``layernorm``: transformer_layer.py wraps ``input_layernorm`` and ``pre_mlp_layernorm`` in
  ``CheckpointWithoutOutput`` and frees the norm's output once its consumer ran (the storage
  every user saved goes: tensor_parallel/random.py ``discard_output_and_register_recompute``
  resizes its storage to 0 and recomputes it from a gradient hook). Under TE only MoE layers
  have a separate norm, the pre-MLP one (gpt_layer_specs.py: the input norm is fused into
  linear_qkv, a dense layer's pre-MLP norm into linear_fc1; transformer_layer.py skips an
  IdentityOp): the MoE layers' fc1-input term ([K] "fc1 input", the norm output the router and
  the experts read) goes; in FP8 Megatron saves the original input of the consumers
  (``set_for_recompute_pre_mlp_layernorm``), so what goes is what tuner.models.memory.fp8 counts.
- ``mlp``: ``tensor_parallel.checkpoint(self.mlp, ...)`` in a dense layer (transformer_layer.py
  ``_forward_mlp``; not in MoE layers). It keeps its input, the pre-norm hidden states (the
  norm is fused into TE's fc1, and [K] counts that tensor as the norm's input), and drops fc1's
  input (the fused norm's output) and the MLP intermediates.
- ``moe``: ``tensor_parallel.checkpoint(custom_forward, hidden_states)`` in
  moe/moe_layer.py ``MoELayer.forward``: keeps the norm output and drops everything the MoE
  block adds (tuner.models.moe ``moe_block_bytes``): the router's scores and routing map, per
  routed token the dispatched input, the experts' three F_e-wide tensors, its prob and the permute
  index, and the shared experts' intermediates.
- ``moe_act``: moe/experts.py ``TEGroupedMLP.forward`` wraps the activation (with the probs
  weighting) in ``CheckpointWithoutOutput``: fc2's input per routed token goes (FP8:
  ``set_save_original_input(linear_fc2)``, so no FP8 copy stays either).
- ``shared_experts``: ``tensor_parallel.checkpoint(self.shared_experts, ...)`` in moe_layer.py
  ``shared_experts_compute``: the shared experts' intermediates.

In backward each layer rebuilds its recomputed regions one layer at a time: that layer's dropped
bytes are live again (the ``rebuilt`` working set, the analogue of full recompute's).
"""

from __future__ import annotations

import dataclasses

from tuner.config.parallel import ParallelConfig
from tuner.models.memory.fp8 import SAVED_FP8
from tuner.models.memory.terms import LayerActivations, mlp_width_bytes
from tuner.models.moe import expert_tokens, moe_block_bytes
from tuner.spec.study import ModelSpec, Precision


@dataclasses.dataclass(frozen=True, slots=True)
class _Region:
    """Bytes one recomputed region of one layer saved: ``replicated`` / ``sharded`` in
    ``LayerActivations`` units (whole tensors; per rank they divide by tp, replicated only with
    SP), ``rank``: the same on one rank."""

    replicated: float = 0.0
    sharded: float = 0.0
    rank: float = 0.0


def _dense_mlp(model: ModelSpec, c: ParallelConfig, e: float, eg: float) -> _Region:
    """``mlp``: fc1's input (replicated) and the intermediates: fc1's output (2F with SwiGLU)
    and fc2's input ([K]; GEMM inputs at ``eg`` bytes: 1 under FP8, tuner.models.memory.fp8)."""
    s, b, h, f = (
        model.seq_length / c.cp,
        c.micro_batch_size,
        model.hidden_size,
        model.ffn_hidden_size,
    )
    rep = s * b * h * eg
    sharded = s * b * f * mlp_width_bytes(model, e, eg)
    return _Region(rep, sharded, rep / (c.tp if c.sequence_parallel else 1) + sharded / c.tp)


def _moe_parts(model: ModelSpec, c: ParallelConfig, e: float, eg: float) -> dict[str, _Region]:
    """The MoE layer's regions: ``layernorm`` (the pre-MLP norm output), ``moe_act`` (fc2's
    input per routed token), ``shared_experts`` and ``moe`` (everything tuner.models.moe adds)."""
    moe = model.moe
    if moe is None:
        return {}
    s, b, h = model.seq_length / c.cp, c.micro_batch_size, model.hidden_size
    fe = (moe.ffn_hidden_size or model.ffn_hidden_size) / c.expert_tp
    routed = expert_tokens(model, c)  # per rank
    inter = mlp_width_bytes(model, e, eg)  # the shared experts: a dense MLP
    sp = c.tp if c.sequence_parallel else 1
    norm = _Region(replicated=s * b * h * eg, rank=s * b * h * eg / sp)
    # the checkpointed activation's outputs: SwiGLU's fused weighted kernel writes fc2's input;
    # GeLU its output and the probs-weighted product (fc2's input; tuner.models.moe
    # EXPERT_WIDTH_TENSORS)
    act = routed * fe * (eg if model.swiglu else e + eg)
    shared = s * b * moe.shared * inter
    block = moe_block_bytes(model, c, e, eg)  # everything tuner.models.moe's block keeps
    return {
        "layernorm": norm,
        "moe_act": _Region(sharded=c.tp * act, rank=act),
        "shared_experts": _Region(sharded=shared, rank=shared / c.tp),
        "moe": _Region(sharded=c.tp * block + shared, rank=block + shared / c.tp),
    }


def _sum(regions: list[_Region]) -> _Region:
    return _Region(
        *(sum(getattr(r, f) for r in regions) for f in ("replicated", "sharded", "rank"))
    )


def selective_activations(
    model: ModelSpec,
    c: ParallelConfig,
    act: LayerActivations,
    moe_share: float,
    precision: Precision,
    fp8: bool,
) -> tuple[LayerActivations, float]:
    """(``act`` less what the recomputed modules drop, the bytes one rank rebuilds for one layer
    in backward). ``act``: the stage's average layer for one micro-batch (``moe_share`` of its
    layers MoE), after tuner.models.memory.fp8 when ``fp8``; ``precision`` is the activations'
    (bf16 under FP8). core_attn is tuner.models.memory.terms' (``LayerActivations.scores``)."""
    mods = set(c.recomputed_modules) - {"core_attn"}
    if not mods:
        return act, 0.0
    e = 4.0 if precision == "fp32" else 2.0
    eg = SAVED_FP8 if fp8 else e
    parts = _moe_parts(model, c, e, eg) if moe_share else {}
    moe_regions = [parts[m] for m in ("layernorm",) if m in mods and parts]
    if "moe" in mods and parts:
        moe_regions.append(parts["moe"])  # holds moe_act and shared_experts
    else:
        moe_regions += [parts[m] for m in ("moe_act", "shared_experts") if m in mods and parts]
    moe_layer = _sum(moe_regions)
    dense_layer = _dense_mlp(model, c, e, eg) if "mlp" in mods else _Region()
    w = moe_share
    rep = w * moe_layer.replicated + (1 - w) * dense_layer.replicated
    sharded = w * moe_layer.sharded + (1 - w) * dense_layer.sharded
    out = LayerActivations(
        act.replicated - rep, act.sharded - sharded, act.scores, act.layer_input
    )
    rebuilt = max(moe_layer.rank if w else 0.0, dense_layer.rank if w < 1 else 0.0)
    return out, rebuilt
