"""What FP8 (Transformer Engine) changes in the saved activations of a layer.

Transformer Engine's docs (docs/features/low_precision_training/performance_considerations:
"Memory usage") spell it out for a Linear in FP8 with bf16 weights on Hopper: the input is saved
for the weight gradient as its FP8 (columnwise) copy, 1 byte per element, instead of the bf16
tensor; but "if the high precision tensor also needs to be saved for backward - for example if
it is the attention output which is saved anyway" the FP8 copy comes on top of it. So per layer,
against [K]'s bf16 counting (tuner.models.memory.terms):

- QKV input and fc1 input (the norms' outputs, saved only for those GEMMs): 2 B -> 1 B;
- the attention output (projection input; the attention kernel keeps its bf16 copy): + 1 B;
- fc2 input (the activation's output; SwiGLU / GeLU backward reads the activation's input): 2 B
  -> 1 B; in MoE layers the same for each routed token's expert fc1 and fc2 inputs.
"""

from __future__ import annotations

import dataclasses

from tuner.config.parallel import ParallelConfig
from tuner.models.memory.terms import LayerActivations
from tuner.models.moe import expert_tokens
from tuner.spec.study import ModelSpec

SAVED_BF16 = 2.0
SAVED_FP8 = 1.0


def fp8_layer_activations(
    model: ModelSpec, c: ParallelConfig, act: LayerActivations, moe_share: float
) -> LayerActivations:
    """``act`` (bf16, one micro-batch; ``moe_share`` of the layers MoE) under FP8 GEMMs."""
    s, b, h = model.seq_length / c.cp, c.micro_batch_size, model.hidden_size
    sbh = s * b * h
    saving = SAVED_BF16 - SAVED_FP8
    replicated = act.replicated - 2 * saving * sbh
    dense_fc2 = s * b * model.ffn_hidden_size * saving * (1 - moe_share)
    sharded = act.sharded + SAVED_FP8 * sbh - dense_fc2
    if moe_share and model.moe is not None:
        fe = (model.moe.ffn_hidden_size or model.ffn_hidden_size) / c.expert_tp
        routed = expert_tokens(model, c) * (h + fe) * saving  # per rank: x tp into "sharded"
        shared = s * b * model.moe.shared * saving
        sharded -= moe_share * (c.tp * routed + shared)
    return dataclasses.replace(act, replicated=replicated, sharded=sharded)
