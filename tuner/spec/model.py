"""The model and the training batch of a study: the ``model`` and ``training`` sections, frozen
and checked field by field (:mod:`tuner.spec.study` holds the whole study)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from tuner._loader import KeptHash
from tuner.errors import ConfigError
from tuner.spec.bounds import _ENV_NAME as _ENV_NAME
from tuner.spec.bounds import (
    MAX_BATCH,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_SEQ_LENGTH,
    MAX_VOCAB,
    MAX_WIDTH,
    _at_most,
    _size,
)
from tuner.spec.bounds import MAX_FILE_BYTES as MAX_FILE_BYTES
from tuner.spec.cluster import ClusterSpec as ClusterSpec
from tuner.spec.cluster import SlurmSpec as SlurmSpec
from tuner.spec.cluster import SSHSpec as SSHSpec
from tuner.spec.fp8 import Fp8Format, Fp8Recipe
from tuner.spec.frameworks import Framework as Framework
from tuner.spec.moe import MoESpec

Precision = Literal["bf16", "fp16", "fp32", "fp8"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec(KeptHash):
    """The transformer being trained (a GPT-style decoder)."""

    __hash__ = KeptHash.__hash__  # hashed once (tuner._loader.KeptHash): a key of every kept term

    name: str = "custom"
    """A label for tables; presets set it."""
    num_layers: int
    """Transformer layers (Megatron ``--num-layers``)."""
    hidden_size: int
    """Model width h (``--hidden-size``)."""
    ffn_hidden_size: int
    """MLP inner width F (``--ffn-hidden-size``)."""
    num_attention_heads: int
    """Attention heads a (``--num-attention-heads``)."""
    num_query_groups: int | None = None
    """Key/value groups g for GQA (``--num-query-groups``); None means MHA (g = a)."""
    vocab_size: int
    """Tokenizer vocabulary before Megatron pads it to a multiple of 128 x TP."""
    seq_length: int
    """Training sequence length s."""
    max_position_embeddings: int | None = None
    """Defaults to seq_length."""
    swiglu: bool = False
    """Gated SiLU MLP (fc1 is 2F wide)."""
    tied_embeddings: bool = True
    """Input embedding and output layer share weights (Megatron default)."""
    normalization: Literal["layernorm", "rmsnorm"] = "layernorm"
    """LayerNorm (2h params per norm) or RMSNorm (h)."""
    position_embedding: Literal["learned_absolute", "rope"] = "learned_absolute"
    """Learned absolute positions add s x h parameters to the embedding."""
    dropout: bool = True
    """Attention and hidden dropout on (stores 1-byte masks, Korthikanti's delta = 1)."""
    flash_attention: bool = True
    """FlashAttention / fused attention: the s x s score matrix is never stored."""
    add_bias_linear: bool = True
    """Biases in linear layers (Llama-style models disable them)."""
    add_qkv_bias: bool = False
    """Biases in the QKV projection only (Megatron ``--add-qkv-bias``; Qwen-style models):
    with ``add_bias_linear: false``, (a + 2g) x h/a more parameters per layer."""
    moe: MoESpec | None = None
    """Mixture of experts (``tuner.spec.moe``): routed experts replace the MLP of MoE layers."""

    def __post_init__(self) -> None:
        _size(self.num_layers, MAX_LAYERS, "num_layers", "30x the deepest published model")
        for name in ("hidden_size", "ffn_hidden_size"):
            _size(getattr(self, name), MAX_WIDTH, name, "far wider than any published model")
        for name in ("num_attention_heads", "num_query_groups"):
            _size(getattr(self, name), MAX_HEADS, name, "published models have <= 128")
        _size(self.vocab_size, MAX_VOCAB, "vocab_size", "vocabularies are 32k-256k tokens")
        _size(self.seq_length, MAX_SEQ_LENGTH, "seq_length", "a 16M-token context")
        _at_most(
            self.max_position_embeddings, MAX_SEQ_LENGTH, "max_position_embeddings",
            "a 16M-token context",
        )  # fmt: skip
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                f"({self.num_attention_heads})",
                path="hidden_size",
            )
        g = self.query_groups
        if g <= 0 or self.num_attention_heads % g:
            raise ConfigError(
                f"num_query_groups ({g}) must divide num_attention_heads "
                f"({self.num_attention_heads})",
                path="num_query_groups",
            )
        if self.max_position_embeddings is not None and self.max_position_embeddings < (
            self.seq_length
        ):
            raise ConfigError(
                f"max_position_embeddings ({self.max_position_embeddings}) must be greater than "
                f"or equal to seq_length ({self.seq_length})",
                path="max_position_embeddings",
            )
        if self.moe is not None:
            self.moe.moe_layers(self.num_layers)  # the layer pattern must cover every layer

    @property
    def query_groups(self) -> int:
        """g: the number of key/value heads (a for plain multi-head attention)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def qkv_bias(self) -> int:
        """Bias parameters of one layer's QKV projection: (a + 2g) x h/a when the QKV
        projection has a bias (``add_bias_linear`` or ``add_qkv_bias``), else 0."""
        if not (self.add_bias_linear or self.add_qkv_bias):
            return 0
        return (self.num_attention_heads + 2 * self.query_groups) * self.kv_channels

    @property
    def kv_channels(self) -> int:
        """Per-head width h / a."""
        return self.hidden_size // self.num_attention_heads


LATER_FIELDS = {"add_qkv_bias": False}
"""Model fields added after studies were stored, with their defaults: at the default they are
left out of a study's fingerprint, so a study stored before them still resumes as the same."""


def model_data(model: ModelSpec) -> dict[str, object]:
    """The model's fields as plain data for a fingerprint (:data:`LATER_FIELDS` at their
    defaults left out)."""
    data = asdict(model)
    for key, default in LATER_FIELDS.items():
        if data.get(key) == default:
            data.pop(key)
    return data


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingSpec:
    """What one optimizer step processes."""

    global_batch_size: int
    """Sequences per optimizer step (Megatron ``--global-batch-size``)."""
    precision: Precision = "bf16"
    """bf16 / fp16 mixed precision with fp32 master weights, plain fp32, or fp8: bf16 with the
    linear layers' GEMMs in FP8 (Transformer Engine; ``tuner.spec.fp8``)."""
    fp8_recipe: Fp8Recipe = "delayed"
    """With fp8: Megatron ``--fp8-recipe`` (delayed, tensorwise, blockwise on Hopper; mxfp8 on
    Blackwell)."""
    fp8_format: Fp8Format = "hybrid"
    """With fp8: Megatron ``--fp8-format`` (hybrid: E4M3 forward, E5M2 gradients)."""
    cross_entropy_fusion: bool = False
    """Megatron ``--cross-entropy-loss-fusion`` (its native fused loss kernels; Megatron-LM
    only): fewer passes over the fp32 logits (``tuner.models.time.estimate``)."""

    def __post_init__(self) -> None:
        _size(self.global_batch_size, MAX_BATCH, "global_batch_size", "16M sequences per step")
