"""Analytical per-GPU memory model: the peak on the most loaded rank, as an explained breakdown.

All figures are bytes per GPU for one training step. ``allocated`` is what
``torch.cuda.max_memory_allocated`` measures (live tensors); ``peak`` adds the allocator's
fragmentation, the CUDA context and communication buffers: the figure that decides OOM.

Sources (cited again at each term):
[K]  Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
     Table 2 and section 4 (per-layer activation bytes, 1F1B in-flight micro-batches).
[N]  Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters"
     (interleaved schedule, pipeline stages).
[Z]  Rajbhandari et al. 2020, "ZeRO" section 5 (model-state bytes per stage, K = 12).
[DS] DeepSpeed ``estimate_zero2/3_model_states_mem_needs`` (stage_1_and_2.py, stage3.py).
[M]  Megatron-LM docs and ``theoretical_memory_usage.py`` (18 B/param, 6 + 12/d with the
     distributed optimizer, vocabulary padding, embedding placement across stages).
Derived extensions (GQA, SwiGLU, FlashAttention, CP) follow [K]'s counting rules and are listed in
shared/reference/memory-and-time-formulas.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tuner.catalog import GPUSpec
from tuner.parallel import ParallelConfig
from tuner.pipeline import in_flight, stage_layers
from tuner.spec import Framework, ModelSpec, Precision

GIB = float(2**30)

# CUDA context + cuBLAS/cuDNN workspaces per GPU process: ~0.5-0.7 GiB on Hopper with CUDA 12
# (nvidia-smi of an idle torch process; reference "order of 0.5-2 GiB per GPU").
CUDA_CONTEXT_BYTES = 0.6 * GIB
# NCCL buffers per communicator a rank uses: NCCL_BUFFSIZE (4 MiB) x channels (up to 32) x
# protocols; ~0.15 GiB each for the DP, TP, PP and CP groups that have more than one rank.
NCCL_BYTES_PER_GROUP = 0.15 * GIB
# PyTorch caching allocator: reserved exceeds allocated by ~5-15 % for training workloads whose
# activation sizes vary (reference: "allocator fragmentation (reserved vs allocated)").
FRAGMENTATION = 0.10
# DeepSpeed ZeRO-1/2 defaults: reduce_bucket_size and allgather_bucket_size of 5e8 elements in
# 16-bit (DeepSpeed zero/config.py); ZeRO-3 prefetch bucket 5e7 elements (stage3_prefetch_bucket).
DS_BUCKET_ELEMENTS = 5e8
DS_STAGE3_PREFETCH_ELEMENTS = 5e7


@dataclass(frozen=True, slots=True)
class ModelStateBytes:
    """Bytes per parameter of each model state (one formula for [Z], [DS] and [M] settings).

    ``param``: 16-bit (or fp32) weights; ``grad``: gradients as the framework keeps them;
    ``grad_fp32``: an extra fp32 gradient partition (DeepSpeed since PR #5099; 0 in [Z]);
    ``optimizer``: K, fp32 master weights plus Adam moments (12 in [Z]).
    ``stage3_param_partition``: whether ZeRO-3 counts the 16-bit parameter shard
    ([DS]'s estimator leaves it out; real runs hold it).
    """

    param: float
    grad: float
    grad_fp32: float
    optimizer: float
    stage3_param_partition: bool = True


# [Z] section 5.1: mixed precision Adam, 2 + 2 + K with K = 12, 16-bit gradients.
ZERO_PAPER = ModelStateBytes(param=2, grad=2, grad_fp32=0, optimizer=12)
# [DS] estimator comment: 18 = 2 grads16 + 4 grads32 + 4 params32 + 8 optimizer states.
DEEPSPEED_ESTIMATOR = ModelStateBytes(
    param=2, grad=2, grad_fp32=4, optimizer=12, stage3_param_partition=False
)


def model_state_bytes(psi: float, dp: int, stage: int, b: ModelStateBytes) -> tuple[float, ...]:
    """(weights, grads, optimizer) bytes per GPU for ``psi`` parameters under ZeRO ``stage``.

    stage 0: nothing sharded; 1: optimizer (and fp32 grads) sharded over ``dp`` [Z P_os];
    2: gradients too [Z P_os+g]; 3: parameters too [Z P_os+g+p]. The gathered-layer working set
    of stage 3 is added by the caller, which knows the largest layer.
    """
    if stage == 0:
        return psi * b.param, psi * (b.grad + b.grad_fp32), psi * b.optimizer
    if stage == 1:
        return psi * b.param, psi * b.grad + psi * b.grad_fp32 / dp, psi * b.optimizer / dp
    grads = psi * (b.grad + b.grad_fp32) / dp
    if stage == 2:
        return psi * b.param, grads, psi * b.optimizer / dp
    weights = psi * b.param / dp if b.stage3_param_partition else 0.0
    return weights, grads, psi * b.optimizer / dp


def zero_model_state_total(
    psi: float, dp: int, stage: int, b: ModelStateBytes, largest_layer_params: float = 0.0
) -> float:
    """All model-state bytes per GPU; ZeRO-3 adds the gathered largest layer (4 B/param [DS])."""
    total = sum(model_state_bytes(psi, dp, stage, b))
    return total + (4 * largest_layer_params if stage == 3 else 0.0)


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Per-GPU bytes on the most loaded rank; every term is explained in this module."""

    weights: float
    grads: float
    optimizer: float
    activations: float  # transformer layers' saved activations (all in-flight micro-batches)
    stage_extras: float  # embedding output, final norm, output-layer input, fp32 logits
    framework_buffers: float  # DeepSpeed buckets / ZeRO-3 gathered layers
    comm_buffers: float  # NCCL communicators
    cuda_context: float
    fragmentation: float
    stage: int  # the pipeline stage this is for (the most loaded one)
    in_flight: int  # micro-batches whose activations that stage holds at once
    params: float  # parameters held by that rank (before ZeRO-3 sharding)

    @property
    def allocated(self) -> float:
        """Live tensor bytes at the peak (what torch.cuda.max_memory_allocated reports)."""
        return (
            self.weights
            + self.grads
            + self.optimizer
            + self.activations
            + self.stage_extras
            + self.framework_buffers
        )

    @property
    def peak(self) -> float:
        """allocated + fragmentation + CUDA context + NCCL: what must fit in the GPU."""
        return self.allocated + self.fragmentation + self.cuda_context + self.comm_buffers

    def to_dict(self) -> dict[str, float]:
        """Each term in GiB, plus ``allocated_gib`` and ``peak_gib``."""
        names = (
            "weights grads optimizer activations stage_extras framework_buffers comm_buffers "
            "cuda_context fragmentation"
        ).split()
        out = {n: round(getattr(self, n) / GIB, 4) for n in names}
        out["allocated_gib"] = round(self.allocated / GIB, 4)
        out["peak_gib"] = round(self.peak / GIB, 4)
        return out


# ----------------------------------------------------------------------------- parameter counts


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameters of one transformer layer split by how TP shards them, plus the embeddings."""

    layer_sharded: float  # QKV, projection and MLP weights and column-parallel biases (/ tp)
    layer_replicated: float  # norms and row-parallel output biases (on every TP rank)
    embedding_rows: int  # vocabulary (padded by the caller) x hidden
    position: float  # learned absolute position embeddings (not TP-sharded)
    final_norm: float

    def total(self, num_layers: int, vocab: int, tied: bool) -> float:
        """Whole-model parameters with a vocabulary of ``vocab`` rows."""
        h = self.embedding_rows
        embed = vocab * h * (1 if tied else 2)
        layer = self.layer_sharded + self.layer_replicated
        return num_layers * layer + embed + self.position + self.final_norm


@functools.lru_cache(maxsize=256)
def param_counts(model: ModelSpec) -> ParamCounts:
    """Per-layer parameter counts ([M] estimator: attention 2h^2(1 + g/a), MLP 2hF or 3hF)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    a, g = model.num_attention_heads, model.query_groups
    kv = model.kv_channels
    attn = h * (a * kv) + 2 * h * (g * kv) + (a * kv) * h  # Q, K, V and output projection
    mlp = (3 if model.swiglu else 2) * h * f  # SwiGLU fc1 is 2F wide (x1.5)
    col_bias = (
        (a * kv + 2 * g * kv + (2 * f if model.swiglu else f)) if model.add_bias_linear else 0
    )
    row_bias = 2 * h if model.add_bias_linear else 0
    norm = (2 * h) if model.normalization == "layernorm" else h  # LayerNorm has a bias
    position = h * (model.max_position_embeddings or model.seq_length)
    return ParamCounts(
        layer_sharded=float(attn + mlp + col_bias),
        layer_replicated=float(row_bias + 2 * norm),
        embedding_rows=h,
        position=float(position if model.position_embedding == "learned_absolute" else 0),
        final_norm=float(norm),
    )


def padded_vocab(vocab_size: int, tp: int, framework: Framework, divisible_by: int = 128) -> int:
    """Pad the vocabulary to a multiple of 128 x TP ([M] make-vocab-size-divisible-by)."""
    if framework != "megatron":
        return vocab_size
    step = divisible_by * tp
    return -(-vocab_size // step) * step


# ----------------------------------------------------------------------------- activations


@dataclass(frozen=True, slots=True)
class LayerActivations:
    """Saved bytes of one layer for one micro-batch, split by where they live ([K] Table 2)."""

    replicated: float  # kept whole on every TP rank unless SP: LN inputs, QKV/fc1 inputs, masks
    sharded: float  # split over TP: Q/K/V, projection input, MLP intermediates
    scores: float  # attention score matrix (softmax out, dropout mask and output); split over TP
    layer_input: float  # the layer input, all that full recompute keeps (2sbh)

    def stored(self, tp: int, sp: bool, recompute: str) -> float:
        """Bytes one TP rank keeps for this layer under ``recompute`` (none/selective/full)."""
        rep = self.replicated / tp if sp else self.replicated
        if recompute == "full":
            return self.layer_input / tp if sp else self.layer_input  # [K] 2sbh (/t with SP)
        if recompute == "selective":
            return rep + self.sharded / tp  # [K] selective drops the score terms
        return rep + (self.sharded + self.scores) / tp


def layer_activations(
    model: ModelSpec, micro_batch: int, cp: int, precision: Precision
) -> LayerActivations:
    """[K] Table 2 generalised to GQA, SwiGLU, FlashAttention, no dropout, fp32 and CP."""
    s = model.seq_length / cp  # CP splits the sequence ([K] counting with s/c tokens per rank)
    b, h, f = micro_batch, model.hidden_size, model.ffn_hidden_size
    a, g = model.num_attention_heads, model.query_groups
    e = 4.0 if precision == "fp32" else 2.0  # bytes per activation element
    mask = 1.0 if model.dropout else 0.0  # dropout masks are 1 B per element
    sbh = s * b * h
    # [K]: LN inputs (2 x e), QKV input (e), fc1 input (e), attention and MLP dropout masks.
    replicated = sbh * (4 * e + 2 * mask)
    # [K]: Q (e) and K, V (e g/a each), output-projection input (e).
    attn = sbh * (e + 2 * e * g / a + e)
    # [K]: GeLU MLP keeps its input and output (4F/h with e = 2); SwiGLU keeps the 2F-wide fc1
    # output and the F-wide fc2 input (6sbF with e = 2).
    mlp = s * b * f * (3 * e if model.swiglu else 2 * e)
    if model.flash_attention:
        scores = 4.0 * s * b * a  # FlashAttention keeps only the fp32 log-sum-exp per row
    else:
        # [K]: softmax output (e), its dropout mask (1 B) and dropout output (e): 5as^2b; no
        # dropout: the softmax output alone. With CP each rank holds its (s/c) x s block.
        scores = a * s * (s * cp) * b * ((2 * e + 1) if model.dropout else e)
    return LayerActivations(
        replicated=replicated, sharded=attn + mlp, scores=scores, layer_input=e * sbh
    )


def _layers_activation_bytes(
    act: LayerActivations, c: ParallelConfig, layers_per_stage: int
) -> tuple[float, float]:
    """(saved bytes for one micro-batch over the stage's layers, recompute working set)."""
    full = act.stored(c.tp, c.sequence_parallel, "none")
    if c.recompute != "full":
        return layers_per_stage * act.stored(c.tp, c.sequence_parallel, c.recompute), 0.0
    ckpt = act.stored(c.tp, c.sequence_parallel, "full")
    n = c.recompute_num_layers or 1
    if c.recompute_method == "block":
        # Megatron block: the first n layers of each stage keep only their input, the rest
        # keep everything; recomputing one layer needs its full activations again.
        recomputed = min(n, layers_per_stage)
        return recomputed * ckpt + (layers_per_stage - recomputed) * full, full
    # Megatron uniform: one checkpoint per chunk of n layers; backward recomputes a whole chunk.
    chunks = -(-layers_per_stage // n)
    return chunks * ckpt, n * full


def _stage_extras(
    model: ModelSpec, c: ParallelConfig, stage: int, vocab: int, precision: Precision
) -> float:
    """Embedding-output and logits activations on the first / last stage ([K] sec. 4.3)."""
    s = model.seq_length / c.cp
    sbh = s * c.micro_batch_size * model.hidden_size
    e = 4.0 if precision == "fp32" else 2.0
    shard = c.tp if c.sequence_parallel else 1
    extras = 0.0
    if stage == 0 and model.dropout:
        extras += in_flight(c, 0) * sbh / shard  # [K] embedding dropout mask, p micro-batches
    if stage == c.pp - 1:
        extras += 2 * e * sbh / shard  # [K] final-norm input and output-layer input
        # [K] fp32 logits 4sbV/t (vocab-parallel cross entropy), plus their 16-bit copy.
        extras += (4 + e) * s * c.micro_batch_size * vocab / c.tp
    return extras


# ----------------------------------------------------------------------------- model states


def _state_bytes(precision: Precision, framework: Framework, c: ParallelConfig) -> ModelStateBytes:
    """Bytes per parameter as each framework keeps them."""
    if framework == "megatron":
        # [M] docs: bf16 18 B = 2 param + 4 fp32 main_grad + 12 (master + Adam); the
        # distributed optimizer shards only the 12 (6 + 12/d). fp16: 20 = 2 + 2 + 16 (4 + 16/d).
        # fp32: 16 = 4 + 4 + 8 (8 + 8/d).
        if precision == "bf16":
            return ModelStateBytes(param=2, grad=4, grad_fp32=0, optimizer=12)
        if precision == "fp16":
            return ModelStateBytes(param=2, grad=2, grad_fp32=0, optimizer=16)
        return ModelStateBytes(param=4, grad=4, grad_fp32=0, optimizer=8)
    if precision == "fp32":
        # DeepSpeed fp32: 4 B weights and grads, Adam moments 8; ZeRO-1/2 also keep an fp32
        # copy of the partition they own (stage_1_and_2.py single_partition_of_fp32_groups).
        extra = 4.0 if c.zero_stage in (1, 2) else 0.0
        return ModelStateBytes(param=4, grad=4, grad_fp32=0, optimizer=8 + extra)
    # DeepSpeed 16-bit: [Z] 2 + 2 + 12; ZeRO-1/2 with bf16 also accumulate gradients in an
    # fp32 partition ([DS] estimator's "4 grads32"; reference: "bf16 and ZeRO-1 ... fp32").
    grad_fp32 = 4.0 if c.zero_stage in (1, 2) else 0.0
    return ModelStateBytes(param=2, grad=2, grad_fp32=grad_fp32, optimizer=12)


def _stage_params(model: ModelSpec, c: ParallelConfig, stage: int, vocab: int) -> float:
    """Parameters one rank of ``stage`` holds ([M] most-loaded shard: (block/p + hV)/t)."""
    counts = param_counts(model)
    layers = model.num_layers / c.pp
    params = layers * (counts.layer_sharded / c.tp + counts.layer_replicated)
    embed = vocab * model.hidden_size / c.tp
    if stage == 0:
        params += embed + counts.position
    if stage == c.pp - 1:
        params += counts.final_norm
        # The output layer: its own weights when untied; with tied weights and pp > 1 the last
        # stage keeps a copy of the word embeddings ([M] placement across stages).
        if not model.tied_embeddings or c.pp > 1:
            params += embed
    return params


def _framework_buffers(
    model: ModelSpec, c: ParallelConfig, framework: Framework, params: float
) -> float:
    """Communication buckets and gathered parameters that DeepSpeed allocates on top."""
    if framework != "deepspeed" or c.zero_stage == 0 or c.dp == 1:
        return 0.0
    if c.zero_stage == 3:
        counts = param_counts(model)
        largest = max(counts.layer_sharded + counts.layer_replicated, 0.0)
        # [DS] ZeRO-3 keeps the largest gathered layer (4 B: 16-bit weights + gradient) and a
        # prefetch bucket of 5e7 16-bit elements.
        return 4 * largest + 2 * min(DS_STAGE3_PREFETCH_ELEMENTS, params)
    # ZeRO-1/2: reduce and all-gather buckets of up to 5e8 16-bit elements each, capped at the
    # model size (a bucket never holds more than the parameters it serves).
    return 2 * 2 * min(DS_BUCKET_ELEMENTS, params)


def _comm_buffers(c: ParallelConfig, gpu: GPUSpec) -> float:
    if gpu.name == "cpu":
        return 0.0  # gloo keeps no preallocated device buffers
    groups = sum(1 for size in (c.dp, c.tp, c.pp, c.cp) if size > 1)
    return groups * NCCL_BYTES_PER_GROUP


def _stage_breakdown(
    model: ModelSpec,
    c: ParallelConfig,
    stage: int,
    gpu: GPUSpec,
    framework: Framework,
    precision: Precision,
) -> MemoryBreakdown:
    vocab = padded_vocab(model.vocab_size, c.tp, framework)
    params = _stage_params(model, c, stage, vocab)
    shard = c.dp * c.cp  # Megatron shards optimizer state over the DP x CP group
    if framework == "megatron":
        stage_z = 1 if c.distributed_optimizer else 0
    else:
        stage_z = c.zero_stage
    weights, grads, optimizer = model_state_bytes(
        params, shard, stage_z, _state_bytes(precision, framework, c)
    )
    act = layer_activations(model, c.micro_batch_size, c.cp, precision)
    layers_per_stage = stage_layers(model, c, framework)[stage]
    saved, working = _layers_activation_bytes(act, c, layers_per_stage)
    held = in_flight(c, stage)
    activations = held * saved + working
    extras = _stage_extras(model, c, stage, vocab, precision)
    fragmentation = FRAGMENTATION * (activations + extras)
    buffers = _framework_buffers(model, c, framework, params)
    if framework == "deepspeed" and c.zero_stage in (1, 2):
        # ZeRO-1/2 reduce (and re-gather) gradients after the backward pass, when the
        # activations are already freed: the buckets reuse that memory and only what exceeds it
        # raises the peak (measured on the demo: ZeRO-1 peaks below ZeRO-0 at pp=1).
        buffers = max(0.0, buffers - activations - extras)
    return MemoryBreakdown(
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        activations=activations,
        stage_extras=extras,
        framework_buffers=buffers,
        comm_buffers=_comm_buffers(c, gpu),
        cuda_context=0.0 if gpu.name == "cpu" else CUDA_CONTEXT_BYTES,
        fragmentation=fragmentation,
        stage=stage,
        in_flight=int(round(held)) if c.vp == 1 else int(held + 0.999),
        params=params,
    )


def estimate_memory(
    model: ModelSpec,
    config: ParallelConfig,
    gpu: GPUSpec,
    framework: Framework = "megatron",
    precision: Precision = "bf16",
) -> MemoryBreakdown:
    """Peak per-GPU memory of ``config``: the larger of the first and the last pipeline stage.

    The first stage holds the most in-flight activations (1F1B) and the embeddings; the last holds
    the output layer and the logits. With pp = 1 both are the same rank.
    """
    first = _stage_breakdown(model, config, 0, gpu, framework, precision)
    if config.pp == 1:
        return first
    last = _stage_breakdown(model, config, config.pp - 1, gpu, framework, precision)
    return first if first.peak >= last.peak else last


def fits(breakdown: MemoryBreakdown, gpu: GPUSpec, headroom: float) -> bool:
    """Whether the predicted peak stays within ``headroom`` x the GPU's memory."""
    return breakdown.peak <= headroom * gpu.memory_gib * GIB
