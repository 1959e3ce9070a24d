"""Analytical step-time model: one optimizer step of a ``ParallelConfig`` -> ``TimeBreakdown``.

Time model, per micro-batch and per transformer layer on one GPU: each GEMM (forward, and the
backward's input- and weight-gradient GEMMs with their own output shapes) costs
``flops / achieved rate + bytes / achieved HBM bandwidth + latency``, where the achieved rate is
a large GEMM's times the share left by tile and wave quantization (``tuner.models.rates``), so the
small GEMMs that high TP or small micro-batches produce run below peak; element-wise work (norms,
dropout, residuals, rotary embeddings, activation, unfused softmax, the loss's passes over the
fp32 logits) is memory-bandwidth bound; collectives are rings
``(g-1)/g x bytes / bus bandwidth + latency`` over the slowest link of their group, a group that
spans nodes using the network share of all its ranks on a node (NCCL spreads ring channels over
the node's NICs). The pipeline adds point-to-point transfers (Megatron's interleaved schedule
hides its steady-state ones behind the next chunk) and the bubble (p-1)/v micro-batch slots
(``tuner.models.time.pipeline``); the last stage also runs the LM head (``stage_imbalance``);
data-parallel gradient traffic overlaps with the last micro-batch's backward where the framework
does that (Megatron, ``tuner.models.time.dp``; DeepSpeed's pipeline engine reduces after the flush,
``tuner.models.time.deepspeed``); the optimizer step streams its states through HBM, and DeepSpeed
adds a gradient-accumulation pass per micro-batch. Every rate comes from one ``Rates`` value (the
catalog's by default, or a measured cluster profile's); every constant is named, with its source.

Mixture-of-experts layers (``tuner.models.moe``) replace the dense MLP's GEMMs by the grouped
expert GEMMs of the busiest rank's routed tokens, and add the dispatch / combine collectives over
the EP group (``ep_comm``) and the routing around them (router, scores, aux loss, permute /
unpermute: ``tuner.models.time.moe``, ``moe_routing``); expert gradients reduce over the
expert-data-parallel group (``tuner.models.time.dp``). With ``precision: fp8`` the linear layers'
GEMMs run at the catalog's FP8 peak with 1-byte operands (``tuner.models.rates``; the LM head,
router and unfused attention, no Transformer Engine modules, stay 16-bit), the sequence-parallel
all-gathers carry FP8 where TE gathers it, and TE's quantize passes around the GEMMs are costed
(``tuner.models.time.fp8``, ``fp8_cast``). Both run inside each micro-batch, so they also lengthen
the pipeline bubble and the windows that hide DP traffic. With ``tp_comm_overlap`` the layers' TP
collectives run inside their GEMMs as Transformer Engine's userbuffers do
(``tuner.models.time.tp_overlap``).

All functions here are pure arithmetic on Python floats (the study ranks 10^4-10^5 configs with
it); per-shape work is cached on the frozen ``ModelSpec`` and ``Rates`` values. The FLOPs
convention and the result type are ``tuner.models.time.breakdown``'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import stage_layers
from tuner.models.moe import (
    MoETimes,
    expert_config,
    expert_params_per_layer,
    framework_moe,
    moe_layer_flags,
    moe_layer_times,
    nonexpert_delta_per_layer,
    tp_ep_group_size,
)
from tuner.models.optimizer_layout import uses_bf16_optimizer
from tuner.models.rates import (
    Rates,
    attention_seconds,
    catalog_rates,
    gemm16_seconds,
    gemm_seconds,
    group_link,
)
from tuner.models.stack import StackTerms, composed_time, scaled_layer_times
from tuner.models.time.breakdown import (
    TimeBreakdown,
    breakdown,
    hardware_flops_per_step,
    model_flops_per_step,
    recompute_fraction,
)
from tuner.models.time.deepspeed import dp_deepspeed, grad_accumulation
from tuner.models.time.dp import MEGATRON_GRAD_BYTES, dp_megatron, optimizer_seconds, rank_params
from tuner.models.time.fp8 import CastTimes, amax_sync_seconds, layer_casts, tp_gather_ratios
from tuner.models.time.fsdp2 import (
    eager_elementwise_seconds,
    fsdp2_dp_and_optimizer,
    op_sac_fraction,
    sdpa_rates,
)
from tuner.models.time.moe import moe_routing_times
from tuner.models.time.pipeline import pipeline_seconds, tied_embedding_sync
from tuner.models.time.recompute import selective_times
from tuner.models.time.tp_overlap import ub_exposed
from tuner.spec.frameworks import Framework, traits
from tuner.spec.study import ModelSpec, TrainingSpec

__all__ = [
    "TimeBreakdown",
    "estimate_time",
    "hardware_flops_per_step",
    "layer_step_times",
    "model_flops_per_step",
]

# --- Byte counts -------------------------------------------------------------------------------

ELEMENTWISE_BACKWARD_RATIO = 2.0
"""Backward of an element-wise op reads the saved input and the output gradient and writes one."""
SOFTMAX_BACKWARD_PASSES = 3
"""Element passes of the unfused attention's softmax backward: Megatron's fused kernels
(``ScaledUpperTriangMaskedSoftmax`` / ``ScaledMaskedSoftmax``, megatron/core/fusions/
fused_softmax.py, and the same kernels in Megatron-DeepSpeed) read the output gradient and the
saved probabilities and write the input gradient in place: 3 passes to the forward's 2, not
ELEMENTWISE_BACKWARD_RATIO x 2. PyTorch's dropout backward (``native_dropout_backward``) is one
multiply by the saved 1-byte mask: as many bytes as its forward."""
CROSS_ENTROPY_BYTES_PER_LOGIT = 52.0
"""HBM bytes per logit of Megatron's vocab-parallel cross entropy, unfused (its default):
forward ``.float()`` of the 16-bit logits (read 2, write 4), the max (read 4), ``-= max`` in
place (8), ``exp`` in place (8), the sum (4), the softmax ``div_`` (8); backward ``mul_`` by the
loss gradient (8) and the cast back to 16 bits for the head's GEMMs (read 4, write 2):
megatron/core/tensor_parallel/cross_entropy.py ``VocabParallelCrossEntropy``. The DeepSpeed
workload's ``F.cross_entropy(logits.float())`` makes about as many passes."""
FUSED_CROSS_ENTROPY_BYTES_PER_LOGIT = 32.0
"""The same with ``--cross-entropy-loss-fusion`` (megatron/core/fusions/fused_cross_entropy.py,
each step one ``jit_fuser`` kernel): cast + max (read 2, write 4), subtract + exp + sum in one
pass (8), the softmax division (8), backward scale + 16-bit cast (read 4, write 4 in place,
write 2). NeMo 2 and Megatron-Bridge turn it on by default."""


