"""FSDP2's side of the step-time model (torchtitan): parameter all-gathers and gradient
reduce-scatters on the FSDP mesh, HSDP's all-reduce across replicas, and the optimizer step over
the fp32 shard. Pure arithmetic, as in ``tuner.models.time.estimate``.

Sources ([F2]: torch.distributed.fsdp ``fully_shard`` as torchtitan 0.3.0 applies it; [PS]:
torch.distributed.pipelining ``stage.py``):

- [F2] each transformer block is an FSDP unit; its bf16 parameters (``param_dtype``) are
  all-gathered before its forward, the next unit's gather issued while it computes (implicit
  prefetch on a separate stream), and again before its backward when it was resharded after
  forward; its gradients are reduce-scattered in fp32 (``reduce_dtype``) as soon as its backward
  ends, behind the previous unit's backward. torchtitan never defers the sync during gradient
  accumulation (no ``set_requires_gradient_sync(False)`` in its trainer), so every micro-step
  pays the reduce-scatter. With dp_replicate > 1 (HSDP) the reduced shard is then all-reduced
  over the replicas.
- [PS] under pipeline parallelism the stage turns off gradient sync and reshard-after-backward
  for all but the last micro-batch (``set_requires_gradient_sync(False)``,
  ``set_reshard_after_backward(False)``): one reduce-scatter per step, and the parameters are
  gathered once (plus once per micro-batch's backward when resharded after forward).
- Overlap: what a unit's collective cannot hide behind the window of compute is exposed, and the
  first gather of a pass (last reduce-scatter) always is (``tuner.models.time.deepspeed.exposed``).
  No fitted overlap factor: on CPU (gloo, no side streams) overlap cannot be measured here.
"""

from __future__ import annotations

import dataclasses
import functools

from tuner.config.parallel import ParallelConfig
from tuner.models.rates import Link, Rates, group_link
from tuner.models.time.deepspeed import exposed
from tuner.spec.study import ModelSpec
from tuner.spec.torchtitan import reshards_after_forward

REDUCE_BYTES = 4.0
"""torchtitan's ``mixed_precision_reduce`` is float32: gradients reduce in 4-byte elements."""
FSDP2_OPTIMIZER_BYTES_PER_PARAM = 36.0
"""Adam over the fp32 shard: read grad, param, m, v (16 B), write param, m, v (12 B); the grad-norm
read and zeroing (8 B). No master copy and no 16-bit copy to write (the bf16 cast happens in the
next all-gather)."""


def fsdp2_dp_seconds(
    c: ParallelConfig,
    psi: float,
    units: float,
    rates: Rates,
    fsdp: Link,
    replicas: Link,
    windows: tuple[float, float],
) -> float:
    """Exposed FSDP2 traffic of one step for a stage of ``psi`` parameters in ``units`` FSDP
    units; ``windows``: one micro-batch's forward and backward compute on the stage."""
    f, r, m = c.dp_shard * c.cp, c.dp_replicate, max(1, c.num_microbatches)
    gathered = rates.elem  # the param_dtype the gather produces (bf16, or fp32 for fp32)
    unit = psi / max(units, 1.0)
    ring = (f - 1) / f if f > 1 else 0.0
    gather, gather_unit = ring * psi * gathered / fsdp.bandwidth, ring * unit * gathered
    reduce = ring * psi * REDUCE_BYTES / fsdp.bandwidth + (units * fsdp.latency if f > 1 else 0.0)
    reduce_unit = ring * unit * REDUCE_BYTES / fsdp.bandwidth
    if r > 1:  # HSDP: the fp32 shard all-reduced over the replicas
        reduce += 2.0 * (r - 1) / r * psi / f * REDUCE_BYTES / replicas.bandwidth
        reduce += replicas.latency
    if f > 1:
        gather += units * fsdp.latency
    first = gather_unit / fsdp.bandwidth
    reshard = reshards_after_forward(c.reshard_after_forward, c.pp)
    copy_out, copy_in = copy_seconds(psi, rates) if f > 1 else (0.0, 0.0)
    if c.pp > 1:  # [PS] one sync per step; gathers once (and per backward when resharded)
        fwd = exposed(gather, windows[0], first) + copy_out
        bwd = (m * (exposed(gather, windows[1], first) + copy_out) if reshard else 0.0) + exposed(
            reduce, windows[1], reduce_unit
        )
        return fwd + bwd + copy_in
    per_step = exposed(gather, windows[0], first) + exposed(
        reduce + (gather if reshard else 0.0), windows[1], reduce_unit
    )
    return m * (per_step + (2 if reshard else 1) * copy_out + copy_in)


