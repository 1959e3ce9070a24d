"""Megatron's data-parallel side of the step-time model: the parameters a rank holds, the
gradient reduction and parameter gather its distributed data parallel overlaps with the first
and last micro-batch, and the optimizer step's pass over the states (DeepSpeed's own terms are in
``tuner.models.time.deepspeed``). Pure arithmetic, as in ``tuner.models.time.estimate``.
"""

from __future__ import annotations

import functools

from tuner.config.parallel import ParallelConfig
from tuner.models.rates import Rates
from tuner.models.time.deepspeed import exposed
from tuner.spec.frameworks import traits
from tuner.spec.study import ModelSpec

OPTIMIZER_BYTES_PER_PARAM = 36.0
"""HBM traffic of the Adam update per updated parameter: read fp32 grad, master, m, v (16 B),
write master, m, v (12 B), write the 16-bit copy (2 B) and the unscale/inf-check pass (~6 B)."""
GRAD_PASS_BYTES_PER_PARAM = 8.0
"""Per local parameter, sharded or not: grad-norm read (4 B) and zeroing the fp32 grad (4 B)."""
MEGATRON_GRAD_BYTES = 4
"""Megatron reduces the fp32 main_grad buffer (accumulate-allreduce-grads-in-fp32 for bf16)."""
MEGATRON_BUCKET_PARAMS = 40e6
"""Megatron DDP gradient bucket, at least (``--ddp-bucket-size`` default max(40M, 1M x dp)): the
last bucket's reduction cannot hide behind backward compute."""
MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1e6
"""Megatron-Core's default bucket grows with the data-parallel size, "to ensure that chunks used
in NCCL ring-reduce implementations are large enough to remain bandwidth-bound rather than
latency-bound": ``max(40000000, 1000000 * get_data_parallel_world_size())``
(megatron/core/distributed/distributed_data_parallel.py, since 0fda386c04, 2024-04-11, "Tune DDP
bucket size to improve speed at large DP counts"; the DP size without CP through core_r0.9.0)."""


def megatron_bucket_params(dp: int) -> float:
    """Parameters in one of Megatron-Core DDP's default gradient buckets at data-parallel size
    ``dp``."""
    return max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP_RANK * dp)


@functools.lru_cache(maxsize=1024)
def rank_params(model: ModelSpec, tp: int, pp: int) -> tuple[float, float]:
    """(parameters on the busiest rank, word-embedding parameters per TP rank)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    kv = 2 * model.query_groups * model.kv_channels
    mlp_in = 2 * f if model.swiglu else f
    norm = 2 * h if model.normalization == "layernorm" else h
    bias = model.qkv_bias + ((h + mlp_in + h) if model.add_bias_linear else 0)
    layer = (h * (h + kv) + h * h + h * (mlp_in + f) + bias) / tp + 2 * norm
    embedding = model.vocab_size * h / tp
    position = model.seq_length * h if model.position_embedding == "learned_absolute" else 0
    if pp == 1:
        copies = 1 if model.tied_embeddings else 2
        return model.num_layers * layer + copies * embedding + position + norm, embedding
    return model.num_layers / pp * layer + embedding + max(position, norm), embedding


def dp_megatron(
    config: ParallelConfig,
    psi: float,
    rates: Rates,
    bw: float,
    lat: float,
    windows: tuple[float, float],
) -> float:
    """Exposed DP traffic of Megatron-Core with --overlap-grad-reduce / --overlap-param-gather:
    gradients reduce during the last micro-batch's backward, parameters gather during the next
    step's first forward."""
    d = config.dp * config.cp
    if d == 1:
        return 0.0
    ring = (d - 1) / d * psi / bw
    bucket = (d - 1) / d * megatron_bucket_params(config.dp) / bw
    grads = MEGATRON_GRAD_BYTES
    if config.distributed_optimizer:
        reduce = ring * grads + lat
        gather = ring * rates.elem + lat
        return exposed(reduce, windows[1], bucket * grads) + exposed(
            gather, windows[0], bucket * rates.elem
        )
    return exposed(2.0 * ring * grads + lat, windows[1], 2.0 * bucket * grads)


def optimizer_seconds(config: ParallelConfig, psi: float, rates: Rates, framework: str) -> float:
    """The Adam step streams the (possibly sharded) fp32 states through HBM."""
    d = config.dp * config.cp
    ds = traits(framework).deepspeed_optimizer
    sharded = config.zero_stage >= 1 if ds else config.distributed_optimizer
    states = psi / d if sharded else psi
    grads = psi / d if ds and config.zero_stage >= 2 else psi
    moved = OPTIMIZER_BYTES_PER_PARAM * states + GRAD_PASS_BYTES_PER_PARAM * grads
    return moved / rates.hbm + 20 * rates.op_latency