# --- Per-layer times ---------------------------------------------------------------------------


_gemm = gemm_seconds  # the additive GEMM roofline (tuner.models.rates: one definition)
_gemm16 = gemm16_seconds  # the same for GEMMs outside Transformer Engine's FP8 layers


def _gemm_backward(
    rates: Rates, m: float, n: float, k: float, gemm: Callable[..., float] = _gemm
) -> tuple[float, float]:
    """(input gradient, weight gradient) seconds of the GEMM ``gemm(rates, m, n, k)``: dX (m x k)
    = dY (m x n) @ W^T and dW (k x n) = X^T @ dY, each with its own output tile grid."""
    return gemm(rates, m, k, n), gemm(rates, k, n, m)


def _dropout_bytes(model: ModelSpec, elem: int) -> float:
    """HBM bytes per element of one dropout, forward and backward alike: read + write + a 1-byte
    mask forward; backward multiplies the gradient by the saved mask (SOFTMAX_BACKWARD_PASSES).
    0 without dropout (PyTorch returns its input at p = 0)."""
    return 2 * elem + 1 if model.dropout else 0.0


def _attention_core(
    model: ModelSpec, rates: Rates, tokens: float, local_seq: float, tp: int
) -> tuple[float, float]:
    """Forward and backward seconds of scores, softmax, dropout and scores x V on one GPU (fused
    kernels at the rate of their call length: under CP, each ring step's s/cp tokens)."""
    s, d = model.seq_length, model.kv_channels
    heads = model.num_attention_heads / tp
    if model.flash_attention:  # causal kernels skip the masked half of the score matrix
        return attention_seconds(rates, 0.5 * 4.0 * tokens * s * heads * d, local_seq)
    batch = tokens / local_seq * heads
    gemms = _gemm16(rates, local_seq, s, d, batch) + _gemm16(rates, local_seq, d, s, batch)
    scores, e = batch * local_seq * s, rates.elem
    # forward: the fused softmax reads the scores and writes the probabilities, then dropout;
    # backward (SOFTMAX_BACKWARD_PASSES): dropout's, then the softmax reads the gradient and its
    # saved output and writes the input gradient
    dropout = _dropout_bytes(model, e)
    softmax_f = scores * (2 * e + dropout) / rates.hbm
    softmax_b = scores * (SOFTMAX_BACKWARD_PASSES * e + dropout) / rates.hbm
    latency = 2 * rates.op_latency
    return gemms + softmax_f + latency, 2.0 * gemms + softmax_b + 2 * latency


