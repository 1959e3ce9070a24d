"""The layer list a framework's DeepSpeed ``PipelineModule`` partitions, for a study's model.

``tuner.spec.pipeline_split`` partitions layer lists over ints; this module builds them from a
:class:`~tuner.spec.study.ModelSpec` (it is read by the validity rules, the per-stage views, the
search space and so the memory and time models). Parameter counts are one TP rank's, as
``PipelineModule._count_layer_params`` counts the layers it builds on that rank; a test holds
them equal to :func:`tuner.models.memory.terms.param_counts` (one formula, two callers).
"""

from __future__ import annotations

from tuner.spec.deepspeed_partition import (
    GPTPipeShape,
    PipeLayer,
    gpt_model_pipe_layers,
    workload_layers,
)
from tuner.spec.frameworks import padded_vocab, traits
from tuner.spec.study import ModelSpec


def gpt_pipe_shape(model: ModelSpec, tp: int) -> GPTPipeShape:
    """Megatron-DeepSpeed's layer sizes on one TP rank (megatron/model/transformer.py
    ParallelTransformerLayer: QKV and fc1 column-parallel, projection and fc2 row-parallel with
    whole biases, two norms; megatron/model/language_model.py Embedding: vocab-parallel words,
    learned positions unless ``--no-position-embedding``)."""
    h, f, kv = model.hidden_size, model.ffn_hidden_size, model.kv_channels
    a, g = model.num_attention_heads, model.query_groups
    gated = 2 if model.swiglu else 1
    bias = model.add_bias_linear
    sharded = h * (a + 2 * g) * kv + a * kv * h + (gated + 1) * h * f
    sharded += model.qkv_bias + (gated * f if bias else 0)
    norm = 2 * h if model.normalization == "layernorm" else h
    block = sharded // tp + (2 * h if bias else 0) + 2 * norm
    vocab = padded_vocab(model.vocab_size, tp, "megatron-deepspeed")
    positions = model.max_position_embeddings or model.seq_length
    position = h * positions if model.position_embedding == "learned_absolute" else 0
    words = vocab // tp * h
    return GPTPipeShape(
        num_layers=model.num_layers, block=block, embedding=words + position, norm=norm,
        output=words, tied=model.tied_embeddings, rmsnorm=model.normalization == "rmsnorm",
        half=True,
    )  # fmt: skip


def pipe_layers(model: ModelSpec, framework: str, tp: int = 1) -> tuple[PipeLayer, ...]:
    """The ``PipelineModule`` layer list of ``framework`` for ``model`` on a TP rank.

    Megatron-DeepSpeed's list is the one a 16-bit run builds (its trailing ``float16_to_fp32``
    layer; an fp32 run has one function layer fewer, which can move a ``uniform`` boundary).
    """
    kind = traits(framework).pipeline_module
    if kind == "gpt_model_pipe":
        return gpt_model_pipe_layers(gpt_pipe_shape(model, tp))
    return workload_layers(
        model.num_layers, model.hidden_size, model.ffn_hidden_size, model.vocab_size,
        model.seq_length,
    )  # fmt: skip
