"""Analytical step-time model: one optimizer step of a ``ParallelConfig`` -> ``TimeBreakdown``.

FLOPs convention (used everywhere in this module, and by ``model_flops_per_step``): a multiply-add
is 2 FLOPs; the backward pass costs twice the forward; every transformer layer counts its QKV,
output, MLP GEMMs and the full (not causally halved) attention scores QK^T and scores x V; the LM
head (logits GEMM) is included; embedding look-ups, norms, softmax and other element-wise work are
not. For a GPT with F = 4h and multi-head attention this is Korthikanti et al.'s model FLOPs,
72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)). *Model* FLOPs never count recomputation (MFU); *hardware*
FLOPs add what recomputation runs again: one more forward of every recomputed layer for full
recompute (Narayanan et al.'s 96·B·s·L·h²(...) for full uniform recompute), the attention core
(4·B·s²·h per layer) for selective recompute (HFU). Korthikanti's printed selective-recompute HFU
formula, 72·B·s·L·h²(1 + s/(3h) + ...), adds three times that; we count what is executed.

Time model, per micro-batch and per transformer layer on one GPU: each GEMM (forward, and the
backward's input- and weight-gradient GEMMs with their own output shapes) costs
``flops / achieved rate + bytes / achieved HBM bandwidth + latency``, where the achieved rate is
a large GEMM's times the share left by tile and wave quantization (``tuner.rates``), so the small
GEMMs that high TP or small micro-batches produce run below peak; element-wise work (norms,
dropout, residuals, activation, unfused softmax) is memory-bandwidth bound; collectives are rings
``(g-1)/g x bytes / bus bandwidth + latency`` over the slowest link of their group, a group that
spans nodes using the network share of all its ranks on a node (NCCL spreads ring channels over
the node's NICs). The pipeline adds point-to-point transfers and the bubble (p-1)/v micro-batch
slots; the last stage also runs the LM head (``stage_imbalance``); data-parallel gradient traffic
overlaps with the last micro-batch's backward where the framework does that (Megatron; DeepSpeed's
pipeline engine reduces after the flush, ``tuner.perf_deepspeed``); the optimizer step streams
its states through HBM, and DeepSpeed adds a gradient-accumulation pass per micro-batch. Every
rate comes from one ``Rates`` value (the catalog's by default, or a measured cluster profile's);
every constant is named, with its source.

Mixture-of-experts layers (``tuner.moe``) replace the dense MLP's GEMMs by the router and the
grouped expert GEMMs of the busiest rank's routed tokens, and add the dispatch / combine
collectives over the EP group (``ep_comm``); expert gradients reduce over the expert-data-parallel
group. With ``precision: fp8`` the GEMMs run at the catalog's FP8 peak (``tuner.rates``).

All functions here are pure arithmetic on Python floats (the study ranks 10^4-10^5 configs with
it); per-shape work is cached on the frozen ``ModelSpec`` and ``Rates`` values.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from tuner.catalog import GPUSpec
from tuner.frameworks import Framework, traits
from tuner.moe import (
    expert_config,
    expert_params_per_layer,
    framework_moe,
    mlp_flops_per_token,
    moe_layer_flags,
    moe_layer_times,
    nonexpert_delta_per_layer,
)
from tuner.optimizer_layout import uses_bf16_optimizer
from tuner.parallel import ParallelConfig
from tuner.perf_deepspeed import dp_deepspeed, exposed, grad_accumulation
from tuner.pipeline import stage_layers
from tuner.rates import Link, Rates, catalog_rates, gemm_seconds, group_link
from tuner.spec import ModelSpec, TrainingSpec

FLASH_BACKWARD_RATIO = 2.5
"""FlashAttention's backward runs 5 GEMMs to the forward's 2 (it recomputes the scores)."""

# --- Byte counts -------------------------------------------------------------------------------

OPTIMIZER_BYTES_PER_PARAM = 36.0
"""HBM traffic of the Adam update per updated parameter: read fp32 grad, master, m, v (16 B),
write master, m, v (12 B), write the 16-bit copy (2 B) and the unscale/inf-check pass (~6 B)."""
GRAD_PASS_BYTES_PER_PARAM = 8.0
"""Per local parameter, sharded or not: grad-norm read (4 B) and zeroing the fp32 grad (4 B)."""
MEGATRON_GRAD_BYTES = 4
"""Megatron reduces the fp32 main_grad buffer (accumulate-allreduce-grads-in-fp32 for bf16)."""
ELEMENTWISE_BACKWARD_RATIO = 2.0
"""Backward of an element-wise op reads the saved input and the output gradient and writes one."""
CROSS_ENTROPY_BYTES_PER_LOGIT = 16.0
"""fp32 logits: softmax read/write in forward, gradient read/write in backward."""


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    """Predicted seconds per optimizer step on the critical path (the slowest pipeline stage).

    The parts add up to ``step``. FLOPs follow this module's convention (see the module
    docstring): ``model_flops`` excludes recomputation (MFU), ``hardware_flops`` includes it (HFU).
    """

    compute: float
    """Forward + backward of the transformer layers (plus the LM head when pp = 1)."""
    recompute: float
    """Forward work run again in backward (full or selective recomputation)."""
    tp_comm: float
    """Tensor-parallel all-reduce / reduce-scatter + all-gather, including recomputed ones."""
    cp_comm: float
    """Context-parallel K/V exchange not hidden behind the attention kernels."""
    ep_comm: float
    """MoE token dispatch and combine (all-to-all over EP, or all-gather / reduce-scatter),
    forward and backward, on the critical path (tuner.moe)."""
    pp_p2p: float
    """Pipeline point-to-point sends and receives on the critical path."""
    pp_bubble: float
    """Pipeline fill and drain: (p - 1) / v micro-batch slots of the stage."""
    dp_comm: float
    """Exposed (not overlapped) data-parallel gradient / parameter traffic (ZeRO included)."""
    optimizer: float
    """The optimizer step, and gradient accumulation outside the GEMMs (DeepSpeed), both
    memory-bandwidth bound."""
    stage_imbalance: float
    """Extra work of the last pipeline stage (LM head, loss) and the tied-embedding reduction."""
    overhead: float
    """Fixed framework cost per micro-batch and per step (dominates tiny models on CPU ranks)."""
    step: float
    """Seconds per optimizer step: the sum of the parts above."""
    model_flops: float
    """FLOPs of one step, whole model, no recomputation."""
    hardware_flops: float
    """FLOPs of one step, whole model, recomputation included."""
    tokens_per_s: float
    """Tokens per second over the whole job."""
    tokens_per_s_per_gpu: float
    """Tokens per second per GPU."""
    model_tflops_per_gpu: float
    """model_flops / step / GPUs, in TFLOP/s (Megatron-LM's logged figure)."""
    mfu: float
    """Model FLOPs utilisation: model_flops / (step x GPUs x peak)."""
    hfu: float
    """Hardware FLOPs utilisation: hardware_flops / (step x GPUs x peak)."""

    def to_dict(self) -> dict[str, float]:
        """Every field by name (for JSON, tables and Optuna attributes)."""
        return {name: getattr(self, name) for name in _FIELDS}


_FIELDS = tuple(f.name for f in dataclasses.fields(TimeBreakdown))


# --- FLOPs ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _flops_per_sequence(model: ModelSpec) -> tuple[float, float, float]:
    """Forward FLOPs of one sequence: (one layer, its attention core, the LM head)."""
    s, h = model.seq_length, model.hidden_size
    kv = 2 * model.query_groups * model.kv_channels
    attn_core = 4.0 * s * s * h
    mlp = s * mlp_flops_per_token(model)  # 2 s (mlp_in + F) h dense; MoE: tuner.moe
    layer = 2.0 * s * h * (h + kv) + attn_core + 2.0 * s * h * h + mlp
    head = 2.0 * s * h * model.vocab_size
    return layer, attn_core, head


def model_flops_per_step(model: ModelSpec, global_batch_size: int) -> float:
    """Model FLOPs of one optimizer step (module convention: 2 per MAC, backward = 2x forward,
    full attention scores, LM head included, no recomputation)."""
    layer, _, head = _flops_per_sequence(model)
    return 3.0 * global_batch_size * (model.num_layers * layer + head)


def _recompute_fraction(config: ParallelConfig, model: ModelSpec) -> float:
    """Share of a stage's layers that full recomputation runs again."""
    if config.recompute != "full" or config.recompute_method != "block":
        return 1.0
    per_chunk = max(1, model.num_layers // (config.pp * config.vp))
    return min(config.recompute_num_layers or per_chunk, per_chunk) / per_chunk


def hardware_flops_per_step(model: ModelSpec, config: ParallelConfig) -> float:
    """Model FLOPs plus the forward work that ``config.recompute`` runs again."""
    layer, attn_core, _ = _flops_per_sequence(model)
    base = model_flops_per_step(model, config.global_batch_size)
    if config.recompute == "full":
        extra = layer * _recompute_fraction(config, model)
    elif config.recompute == "selective":
        extra = attn_core
    else:
        return base
    return base + config.global_batch_size * model.num_layers * extra


# --- Per-layer times ---------------------------------------------------------------------------


_gemm = gemm_seconds  # the additive GEMM roofline (tuner.rates: one definition)


def _gemm_backward(rates: Rates, m: float, n: float, k: float) -> tuple[float, float]:
    """(input gradient, weight gradient) seconds of the GEMM ``_gemm(rates, m, n, k)``: dX (m x k)
    = dY (m x n) @ W^T and dW (k x n) = X^T @ dY, each with its own output tile grid."""
    return _gemm(rates, m, k, n), _gemm(rates, k, n, m)


def _attention_core(
    model: ModelSpec, rates: Rates, tokens: float, local_seq: float, tp: int
) -> tuple[float, float]:
    """Forward and backward seconds of scores, softmax, dropout and scores x V on one GPU."""
    s, d = model.seq_length, model.kv_channels
    heads = model.num_attention_heads / tp
    if model.flash_attention:  # causal kernels skip the masked half of the score matrix
        fwd = 0.5 * 4.0 * tokens * s * heads * d / rates.flash + rates.op_latency
        return fwd, FLASH_BACKWARD_RATIO * fwd
    batch = tokens / local_seq * heads
    gemms = _gemm(rates, local_seq, s, d, batch) + _gemm(rates, local_seq, d, s, batch)
    scores = batch * local_seq * s
    per_score = 2 * rates.elem + (2 * rates.elem + 1 if model.dropout else 0)
    softmax = scores * per_score / rates.hbm + 2 * rates.op_latency
    return gemms + softmax, 2.0 * gemms + ELEMENTWISE_BACKWARD_RATIO * softmax


def _elementwise(model: ModelSpec, rates: Rates, tokens: float, tp: int, sp: bool) -> float:
    """Forward seconds of norms, residual adds, dropouts and the MLP activation on one GPU."""
    h, f, e = model.hidden_size, model.ffn_hidden_size, rates.elem
    mlp_in = 2 * f if model.swiglu else f
    # two norms (read + write) and two residual adds (2 reads + write): 10 element passes;
    # two dropouts: read + write + a 1-byte mask each. TP replicates these unless SP splits them.
    replicated = tokens * h * (10 * e + (2 * (2 * e + 1) if model.dropout else 0))
    sharded = tokens * (mlp_in + f) * e / tp
    return (replicated / (tp if sp else 1) + sharded) / rates.hbm + 8 * rates.op_latency


def _tp_collectives(tokens: float, h: int, tp: int, sp: bool, bw: float, lat: float) -> float:
    """Seconds of one forward pass's TP traffic: 2 all-reduces, or 2 all-gathers + 2
    reduce-scatters with SP (same bytes on a ring, twice the launches)."""
    if tp == 1:
        return 0.0
    ring = (tp - 1) / tp * tokens * h / bw
    return 4.0 * (ring + lat) if sp else 2.0 * (2.0 * ring + lat)


def _tp_backward(fwd_comm: float, sp: bool, wgrad: float, lat: float) -> float:
    """Exposed TP traffic of one backward pass. Megatron overlaps the column-parallel layers'
    input-gradient all-reduce (reduce-scatter with SP) with their weight-gradient GEMMs; with SP
    the row-parallel layers' gradient all-gathers stay on the critical path."""
    if fwd_comm == 0.0:
        return 0.0
    hideable = fwd_comm / 2.0 if sp else fwd_comm
    return fwd_comm - hideable + max(2.0 * lat, hideable - wgrad)


@functools.lru_cache(maxsize=16384)
def _layer_times(
    model: ModelSpec, rates: Rates, tp: int, cp: int, mbs: int, sp: bool, gpus_per_node: int
) -> tuple[float, float, float, float, float, float, float, float]:
    """Seconds per micro-batch on one GPU: (layer fwd, layer bwd, attention-core fwd, layer TP
    comm of one forward, exposed TP comm of one backward, exposed CP comm fwd + bwd, LM head
    compute fwd + bwd, head TP comm)."""
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
    elem = _elementwise(model, rates, tokens, tp, sp)
    fwd = linear + core_f + elem
    bwd = linear_bwd + core_b + ELEMENTWISE_BACKWARD_RATIO * elem
    link = group_link(rates, tp, 1, gpus_per_node)
    bw, lat = link.bandwidth, link.latency
    tp_fwd = _tp_collectives(tokens, h * e, tp, sp, bw, lat)
    tp_bwd = _tp_backward(tp_fwd, sp, column, lat)
    cp_exposed = 0.0
    if cp > 1:  # ring attention: K and V blocks travel around the CP group behind the kernels
        cp_link = group_link(rates, cp, tp, gpus_per_node)
        ring = (cp - 1) * (tokens * kv / tp * e / cp_link.bandwidth + cp_link.latency)
        cp_exposed = max(0.0, ring - core_f) + max(0.0, 2.0 * ring - core_b)
    vocab = -(-model.vocab_size // (128 * tp)) * 128 * tp  # Megatron pads to 128 x tp
    head = _gemm(rates, tokens, vocab / tp, h) + sum(_gemm_backward(rates, tokens, vocab / tp, h))
    head += tokens * (vocab / tp * CROSS_ENTROPY_BYTES_PER_LOGIT + 4 * h * e) / rates.hbm
    head_comm = _tp_collectives(tokens, h * e, tp, sp, bw, lat)
    return fwd, bwd, core_f, tp_fwd, tp_bwd, cp_exposed, head, head_comm


# --- Parameters, data parallelism, optimizer ----------------------------------------------------

MEGATRON_BUCKET_PARAMS = 40e6
"""Megatron DDP gradient bucket (``--ddp-bucket-size`` default max(40M, 1M x dp)): the last
bucket's reduction cannot hide behind backward compute."""


@functools.lru_cache(maxsize=1024)
def _rank_params(model: ModelSpec, tp: int, pp: int) -> tuple[float, float]:
    """(parameters on the busiest rank, word-embedding parameters per TP rank)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    kv = 2 * model.query_groups * model.kv_channels
    mlp_in = 2 * f if model.swiglu else f
    norm = 2 * h if model.normalization == "layernorm" else h
    bias = (h + kv + h + mlp_in + h) if model.add_bias_linear else 0
    layer = (h * (h + kv) + h * h + h * (mlp_in + f) + bias) / tp + 2 * norm
    embedding = model.vocab_size * h / tp
    position = model.seq_length * h if model.position_embedding == "learned_absolute" else 0
    if pp == 1:
        copies = 1 if model.tied_embeddings else 2
        return model.num_layers * layer + copies * embedding + position + norm, embedding
    return model.num_layers / pp * layer + embedding + max(position, norm), embedding


def _dp_megatron(
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
    bucket = (d - 1) / d * MEGATRON_BUCKET_PARAMS / bw
    grads = MEGATRON_GRAD_BYTES
    if config.distributed_optimizer:
        reduce = ring * grads + lat
        gather = ring * rates.elem + lat
        return exposed(reduce, windows[1], bucket * grads) + exposed(
            gather, windows[0], bucket * rates.elem
        )
    return exposed(2.0 * ring * grads + lat, windows[1], 2.0 * bucket * grads)


def _optimizer(config: ParallelConfig, psi: float, rates: Rates, framework: str) -> float:
    """The Adam step streams the (possibly sharded) fp32 states through HBM."""
    d = config.dp * config.cp
    ds = traits(framework).deepspeed_optimizer
    sharded = config.zero_stage >= 1 if ds else config.distributed_optimizer
    states = psi / d if sharded else psi
    grads = psi / d if ds and config.zero_stage >= 2 else psi
    moved = OPTIMIZER_BYTES_PER_PARAM * states + GRAD_PASS_BYTES_PER_PARAM * grads
    return moved / rates.hbm + 20 * rates.op_latency


# --- The step ------------------------------------------------------------------------------------


def _stage_link(config: ParallelConfig, rates: Rates, gpus_per_node: int) -> Link:
    """Point-to-point between pipeline stages: every GPU of a stage talks to its own peer at once,
    so a pair crossing nodes gets one GPU's network share; the slowest hop sets the pace."""
    stride = config.tp * config.cp * config.dp  # Megatron's rank order: tp, cp, dp, pp
    return rates.intra if config.pp * stride <= gpus_per_node else rates.inter


def _pipeline(
    config: ParallelConfig,
    model: ModelSpec,
    rates: Rates,
    gpus_per_node: int,
    stage_mb: float,
    framework: str,
) -> tuple[float, float]:
    """(point-to-point seconds, bubble seconds) of the (interleaved) 1F1B schedule."""
    pp, vp = config.pp, max(1, config.vp)
    if pp == 1:
        return 0.0, 0.0
    link = _stage_link(config, rates, gpus_per_node)
    tokens = config.micro_batch_size * model.seq_length / config.cp
    activation = tokens * model.hidden_size * rates.elem
    # Megatron's scatter-gather sends a 1/tp slice from each TP rank (Narayanan et al. 2021,
    # section 4.1). DeepSpeed's PipelineEngine does the same through its own path: with a
    # model-parallel group (TP > 1) it sets is_pipe_partitioned / is_grad_partitioned
    # (deepspeed/runtime/pipe/engine.py __init__; ds_config pipeline.pipe_partitioned and
    # grad_partitioned default true), _exec_forward_pass wraps the stage output in a
    # PartitionedTensor over the TP group and sends only the local part, and the receiver's
    # PartitionedTensor.full() all-gathers it over the TP group before computing (the same for
    # gradients in _exec_backward_pass): on the critical path, the engine overlaps nothing. Under
    # Megatron-DeepSpeed's sequence parallelism the activation is already a 1/tp sequence shard.
    transfer = activation / config.tp / link.bandwidth + link.latency
    if traits(framework).deepspeed_pipeline and config.tp > 1:
        local = activation / (config.tp if config.sequence_parallel else 1)
        tp_link = group_link(rates, config.tp, 1, gpus_per_node)
        gather = (config.tp - 1) / config.tp * local / tp_link.bandwidth + tp_link.latency
        transfer = local / config.tp / link.bandwidth + link.latency + gather
    # per micro-batch: a send/recv pair forward and backward per model chunk, plus fill/drain
    hops = 2.0 * vp * max(1, config.num_microbatches) + 2.0 * (pp - 1)
    bubble = (pp - 1) / vp * (stage_mb + rates.microbatch_overhead)
    return hops * transfer, bubble


def _tied_embedding_sync(
    model: ModelSpec,
    config: ParallelConfig,
    rates: Rates,
    embedding: float,
    gpus_per_node: int,
    grad_bytes: float = MEGATRON_GRAD_BYTES,
) -> float:
    """First and last stage all-reduce the shared word-embedding gradient once per step, after
    the flush and before the DP reduction (Megatron's _allreduce_word_embedding_grads on the
    fp32 main_grad; DeepSpeed's ReduceTiedGrads step, pipe/engine.py _exec_reduce_tied_grads, on
    ``weight._hp_grad`` (fp32) under BF16_Optimizer, else on the 16-bit ``weight.grad``)."""
    if config.pp == 1 or not model.tied_embeddings:
        return 0.0
    link = _stage_link(config, rates, gpus_per_node)
    return embedding * grad_bytes / link.bandwidth + link.latency


def _recompute_times(
    config: ParallelConfig, model: ModelSpec, fwd: float, core: float, tp_fwd: float
) -> tuple[float, float]:
    """(compute, TP comm) that recomputation adds to one layer's backward."""
    if config.recompute == "full":
        frac = _recompute_fraction(config, model)
        return frac * fwd, frac * tp_fwd
    if config.recompute == "selective":
        return core, 0.0
    return 0.0, 0.0


def layer_step_times(
    model: ModelSpec,
    training: TrainingSpec,
    config: ParallelConfig,
    gpu: GPUSpec,
    gpus_per_node: int,
    rates: Rates | None = None,
) -> tuple[float, float]:
    """Forward and backward seconds of one transformer layer for one micro-batch on one GPU, with
    its exposed TP traffic; the backward includes recomputation and exposed CP traffic
    (what Korthikanti et al. Table 4 measures)."""
    rates = rates or catalog_rates(gpu, training.precision)
    fwd, bwd, core, tp_fwd, tp_bwd, cp_exposed, _, _ = _layer_times(
        model, rates, config.tp, config.cp, config.micro_batch_size, config.sequence_parallel,
        gpus_per_node,
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
) -> TimeBreakdown:
    """Predicted time of one optimizer step of ``config`` (``framework``: one of
    ``tuner.frameworks``; Megatron-DeepSpeed takes Megatron's TP terms and DeepSpeed's pipeline,
    DP and optimizer terms).

    ``rates``: achieved rates measured on the cluster (a profile); the catalog's by default.
    Pure arithmetic; see the module docstring for the model and the FLOPs convention.
    """
    rates = rates or catalog_rates(gpu, training.precision)
    m = max(1, config.num_microbatches)
    fwd, bwd, core, tp_fwd, tp_bwd, cp_exposed, head, head_comm = _layer_times(
        model,
        rates,
        config.tp,
        config.cp,
        config.micro_batch_size,
        config.sequence_parallel,
        gpus_per_node,
    )
    # the slowest stage sets the pace: the one with the most layers (tuner.pipeline: the
    # frameworks' own per-stage counts, uneven splits included)
    counts = stage_layers(model, config, framework)
    layers = float(max(counts))
    psi, embedding = _rank_params(model, config.tp, config.pp)
    ep_layer, expert_psi = 0.0, 0.0
    share = sum(moe_layer_flags(model)) / model.num_layers
    if share:  # MoE layers replace the dense MLP (averaged over the stage's layers)
        ring = group_link(rates, config.tp * config.ep, 1, gpus_per_node)
        mt = moe_layer_times(
            framework_moe(model, config, framework), rates, config, gpus_per_node, ring
        )
        fwd, bwd = fwd + share * mt.fwd_delta, bwd + share * mt.bwd_delta
        ep_layer = share * (mt.comm_fwd + mt.comm_bwd)
        if config.recompute == "full":  # the checkpointed layer's forward dispatches again
            ep_layer += _recompute_fraction(config, model) * share * mt.comm_fwd
        psi += layers * share * nonexpert_delta_per_layer(model, config)
        expert_psi = layers * share * expert_params_per_layer(model, config)
    rec, rec_comm = _recompute_times(config, model, fwd, core, tp_fwd)
    tp_mb = layers * (tp_fwd + tp_bwd + rec_comm)
    stage_mb = layers * (fwd + bwd + rec + cp_exposed + ep_layer) + tp_mb
    compute, tp_comm, imbalance = m * layers * (fwd + bwd), m * tp_mb, 0.0
    ds = traits(framework).deepspeed_optimizer
    bf16_opt = uses_bf16_optimizer(framework, training.precision, config)
    if config.pp == 1:
        compute += m * head
        tp_comm += m * head_comm
    else:
        # the last stage adds the LM head; layers it holds fewer than the slowest stage absorb it
        spare = (layers - counts[-1]) * stage_mb / layers if layers else 0.0
        imbalance = m * max(0.0, head + head_comm - spare)
        tied_bytes = float(MEGATRON_GRAD_BYTES)
        if traits(framework).deepspeed_pipeline and not bf16_opt:
            tied_bytes = float(rates.elem)
        imbalance += _tied_embedding_sync(
            model, config, rates, embedding, gpus_per_node, tied_bytes
        )
    p2p, bubble = _pipeline(config, model, rates, gpus_per_node, stage_mb, framework)
    dp_link = group_link(rates, config.dp * config.cp, config.tp, gpus_per_node)
    if ds and config.zero_stage == 3 and dp_link is not rates.intra:
        # ZeRO-3 / FSDP parameter gathers across nodes run at one GPU's network share, not the
        # node's: Narayanan et al. 2021 Table 2 (DeepSpeed ZeRO-3, 175B, 384-1536 A100) loses
        # about 1 TB of per-micro-batch traffic per GPU at ~20 GB/s, the per-GPU HDR rate.
        dp_link = rates.inter
    bw, lat = dp_link.bandwidth, dp_link.latency
    if not ds:
        windows = (layers * (fwd + tp_fwd), layers * (bwd + rec + tp_bwd + rec_comm))
        dp = _dp_megatron(config, psi, rates, bw, lat, windows)
    else:
        dp = dp_deepspeed(config, psi, rates, bw, lat, stage_mb, layers, bf16_opt)
    optimizer = _optimizer(config, psi, rates, framework)
    optimizer += grad_accumulation(config, psi, rates, framework, bf16_opt)
    if expert_psi:  # expert grads reduce over the expert-DP group (tuner.moe [MP])
        ec = expert_config(config)
        e_link = group_link(rates, ec.dp, config.expert_tp * config.ep, gpus_per_node)
        if not ds:
            dp += _dp_megatron(ec, expert_psi, rates, e_link.bandwidth, e_link.latency, windows)
        else:  # DeepSpeed reduces the expert groups' grads by its ZeRO stage's rule too
            dp += dp_deepspeed(
                ec, expert_psi, rates, e_link.bandwidth, e_link.latency, stage_mb, layers, bf16_opt
            )
        optimizer += _optimizer(ec, expert_psi, rates, framework)
    parts = (
        compute, m * layers * rec, tp_comm, m * layers * cp_exposed, p2p, bubble, dp,
        optimizer, imbalance, m * rates.microbatch_overhead + rates.step_overhead,
        m * layers * ep_layer,
    )  # fmt: skip
    return _breakdown(parts, model, config, rates)


def _breakdown(
    parts: tuple[float, ...], model: ModelSpec, config: ParallelConfig, rates: Rates
) -> TimeBreakdown:
    step = sum(parts)
    model_flops = model_flops_per_step(model, config.global_batch_size)
    hardware_flops = hardware_flops_per_step(model, config)
    world = config.world_size
    tokens = config.global_batch_size * model.seq_length / step
    compute, recompute, tp_comm, cp_comm, p2p, bubble, dp, optimizer, imbalance, overhead = parts[
        :10
    ]
    ep_comm = parts[10]
    return TimeBreakdown(
        compute=compute,
        recompute=recompute,
        tp_comm=tp_comm,
        cp_comm=cp_comm,
        ep_comm=ep_comm,
        pp_p2p=p2p,
        pp_bubble=bubble,
        dp_comm=dp,
        optimizer=optimizer,
        stage_imbalance=imbalance,
        overhead=overhead,
        step=step,
        model_flops=model_flops,
        hardware_flops=hardware_flops,
        tokens_per_s=tokens,
        tokens_per_s_per_gpu=tokens / world,
        model_tflops_per_gpu=model_flops / step / world / 1e12,
        mfu=model_flops / (step * world * rates.peak),
        hfu=hardware_flops / (step * world * rates.peak),
    )