def _elementwise(
    model: ModelSpec, rates: Rates, tokens: float, tp: int, sp: bool
) -> tuple[float, float]:
    """Forward and backward seconds of norms, residual adds, dropouts, rotary embeddings and the
    MLP activation on one GPU."""
    h, f, e = model.hidden_size, model.ffn_hidden_size, rates.elem
    mlp_in = 2 * f if model.swiglu else f
    # two norms (read + write) and two residual adds (2 reads + write): 10 element passes, their
    # backward ELEMENTWISE_BACKWARD_RATIO times that; two dropouts (_dropout_bytes), as many
    # bytes backward. TP replicates these unless SP splits them.
    split = tp if sp else 1
    dropout = tokens * h * 2 * _dropout_bytes(model, e) / split / rates.hbm
    sharded = tokens * (mlp_in + f) * e / tp
    if model.position_embedding == "rope":  # query and key rotated: read + write each
        # (megatron/core/transformer/attention.py: apply_rotary_pos_emb on query, then key)
        qk = (model.num_attention_heads + model.query_groups) * model.kv_channels
        sharded += tokens * qk * 2 * e / tp
    rest = (tokens * h * 10 * e / split + sharded) / rates.hbm + 8 * rates.op_latency
    return rest + dropout, ELEMENTWISE_BACKWARD_RATIO * rest + dropout


def _tp_rings(
    tokens: float, h: int, tp: int, sp: bool, bw: float, lat: float, gather: float = 1.0
) -> tuple[float, float]:
    """(all-gathers, reductions) seconds of one pass's TP traffic: 2 all-reduces, or 2
    all-gathers + 2 reduce-scatters with SP (same bytes on a ring, twice the launches);
    ``gather``: bytes of an all-gathered element per 16-bit one (FP8: tuner.models.time.fp8)."""
    if tp == 1:
        return 0.0, 0.0
    ring = (tp - 1) / tp * tokens * h / bw
    if sp:
        return 2.0 * (gather * ring + lat), 2.0 * (ring + lat)
    return 0.0, 2.0 * (2.0 * ring + lat)


def _tp_collectives(tokens: float, h: int, tp: int, sp: bool, bw: float, lat: float) -> float:
    """Seconds of one forward pass's 16-bit TP traffic (``_tp_rings``)."""
    return sum(_tp_rings(tokens, h, tp, sp, bw, lat))


def _tp_backward(rings: tuple[float, float], wgrad: float, lat: float) -> float:
    """Exposed TP traffic of one backward pass. Megatron overlaps the column-parallel layers'
    input-gradient all-reduce (reduce-scatter with SP) with their weight-gradient GEMMs; with SP
    the row-parallel layers' gradient all-gathers stay on the critical path."""
    gathers, reductions = rings
    if gathers + reductions == 0.0:
        return 0.0
    return gathers + max(2.0 * lat, reductions - wgrad)