def copy_seconds(psi: float, rates: Rates) -> tuple[float, float]:
    """(all-gather copy-out, reduce-scatter copy-in) seconds of ``psi`` parameters: FSDP2 runs
    both on the compute stream ([F2] ``FSDPParamGroup.wait_for_unshard`` "all_gather_copy_out":
    ``split_with_sizes_copy`` of the gathered buffer into the unsharded parameters, read + write
    in the param dtype; ``foreach_reduce`` copies the unsharded gradients into the reduce-scatter
    input in the reduce dtype, ``foreach_reduce_scatter_copy_in``, before the reduce-scatter
    stream waits on the compute stream). Memory-bound: at the achieved HBM bandwidth."""
    return 2.0 * psi * rates.elem / rates.hbm, psi * (rates.elem + REDUCE_BYTES) / rates.hbm


def fsdp2_optimizer_seconds(c: ParallelConfig, psi: float, rates: Rates) -> float:
    """The Adam step streams the fp32 shard's states through HBM."""
    shard = psi / (c.dp_shard * c.cp)
    return FSDP2_OPTIMIZER_BYTES_PER_PARAM * shard / rates.hbm + 20 * rates.op_latency


def fsdp2_dp_and_optimizer(
    c: ParallelConfig,
    psi: float,
    layers: float,
    rates: Rates,
    gpus_per_node: int,
    windows: tuple[float, float],
) -> tuple[float, float]:
    """(exposed FSDP2 traffic, optimizer step) of a stage with ``layers`` blocks (plus one unit
    for the embedding or the output); torchtitan's mesh order is pp, dp_replicate, fsdp, tp."""
    f = c.dp_shard * c.cp
    fsdp = group_link(rates, f, c.tp, gpus_per_node)
    replicas = group_link(rates, c.dp_replicate, c.tp * f, gpus_per_node)
    dp = fsdp2_dp_seconds(c, psi, layers + 1, rates, fsdp, replicas, windows)
    return dp, fsdp2_optimizer_seconds(c, psi, rates)


def op_sac_gemms(model: ModelSpec) -> tuple[tuple[str, float], ...]:
    """A block's linear layers in torchtitan's forward order, with FLOPs per token / 2
    (``models/llama3``: ``wq, wk, wv`` then ``wo``; ``w2(silu(w1(x)) * w3(x))`` runs w1, w3, w2;
    a non-gated MLP has w1, w2)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    kv = model.query_groups * model.kv_channels
    mlp = (("w1", h * f), ("w3", h * f), ("w2", f * h)) if model.swiglu else (
        ("w1", h * f), ("w2", f * h),
    )  # fmt: skip
    return (("wq", h * h), ("wk", h * kv), ("wv", h * kv), ("wo", h * h), *mlp)


def op_sac_fraction(model: ModelSpec) -> float:
    """Share of a block's forward GEMM FLOPs that torchtitan's per-op SAC recomputes in backward:
    its policy (``distributed/activation_checkpoint.py`` ``SelectiveAC``) counts the block's mm /
    linear ops in forward order and recomputes every second one (wk, wo, w3 for Llama), saving
    the others and attention. The element-wise ops it also recomputes are not counted."""
    gemms = op_sac_gemms(model)
    redone = sum(flops for i, (_, flops) in enumerate(gemms) if (i + 1) % 2 == 0)
    return redone / sum(flops for _, flops in gemms)


# --- torchtitan's eager element-wise kernels ---------------------------------------------------
# ``tuner.models.time.estimate._elementwise`` counts each element-wise op of a block as one fused
# pass (what Megatron's fused kernels, and Inductor under ``torch.compile``, run). torchtitan's
# Llama block in eager mode runs them as separate ATen kernels, each reading its inputs and writing
# its output in full; the counts below are the bytes beyond the fused ones, per element, from the
# source (0.3.0: ``models/common/rope.py`` ``ComplexRoPE.apply_rotary_emb``,
# ``models/common/attention.py`` ``GQAttention.forward``, ``models/common/feed_forward.py``;
# torch 2.13 ``nn.RMSNorm`` runs ``aten._fused_rms_norm``, one pass).

ROPE_EXTRA_BYTES = 16.0
"""Complex RoPE per query / key element: ``.float()`` (read e, write 4), the complex product
(read 4, write 4), ``type_as`` back (read 4, write e): 2e + 16 bytes against the fused pass's
read + write (2e)."""
COMPOSITE_NORM_FP32_BYTES = 28.0
"""torchtitan's own RMSNorm before it used ``nn.RMSNorm`` (2024, ``torchtitan/models/norms.py``
``RMSNorm``: ``(x.float() * rsqrt(x.pow(2).mean(-1) + eps)).type_as(x) * weight``) per element:
``.float()`` (e + 4), ``pow`` (8), ``mean`` (4), the product (8), ``type_as`` (4 + e), ``* weight``
(2e): 4e + 28 bytes against the fused pass's 2e, i.e. 2e + 28 more."""


