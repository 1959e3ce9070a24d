"""What selective recompute's modules run again in backward (``tuner.models.time.estimate``), and
their FLOPs.

Each recomputed module's forward runs once more before its backward (the checkpoints of
tuner.models.memory.recompute), so its forward time joins the layer's backward, as full recompute's
whole-layer forward does in tuner.models.time.estimate. Costed with the same terms as the forward
itself:

- ``core_attn``: the attention core (tuner.models.time.estimate, as before).
- ``mlp`` (dense layers): fc1 and fc2 (tuner.models.moe ``mlp_seconds``), the activation's and the
  fused norm's element passes (tuner.models.time.estimate ``_elementwise``: the activation reads
  fc1's output and writes F, a norm reads and writes h), and the MLP block's TP collectives, which
  run inside the checkpointed module (TE's fc1 all-gathers its input under SP, fc2 reduce-scatters
  or all-reduces): half of the layer's forward TP traffic (one of its two blocks).
- ``moe`` (MoE layers): the whole MoE block's forward (router, experts, shared experts,
  permutes: tuner.models.moe ``moe_layer_times``) and its dispatch and combine, which run again
  inside the checkpoint (moe_layer.py ``custom_forward`` holds ``dispatch`` and ``combine``).
- ``moe_act``: the activation's element pass over the routed tokens (experts.py: the
  checkpointed ``bias_act_func``).
- ``shared_experts``: the shared experts' GEMMs (their TP traffic is not in the model, as in
  tuner.models.moe).
- ``layernorm``: the MoE layers' pre-MLP norm (the only separate norm under TE,
  tuner.models.memory.recompute).

FLOPs (HFU): the GEMMs that run again, by tuner.models.moe ``mlp_flops_per_token``'s count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tuner.config.parallel import ParallelConfig
from tuner.models.moe import (
    MoETimes,
    expert_tokens,
    mlp_flops_per_token,
    mlp_seconds,
    moe_layer_flags,
)
from tuner.models.rates import Rates
from tuner.spec.study import ModelSpec

NORM_PASSES = 2.0
"""A norm's forward reads its input and writes its output (tuner.models.time.estimate
``_elementwise``)."""


@dataclass(frozen=True, slots=True)
class RecomputeTimes:
    """Seconds one rank adds to one (average) layer's backward for one micro-batch."""

    compute: float = 0.0
    tp_comm: float = 0.0
    ep_comm: float = 0.0


def _moe_share(model: ModelSpec) -> float:
    return sum(moe_layer_flags(model)) / model.num_layers


def selective_times(
    model: ModelSpec,
    c: ParallelConfig,
    rates: Rates,
    tp_fwd: float,
    moe_times: MoETimes | None,
) -> RecomputeTimes:
    """The modules other than core_attn (``tp_fwd``: one layer's forward TP traffic;
    ``moe_times``: tuner.models.moe's for the MoE layers, None for a dense model)."""
    mods = set(c.recomputed_modules) - {"core_attn"}
    if not mods:
        return RecomputeTimes()
    h, e, w = model.hidden_size, rates.elem, _moe_share(model)
    tokens = c.micro_batch_size * model.seq_length / c.cp
    norm_tokens = tokens / (c.tp if c.sequence_parallel else 1)
    norm = NORM_PASSES * norm_tokens * h * e / rates.hbm + rates.op_latency
    compute = tp = ep = 0.0
    if "mlp" in mods and w < 1:
        f = model.ffn_hidden_size
        gemms = mlp_seconds(rates, tokens, h, f / c.tp, model.swiglu)[0]
        act = tokens * ((2 if model.swiglu else 1) * f + f) * e / c.tp / rates.hbm
        compute += (1 - w) * (gemms + act + rates.op_latency + norm)
        tp += (1 - w) * tp_fwd / 2.0
    moe = model.moe
    if moe is not None and moe_times is not None and w:
        dense_f = mlp_seconds(rates, tokens, h, model.ffn_hidden_size / c.tp, model.swiglu)[0]
        if "moe" in mods:  # moe_times.fwd_delta is the block against the dense MLP it replaces
            compute += w * (moe_times.fwd_delta + dense_f)
            ep += w * moe_times.comm_fwd
        else:
            if "moe_act" in mods:
                routed = expert_tokens(model, c)  # the busiest rank's routed tokens
                fe = (moe.ffn_hidden_size or model.ffn_hidden_size) / c.expert_tp
                stream = routed * fe * ((2 if model.swiglu else 1) + 1) * e / rates.hbm
                compute += w * (stream + rates.op_latency)
            if "shared_experts" in mods and moe.shared:
                shared = mlp_seconds(rates, tokens, h, moe.shared / c.tp, model.swiglu)[0]
                compute += w * shared
        if "layernorm" in mods:
            compute += w * norm
    return RecomputeTimes(compute, tp, ep)


def selective_flops_per_sequence(model: ModelSpec, c: ParallelConfig) -> float:
    """Forward FLOPs of one sequence, per layer averaged over the model, that the modules other
    than core_attn run again (mlp, moe, shared_experts; moe_act and layernorm are element-wise,
    which the FLOPs convention does not count)."""
    mods = set(c.recomputed_modules) - {"core_attn"}
    if not mods & {"mlp", "moe", "shared_experts"}:
        return 0.0
    dense = dataclasses.replace(model, moe=None)
    per_token = 0.0
    w = _moe_share(model)
    if "mlp" in mods:
        per_token += (1 - w) * mlp_flops_per_token(dense)
    if model.moe is not None and w:
        if "moe" in mods:  # the MoE layers' share of the averaged count
            per_token += mlp_flops_per_token(model) - (1 - w) * mlp_flops_per_token(dense)
        elif "shared_experts" in mods and model.moe.shared:
            shared = dataclasses.replace(dense, ffn_hidden_size=model.moe.shared)
            per_token += w * mlp_flops_per_token(shared)
    return model.seq_length * per_token