@functools.lru_cache(maxsize=16384)
def _layer_times(
    model: ModelSpec,
    rates: Rates,
    tp: int,
    cp: int,
    mbs: int,
    sp: bool,
    gpus_per_node: int,
    gather: tuple[float, float] = (1.0, 1.0),
    ub: bool = False,
    loss_bytes: float = CROSS_ENTROPY_BYTES_PER_LOGIT,
    tp_async: bool = True,
) -> tuple[float, float, float, float, float, float, float, float]:
    """Seconds per micro-batch on one GPU: (layer fwd, layer bwd, attention-core fwd, layer TP
    comm of one forward, exposed TP comm of one backward, exposed CP comm fwd + bwd, LM head
    compute fwd + bwd, head TP comm); ``gather``: the forward and backward all-gathers' bytes
    per 16-bit element (``tuner.models.time.fp8.tp_gather_ratios``); ``ub``: --tp-comm-overlap;
    ``loss_bytes``: HBM bytes per logit of the loss (``loss_bytes_per_logit``); ``tp_async``:
    the backward's TP reductions overlap the weight-gradient GEMMs (``_tp_backward``)."""
    h, e = model.hidden_size, rates.elem
    local_seq = model.seq_length / cp
    tokens = mbs * local_seq
    kv = 2 * model.query_groups * model.kv_channels
    mlp_in = 2 * model.ffn_hidden_size if model.swiglu else model.ffn_hidden_size
    # (m, n, k) of QKV and FC1 (column-parallel), attention projection and FC2 (row-parallel)
    shapes = (
        (tokens, (h + kv) / tp, h),
        (tokens, mlp_in / tp, h),
        (tokens, h, h / tp),
        (tokens, h, model.ffn_hidden_size / tp),
    )
    linear = sum(_gemm(rates, *shape) for shape in shapes)
    grads = [_gemm_backward(rates, *shape) for shape in shapes]
    linear_bwd = sum(dgrad + wgrad for dgrad, wgrad in grads)
    column = grads[0][1] + grads[1][1]  # the weight gradients that hide TP traffic
    core_f, core_b = _attention_core(model, rates, tokens, local_seq, tp)
    elem_f, elem_b = _elementwise(model, rates, tokens, tp, sp)
    fwd = linear + core_f + elem_f
    bwd = linear_bwd + core_b + elem_b
    link = group_link(rates, tp, 1, gpus_per_node)
    bw, lat = link.bandwidth, link.latency
    tp_fwd = sum(_tp_rings(tokens, h * e, tp, sp, bw, lat, gather[0]))
    rings = _tp_rings(tokens, h * e, tp, sp, bw, lat, gather[1])
    tp_bwd = _tp_backward(rings, column, lat) if tp_async else sum(rings)
    if (
        ub and tp > 1
    ):  # userbuffers run the collectives inside the GEMMs (tuner.models.time.tp_overlap)
        tp_fwd, tp_bwd = ub_exposed(rates, shapes, tp, h, link, gather)
    cp_exposed = 0.0
    if cp > 1:  # ring attention: K and V blocks travel around the CP group behind the kernels
        cp_link = group_link(rates, cp, tp, gpus_per_node)
        ring = (cp - 1) * (tokens * kv / tp * e / cp_link.bandwidth + cp_link.latency)
        cp_exposed = max(0.0, ring - core_f) + max(0.0, 2.0 * ring - core_b)
    vocab = -(-model.vocab_size // (128 * tp)) * 128 * tp  # Megatron pads to 128 x tp
    # the LM head is Megatron's own ColumnParallelLinear, 16-bit even under fp8
    # (tuner.models.rates)
    head = _gemm16(rates, tokens, vocab / tp, h)
    head += sum(_gemm_backward(rates, tokens, vocab / tp, h, _gemm16))
    head += tokens * (vocab / tp * loss_bytes + 4 * h * e) / rates.hbm
    head_comm = _tp_collectives(tokens, h * e, tp, sp, bw, lat)
    return fwd, bwd, core_f, tp_fwd, tp_bwd, cp_exposed, head, head_comm


def loss_bytes_per_logit(training: TrainingSpec, framework: Framework) -> float:
    """HBM bytes the loss moves per logit: Megatron's fused kernels with
    ``training.cross_entropy_fusion``, else the unfused passes."""
    if training.cross_entropy_fusion and traits(framework).megatron_core:
        return FUSED_CROSS_ENTROPY_BYTES_PER_LOGIT
    return CROSS_ENTROPY_BYTES_PER_LOGIT


# --- The step ------------------------------------------------------------------------------------


def _recompute_times(
    config: ParallelConfig, model: ModelSpec, fwd: float, core: float, tp_fwd: float,
    framework: Framework = "megatron",
) -> tuple[float, float]:  # fmt: skip
    """(compute, TP comm) that recomputation adds to one layer's backward."""
    if config.recompute == "selective" and traits(framework).fsdp2:  # torchtitan's per-op SAC
        return op_sac_fraction(model) * (fwd - core), 0.0
    if config.recompute == "full":
        frac = recompute_fraction(config, model)
        return frac * fwd, frac * tp_fwd
    if config.recompute == "selective":  # the other modules: tuner.models.time.recompute
        return (core if "core_attn" in config.recomputed_modules else 0.0), 0.0
    return 0.0, 0.0


def layer_step_times(
    model: ModelSpec,
    training: TrainingSpec,
    config: ParallelConfig,
    gpu: GPUSpec,
    gpus_per_node: int,
    rates: Rates | None = None,
    tp_backward_overlap: bool = True,
) -> tuple[float, float]:
    """Forward and backward seconds of one transformer layer for one micro-batch on one GPU, with
    its exposed TP traffic; the backward includes recomputation and exposed CP traffic
    (what Korthikanti et al. Table 4 measures)."""
    rates = rates or catalog_rates(gpu, training.precision)
    fwd, bwd, core, tp_fwd, tp_bwd, cp_exposed, _, _ = _layer_times(
        model, rates, config.tp, config.cp, config.micro_batch_size, config.sequence_parallel,
        gpus_per_node, tp_gather_ratios(training, rates.elem), config.tp_comm_overlap,
        loss_bytes_per_logit(training, "megatron"), tp_backward_overlap,
    )  # fmt: skip
    rec, rec_comm = _recompute_times(config, model, fwd, core, tp_fwd)
    return fwd + tp_fwd, bwd + tp_bwd + rec + rec_comm + cp_exposed


def estimate_time(
    model: ModelSpec,
    training: TrainingSpec,
    config: ParallelConfig,
    gpu: GPUSpec,
    gpus_per_node: int,
    framework: Framework = "megatron",
    rates: Rates | None = None,
    p2p_overlap: bool = True,
    tp_backward_overlap: bool = True,
    torchtitan_2024: bool = False,
    terms: StackTerms | None = None,
) -> TimeBreakdown:
    """Predicted time of one optimizer step of ``config`` (``framework``: one of
    ``tuner.spec.frameworks``; Megatron-DeepSpeed takes Megatron's TP terms and DeepSpeed's
    pipeline, DP and optimizer terms).

    ``rates``: achieved rates measured on the cluster (a profile); the catalog's by default.
    ``p2p_overlap``: Megatron's ``overlap_p2p_comm`` (its default; False for code before 2023-10
    or ``--no-overlap-p2p-communication``: ``tuner.models.time.pipeline.exposed_hops``).
    ``torchtitan_2024``: torchtitan's 2024 model code (``tuner.models.time.fsdp2``
    ``eager_elementwise_bytes``), for its published runs; the pinned release's otherwise.
    ``tp_backward_overlap``: the column-parallel layers' input-gradient all-reduce runs beside
    their weight-gradient GEMMs (Megatron-LM since 2021-08, ``ColumnParallelLinearWithAsync
    Allreduce``, commit cf7efd4f; False for code before it, e.g. the BigScience fork of
    Megatron-DeepSpeed, which reduces synchronously in ``_CopyToModelParallelRegion.backward``).
    ``terms``: what a framework probe measured (``tuner.models.stack``). Pure arithmetic.
    """
    rates = rates or catalog_rates(gpu, training.precision)
    if fsdp2 := traits(framework).fsdp2:  # torchtitan's attention is SDPA's (time.fsdp2)
        rates = sdpa_rates(rates, gpu.compute_capability)
    m = max(1, config.num_microbatches)
    fwd, bwd, core, tp_fwd, tp_bwd, cp_exposed, head, head_comm = _layer_times(
        model, rates, config.tp, config.cp, config.micro_batch_size, config.sequence_parallel,
        gpus_per_node, tp_gather_ratios(training, rates.elem), config.tp_comm_overlap,
        loss_bytes_per_logit(training, framework), tp_backward_overlap,
    )  # fmt: skip
    # the slowest stage sets the pace: the one with the most layers (tuner.config.pipeline: the
    # frameworks' own per-stage counts, uneven splits included)
    counts = stage_layers(model, config, framework)
    layers = float(max(counts))
    psi, embedding = rank_params(model, config.tp, config.pp)
    share = sum(moe_layer_flags(model)) / model.num_layers
    ep_layer, expert_psi, route_f, route_b, mt = 0.0, 0.0, 0.0, 0.0, None
    if share:  # MoE layers replace the dense MLP (averaged over the stage's layers)
        fwd, bwd, tp_fwd, tp_bwd, ep_layer, psi, expert_psi, route_f, route_b, mt = _moe_terms(
            model, config, framework, rates, gpus_per_node, share, layers,
            (fwd, bwd, tp_fwd, tp_bwd, psi),
        )  # fmt: skip
    fwd, bwd, core, head, per_mb = scaled_layer_times(
        terms, config, fwd, bwd, core, head, rates.microbatch_overhead, model, framework
    )
    cast, amax = CastTimes(0.0, 0.0, 0.0), 0.0
    if training.precision == "fp8":
        recipe = training.fp8_recipe
        cast = layer_casts(model, rates, config, recipe, gpus_per_node, share)
        amax = amax_sync_seconds(rates, config, recipe, gpus_per_node)
    rec, rec_comm = _recompute_times(config, model, fwd, core, tp_fwd, framework)
    sel = selective_times(model, config, rates, tp_fwd, mt)  # tuner.models.time.recompute
    rec, rec_comm, ep_layer = rec + sel.compute, rec_comm + sel.tp_comm, ep_layer + sel.ep_comm
    redo = recompute_fraction(config, model) if config.recompute == "full" else 0.0
    extra_f, extra_b = cast.fwd + route_f, cast.bwd + route_b + redo * (cast.fwd + route_f)
    eager = (0.0,) * 3  # torchtitan's unfused element-wise kernels (tuner.models.time.fsdp2)
    if fsdp2:
        eager = eager_elementwise_seconds(model, config, rates, torchtitan_2024)
    extra_f, extra_b = extra_f + eager[0], extra_b + eager[1] + eager[2]
    if "moe" in config.recomputed_modules:  # the checkpointed MoE block routes again
        extra_b += route_f
    tp_mb = layers * (tp_fwd + tp_bwd + rec_comm)
    stage_mb = layers * (fwd + bwd + rec + cp_exposed + ep_layer + extra_f + extra_b) + tp_mb
    compute, tp_comm, imbalance = m * layers * (fwd + bwd + eager[0] + eager[1]), m * tp_mb, 0.0
    bf16_opt = uses_bf16_optimizer(framework, training.precision, config)
    if config.pp == 1:
        compute += m * head
        tp_comm += m * head_comm
    else:
        # the last stage adds the LM head; layers it holds fewer than the slowest stage absorb it
        spare = (layers - counts[-1]) * stage_mb / layers if layers else 0.0
        imbalance = m * max(0.0, head + head_comm - spare)
        ds_fp16 = traits(framework).deepspeed_pipeline and not bf16_opt  # fp16 tied grads
        tied = float(rates.elem if ds_fp16 else MEGATRON_GRAD_BYTES)
        imbalance += tied_embedding_sync(model, config, rates, embedding, gpus_per_node, tied)
    windows = (  # one micro-batch's forward and backward on the stage: what hides traffic
        layers * (fwd + tp_fwd + extra_f),
        layers * (bwd + rec + tp_bwd + rec_comm + extra_b),
    )
    p2p, bubble = pipeline_seconds(config, model, rates, gpus_per_node, stage_mb, framework,
                                   windows, p2p_overlap)  # fmt: skip
    dp, optimizer = _dp_and_optimizer(
        config, rates, gpus_per_node, framework, psi, expert_psi, windows, stage_mb, layers,
        bf16_opt,
    )  # fmt: skip
    parts = (
        compute, m * layers * (rec + eager[2]), tp_comm, m * layers * cp_exposed, p2p, bubble, dp,
        optimizer, imbalance, m * per_mb + rates.step_overhead,
        m * layers * ep_layer,
        m * layers * ((1 + redo) * cast.fwd + cast.bwd) + layers * cast.weights + m * amax,
        m * layers * ((1 + redo) * route_f + route_b),
    )  # fmt: skip
    return composed_time(breakdown(parts, model, config, rates), config, terms, rates)


def _dp_and_optimizer(
    config: ParallelConfig, rates: Rates, gpus_per_node: int, framework: Framework, psi: float,
    expert_psi: float, windows: tuple[float, float], stage_mb: float, layers: float,
    bf16_opt: bool,
) -> tuple[float, float]:  # fmt: skip
    """Exposed data-parallel traffic (dense and expert gradients) and the optimizer step's
    seconds, by the framework's engine (Megatron's DDP or DeepSpeed's ZeRO)."""
    if traits(framework).fsdp2:  # torchtitan (tuner.models.time.fsdp2)
        return fsdp2_dp_and_optimizer(config, psi, layers, rates, gpus_per_node, windows)
    ds = traits(framework).deepspeed_optimizer
    dp_link = group_link(rates, config.dp * config.cp, config.tp, gpus_per_node)
    if ds and config.zero_stage == 3 and dp_link is not rates.intra:
        # ZeRO-3 / FSDP parameter gathers across nodes run at one GPU's network share, not the
        # node's: Narayanan et al. 2021 Table 2 (DeepSpeed ZeRO-3, 175B, 384-1536 A100) loses
        # about 1 TB of per-micro-batch traffic per GPU at ~20 GB/s, the per-GPU HDR rate.
        dp_link = rates.inter
    bw, lat = dp_link.bandwidth, dp_link.latency
    if not ds:
        dp = dp_megatron(config, psi, rates, bw, lat, windows)
    else:
        dp = dp_deepspeed(
            config, psi, rates, bw, lat, stage_mb, layers, bf16_opt, psi + expert_psi
        )
    optimizer = optimizer_seconds(config, psi, rates, framework)
    optimizer += grad_accumulation(config, psi, rates, framework, bf16_opt)
    if expert_psi:  # expert grads reduce over the expert-DP group (tuner.models.moe [MP])
        ec = expert_config(config)
        e_link = group_link(rates, ec.dp, config.expert_tp * config.ep, gpus_per_node)
        if not ds:
            dp += dp_megatron(ec, expert_psi, rates, e_link.bandwidth, e_link.latency, windows)
        else:  # DeepSpeed reduces the expert groups' grads by its ZeRO stage's rule too
            dp += dp_deepspeed(ec, expert_psi, rates, e_link.bandwidth, e_link.latency,
                               stage_mb, layers, bf16_opt, psi + expert_psi)  # fmt: skip
        optimizer += optimizer_seconds(ec, expert_psi, rates, framework)
    return dp, optimizer


def _moe_terms(
    model: ModelSpec,
    config: ParallelConfig,
    framework: Framework,
    rates: Rates,
    gpus_per_node: int,
    share: float,
    layers: float,
    dense: tuple[float, float, float, float, float],
) -> tuple[float, float, float, float, float, float, float, float, float, MoETimes]:
    """The dense layer's (fwd, bwd, tp_fwd, tp_bwd, psi) as changed by its ``share`` of MoE layers,
    with the EP traffic per layer, the expert parameters and the routing's forward and backward."""
    fwd, bwd, tp_fwd, tp_bwd, psi = dense
    moe_model = framework_moe(model, config, framework)
    ring = group_link(rates, tp_ep_group_size(config), 1, gpus_per_node)
    mt = moe_layer_times(moe_model, rates, config, gpus_per_node, ring)
    tp_cp = group_link(rates, config.tp * config.cp, 1, gpus_per_node)
    rt = moe_routing_times(moe_model, rates, config, tp_cp, ring)
    route_f, route_b = share * rt.fwd, share * rt.bwd
    fwd, bwd = fwd + share * mt.fwd_delta, bwd + share * mt.bwd_delta
    ep_layer = share * (mt.comm_fwd + mt.comm_bwd)
    if moe_model.moe is not None and not moe_model.moe.shared:
        # An MoE layer's routed experts gather their tokens over ETP only (Megatron-core
        # token_dispatcher.py: its tp_group is expt_tp; that is mt's comm) and its input
        # stays sequence-parallel, so the dense MLP block's TP all-gather and reduce-scatter
        # (half of a layer's TP traffic) are gone. Shared experts, a TP-split MLP under SP
        # (moe/shared_experts.py), keep them.
        tp_fwd, tp_bwd = tp_fwd * (1.0 - share / 2.0), tp_bwd * (1.0 - share / 2.0)
    if config.recompute == "full":  # the checkpointed layer's forward dispatches again
        ep_layer += recompute_fraction(config, model) * share * mt.comm_fwd
    psi += layers * share * nonexpert_delta_per_layer(model, config)
    expert_psi = layers * share * expert_params_per_layer(model, config)
    return fwd, bwd, tp_fwd, tp_bwd, ep_layer, psi, expert_psi, route_f, route_b, mt
