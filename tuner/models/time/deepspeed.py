"""DeepSpeed's side of the step-time model: its data-parallel traffic and gradient passes.

What DeepSpeed's engine and optimizer wrappers do around the layers that
``tuner.models.time.estimate`` times: ZeRO's reductions and gathers, the pipeline engine's
ReduceGrads step after the flush (never overlapped with backward), BF16_Optimizer's fp32 gradient
all-reduce and per-micro-batch fp32 accumulation, and autograd's 16-bit accumulation on the fp16
paths. Pure arithmetic, as in ``tuner.models.time.estimate``; each term names the DeepSpeed source
it follows.
"""

from __future__ import annotations

from tuner.config.parallel import ParallelConfig
from tuner.models.optimizer_layout import DEEPSPEED_ZERO_DEFAULTS
from tuner.models.rates import Rates
from tuner.spec.frameworks import traits

BF16_ACCUMULATE_BYTES_PER_PARAM = 20.0
"""DeepSpeed BF16_Optimizer, every micro-batch over the stage's parameters: ``backward`` clears
the bf16 grads (write 2 B), then ``update_hp_grads`` runs ``hp_grad.add_(lp.grad.to(fp32))``: read
the bf16 grad (2 B), write and read its fp32 cast (8 B), read and write the fp32 accumulator
(8 B) (deepspeed/runtime/bf16_optimizer.py; the pipeline engine calls it per backward pass)."""
AUTOGRAD_ACCUMULATE_BYTES_PER_PARAM = 6.0
"""16-bit grads left to autograd (DeepSpeed's fp16 / ZeRO-0/1 paths): from the second micro-batch
on, AccumulateGrad adds the new weight gradient into ``.grad`` in place (read 2 + 2 B, write
2 B). Megatron fuses that add into the weight-gradient GEMM (gradient_accumulation_fusion into
main_grad), so it pays nothing."""
DEEPSPEED_ZERO3_OVERLAP = 0.5
"""Share of a micro-batch's compute that effectively hides ZeRO-3's prefetched gathers and
reduce-scatters (they contend with compute for SMs and HBM). Fitted (0.25 steps) to Narayanan et
al. 2021 Table 2's six ZeRO-3 rows, where TFLOP/s fell almost in proportion to the micro-batch:
full overlap over-predicts them by 13-61%, 0.5 leaves -8..+13%."""


def exposed(comm: float, window: float, floor: float) -> float:
    """What part of ``comm`` cannot hide behind ``window`` of compute (at least ``floor``)."""
    return max(min(comm, floor), comm - window)


def zero3_passes(fetched: float) -> float:
    """Ring passes over the parameters per micro-batch under ZeRO-3, for a stage whose forward
    and backward fetch ``fetched`` parameters: the forward's all-gather, the gradients'
    reduce-scatter, and the backward's re-gather of the parameters released in between.
    DeepSpeed releases a parameter after its module's forward unless it is used again within
    ``stage3_max_reuse_distance`` parameters fetched (runtime/zero/partitioned_param_coordinator
    .py ``__params_to_release``: it walks the recorded forward+backward module trace from the
    current module, counting each module's ``ds_numel``). Between a parameter's forward and its
    backward use lie the modules after it, once in the forward and once in the backward, so a
    parameter with ``a`` parameters after it is kept when ``2 a`` is under the distance: all of
    a stage with ``2 x fetched`` under it (2 passes), the share ``1 - distance / (2 x fetched)``
    re-gathered past that (3 passes for a model far past it)."""
    if fetched <= 0:
        return 2.0
    reuse = DEEPSPEED_ZERO_DEFAULTS["stage3_max_reuse_distance"]
    return 2.0 + max(0.0, 1.0 - reuse / (2.0 * fetched))


def dp_deepspeed(
    config: ParallelConfig,
    psi: float,
    rates: Rates,
    bw: float,
    lat: float,
    mb: float,
    layers: float,
    bf16_optimizer: bool = False,
    fetched: float | None = None,
) -> float:
    """Exposed DP traffic of DeepSpeed: ZeRO-0 all-reduce and ZeRO-1 reduce-scatter + all-gather
    after the last micro-batch; ZeRO-2 reduce-scatters every micro-batch (overlap_comm is off by
    default); ZeRO-3 also gathers parameters in every forward, and again in the backward those
    it released (:func:`zero3_passes` over ``fetched``, all the stage's parameters: ``psi`` by
    default), prefetched behind compute (overlap_comm on by default). With pipeline stages
    the reduction runs in the engine's ReduceGrads step after the flush (pipe/engine.py
    ``_exec_reduce_grads``), never overlapped with backward."""
    d, m = config.dp, max(1, config.num_microbatches)
    if d == 1:
        return 0.0
    ring = (d - 1) / d * psi * rates.elem / bw
    stage = config.zero_stage
    if bf16_optimizer:
        # pipe/engine.py _bf16_reduce_grads: buffered_allreduce_fallback over the optimizer's
        # fp32 grads (BF16_Optimizer.get_grads_for_reduction), a full all-reduce of 4-byte
        # elements; then BF16_Optimizer.step updates its DP partition and all-gathers the bf16
        # parameters (all_gather_dp_groups): 2 x 4 B + 2 B per parameter over the ring.
        unit = (d - 1) / d * psi / bw
        return 2.0 * 4.0 * unit + 2.0 * unit + 2.0 * lat
    if stage == 0:
        return 2.0 * ring + lat
    if stage == 1:
        return 2.0 * (ring + lat)
    if stage == 2:
        return m * (ring + lat) + ring + lat
    passes = zero3_passes(psi if fetched is None else fetched)
    per_mb = passes * (ring + layers * lat)
    prefetch = DEEPSPEED_ZERO_DEFAULTS["stage3_prefetch_bucket_size"]
    first = (d - 1) / d * prefetch * rates.elem / bw  # the first gather of a pass is exposed
    return m * exposed(per_mb, DEEPSPEED_ZERO3_OVERLAP * mb, 2.0 * first)


def grad_accumulation(
    config: ParallelConfig, psi: float, rates: Rates, framework: str, bf16_optimizer: bool
) -> float:
    """HBM passes over the stage's gradients that DeepSpeed runs every micro-batch outside the
    GEMMs: BF16_Optimizer's fp32 accumulation, or autograd's in-place add into 16-bit ``.grad``.
    ZeRO-2/3 reduce each micro-batch's gradients into their partitions instead (not modelled)."""
    if not traits(framework).deepspeed_optimizer or config.zero_stage >= 2:
        return 0.0
    m = max(1, config.num_microbatches)
    if bf16_optimizer:
        return m * psi * BF16_ACCUMULATE_BYTES_PER_PARAM / rates.hbm
    passes = AUTOGRAD_ACCUMULATE_BYTES_PER_PARAM / 2.0  # element passes, at the grads' width
    return (m - 1) * psi * passes * rates.elem / rates.hbm