def eager_elementwise_bytes(
    model: ModelSpec, tp: int, sp: bool, elem: int, code_2024: bool
) -> float:
    """HBM bytes per token of one block's forward that eager torchtitan moves beyond the fused
    count: RoPE's fp32 complex passes on q and k, the attention output's ``.contiguous()`` copy
    (read + write), SwiGLU's ``silu`` and product as two kernels (5e per FFN element against
    the fused 3e). ``code_2024``: the code of torchtitan's published 2024 runs, with its
    composite RMSNorm (COMPOSITE_NORM_FP32_BYTES) and GQA keys and values expanded to every
    head before attention (``repeat_kv``: read the KV heads, write all heads, for K and V)."""
    h, kv = model.hidden_size, model.query_groups * model.kv_channels
    qk = (model.num_attention_heads * model.kv_channels + kv) / tp
    total = ROPE_EXTRA_BYTES * qk + 2 * elem * h / tp
    if model.swiglu:
        total += 2 * elem * model.ffn_hidden_size / tp
    if code_2024:
        total += 2 * (2 * elem + COMPOSITE_NORM_FP32_BYTES) * h / (tp if sp else 1)
        if kv < model.num_attention_heads * model.kv_channels:
            total += 2 * elem * (kv + model.num_attention_heads * model.kv_channels) / tp
    return total


def eager_elementwise_seconds(
    model: ModelSpec, c: ParallelConfig, rates: Rates, code_2024: bool
) -> tuple[float, float, float]:
    """(forward, backward, recomputed) seconds per block and micro-batch of the eager passes
    (``eager_elementwise_bytes``; 0 under ``torch.compile``, whose Inductor kernels fuse each
    chain of element-wise ops into one pass, the count ``_elementwise`` already makes). Backward
    moves twice the forward's bytes (saved input, output gradient in; input gradient out); any
    activation checkpointing (per-op SAC saves matmul and attention outputs only, full saves the
    block input) runs them again in backward."""
    if c.compile:
        return 0.0, 0.0, 0.0
    tokens = c.micro_batch_size * model.seq_length / c.cp
    fwd = tokens * eager_elementwise_bytes(model, c.tp, c.sequence_parallel, rates.elem, code_2024)
    fwd = fwd / rates.hbm + 6 * rates.op_latency
    return fwd, 2.0 * fwd, fwd if c.recompute != "none" else 0.0


# --- torchtitan's attention kernel ------------------------------------------------------------

SDPA_HOPPER_FLASH2_EFFICIENCY = 0.35
"""Share of the 16-bit dense peak that FlashAttention-2 reaches on an H100, forward and backward
("FlashAttention-2 achieving only 35% utilization on H100 GPUs", Shah et al. 2024,
arXiv:2407.08608, abstract)."""


HOPPER = (9.0, 10.0)
"""Compute capabilities where the FlashAttention-2 figure above was measured (sm_90)."""


@functools.lru_cache(maxsize=64)
def sdpa_rates(rates: Rates, capability: float) -> Rates:
    """``rates`` with attention at torchtitan's kernel. Its Llama attention is PyTorch's
    ``F.scaled_dot_product_attention``, whose backend order is FlashAttention-2, memory-efficient,
    math, then cuDNN, with FlashAttention-3 off (torch 2.13 ``torch._C._get_sdp_priority_order()``
    = [FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH, CUDNN_ATTENTION, OVERRIDEABLE],
    ``_get_fa3_sdp_enabled()`` False): on Hopper it runs FlashAttention-2, not the cuDNN kernels
    ``tuner.models.rates.HOPPER_ATTENTION`` prices for Transformer Engine. The catalog's
    Hopper table is the only one with several rows; other tables (pre-Hopper: FlashAttention
    already; CPU) are kept, and so is Blackwell's (``capability`` 10 and up), where no measured
    FlashAttention-2 figure is at hand."""
    hopper = HOPPER[0] <= capability < HOPPER[1]
    if rates.sm_count == 0 or len(rates.attention) < 2 or not hopper:
        return rates
    flash = rates.peak * SDPA_HOPPER_FLASH2_EFFICIENCY
    return dataclasses.replace(rates, attention=((1.0, flash, flash),))
