"""torchtitan's per-op selective activation checkpointing: what a block keeps for backward.

torchtitan 0.3.0 ``distributed/activation_checkpoint.py`` ``SelectiveAC`` wraps each block in a
checkpoint whose policy saves the outputs of the compute ops (matmuls, attention, reductions)
except every second matmul in forward order, and recomputes everything else (norms, activations,
RoPE, the element-wise products). So a block keeps its input (the checkpoint's argument), the
saved matmul outputs (``tuner.models.time.fsdp2.op_sac_gemms``: wq, wv, w1, w2 for Llama) and
the attention output with its fp32 log-sum-exp; backward recomputes the rest of one block at a
time, so one block's full activations are the working set.
"""

from __future__ import annotations

from tuner.config.parallel import ParallelConfig
from tuner.models.memory.terms import LayerActivations
from tuner.models.time.fsdp2 import op_sac_gemms
from tuner.spec.study import ModelSpec, Precision


def op_sac_bytes(
    model: ModelSpec, c: ParallelConfig, precision: Precision, layers: int, act: LayerActivations
) -> tuple[float, float]:
    """(saved bytes of the stage's blocks for one micro-batch, recompute working set)."""
    e = 4.0 if precision == "fp32" else 2.0
    tokens = c.micro_batch_size * model.seq_length / c.cp
    gemms = op_sac_gemms(model)
    width = {"wq": model.hidden_size, "wk": model.query_groups * model.kv_channels}
    width |= {"wv": width["wk"], "wo": model.hidden_size, "w1": model.ffn_hidden_size}
    width |= {"w3": model.ffn_hidden_size, "w2": model.hidden_size}
    saved_gemms = [name for i, (name, _) in enumerate(gemms) if (i + 1) % 2 == 1]
    # column-parallel outputs are split over TP; w2 (row-parallel) saves its partial sum whole
    split = sum(width[n] for n in saved_gemms if n != "w2") / c.tp
    whole = width["w2"] if "w2" in saved_gemms else 0.0
    block_input = model.hidden_size / (c.tp if c.sequence_parallel else 1)
    attention = model.hidden_size / c.tp  # the attention output
    lse = 4.0 * model.num_attention_heads / c.tp / e  # fp32 per head, in elements of e bytes
    per_layer = tokens * e * (block_input + split + whole + attention + lse)
    return layers * per_layer, act.stored(c.tp, c.sequence_parallel, "none")
