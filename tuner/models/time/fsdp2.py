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
    if c.pp > 1:  # [PS] one sync per step; gathers once (and per backward when resharded)
        fwd = exposed(gather, windows[0], first)
        bwd = (m * exposed(gather, windows[1], first) if reshard else 0.0) + exposed(
            reduce, windows[1], reduce_unit
        )
        return fwd + bwd
    per_step = exposed(gather, windows[0], first) + exposed(
        reduce + (gather if reshard else 0.0), windows[1], reduce_unit
    )
    return m * per_step


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
