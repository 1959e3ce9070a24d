"""Memory model terms: parameter counts, saved activations and model-state bytes per parameter.

Sources (cited again at each term):
[K]  Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
     Table 2 and section 4 (per-layer activation bytes).
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

from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import in_flight
from tuner.spec import frameworks
from tuner.spec.study import Framework, ModelSpec, Precision


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
    col_bias = model.qkv_bias + ((2 * f if model.swiglu else f) if model.add_bias_linear else 0)
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
    """Pad the vocabulary to a multiple of 128 x TP ([M] make-vocab-size-divisible-by) where
    the framework runs Megatron's model code (:func:`tuner.spec.frameworks.padded_vocab`)."""
    return frameworks.padded_vocab(vocab_size, tp, framework, divisible_by)


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


def mlp_width_bytes(model: ModelSpec, e: float, eg: float | None = None) -> float:
    """Bytes a dense MLP keeps per token per element of its width F ([K]): fc1's output (2F wide
    with SwiGLU) at ``e`` and fc2's input at ``eg`` (a GEMM input's bytes: 1 under FP8,
    tuner.models.memory.fp8; ``e`` by default). GeLU: input and output of the activation (4F/h with
    e = 2); SwiGLU: the 2F-wide fc1 output and the F-wide fc2 input (6sbF with e = 2)."""
    return (2 if model.swiglu else 1) * e + (e if eg is None else eg)


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
    mlp = s * b * f * mlp_width_bytes(model, e)
    if model.flash_attention:
        scores = 4.0 * s * b * a  # FlashAttention keeps only the fp32 log-sum-exp per row
    else:
        # [K]: softmax output (e), its dropout mask (1 B) and dropout output (e): 5as^2b; no
        # dropout: the softmax output alone. With CP each rank holds its (s/c) x s block.
        scores = a * s * (s * cp) * b * ((2 * e + 1) if model.dropout else e)
    return LayerActivations(
        replicated=replicated, sharded=attn + mlp, scores=scores, layer_input=e * sbh
    )


def saved_mode(c: ParallelConfig) -> str:
    """How ``LayerActivations.stored`` counts a layer under ``c``: full, selective (the attention
    core recomputed, [K]) or none (other selective modules drop their own terms first:
    tuner.models.memory.recompute)."""
    if c.recompute == "full":
        return "full"
    return "selective" if "core_attn" in c.recomputed_modules else "none"


def layers_activation_bytes(
    act: LayerActivations, c: ParallelConfig, layers_per_stage: int
) -> tuple[float, float]:
    """(saved bytes for one micro-batch over the stage's layers, recompute working set)."""
    full = act.stored(c.tp, c.sequence_parallel, "none")
    if c.recompute != "full":
        return layers_per_stage * act.stored(c.tp, c.sequence_parallel, saved_mode(c)), 0.0
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


def stage_extras(
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


def stage_params(
    model: ModelSpec, c: ParallelConfig, stage: int, layers: int, vocab: int
) -> float:
    """Parameters one rank of ``stage`` holds with ``layers`` transformer layers on it.

    [M] most-loaded shard (block/p + hV)/t, with the stage's own layer count (uneven splits
    come from tuner.config.pipeline.stage_layers) instead of num_layers / pp.
    """
    counts = param_counts(model)
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


def global_buffer_bytes(
    model: ModelSpec, c: ParallelConfig, stage: int, precision: Precision, moe_gathered: float
) -> float:
    """Megatron-core's global memory buffer on ``stage``: one tensor per (name, dtype), grown to
    the largest request and never freed (megatron/core/utils.py ``GlobalMemoryBuffer``,
    parallel_state.py ``get_global_memory_buffer``). Its "mpu" tensor takes

    - the output layer's sequence-parallel all-gather of its input, s/cp x b x h, on the last
      stage (megatron/core/tensor_parallel/layers.py
      ``LinearWithGradAccumulationAndAsyncCommunication`` forward and backward; the layer
      saves its local shard, the gathered copy lives in the buffer); TE's layers gather into
      their own tensors;
    - the allgather MoE dispatcher's gathered tokens, ``moe_gathered`` (tuner.models.moe).

    Megatron turns sequence parallelism off at tp = 1 (megatron/training/arguments.py).
    """
    e = 4.0 if precision == "fp32" else 2.0
    sp = c.sequence_parallel and c.tp > 1 and stage == c.pp - 1
    output = model.seq_length / c.cp * c.micro_batch_size * model.hidden_size * e if sp else 0.0
    return max(output, moe_gathered)
