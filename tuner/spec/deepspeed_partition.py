"""How DeepSpeed's ``PipelineModule`` partitions a layer list over pipeline stages.

``deepspeed/runtime/pipe/module.py`` ``_partition_layers`` with ``partition_method`` ``uniform``
(``deepspeed/runtime/utils.py`` ``partition_uniform``), ``parameters`` or ``type:REGEX``
(``partition_balanced`` over parameter counts or over 0/1 matches of the layer class names), and
the layer lists it partitions: the repo workload's (``workloads/gpt_deepspeed.py``) and
Megatron-DeepSpeed's ``GPTModelPipe``. Pure arithmetic over integers; which method a
``pipeline_split`` value names is :mod:`tuner.spec.pipeline_split`'s.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

from tuner.errors import SplitError

DEEPSPEED_LAYER_NAMES = ("Embedding", "Block", "Head")
"""The workload's ``PipelineModule`` layer classes: embedding, ``num_layers`` blocks, head."""


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Stage boundaries, as ``deepspeed/runtime/utils.py`` ``partition_uniform`` returns them:
    ``num_items // num_parts`` each, the first ``num_items % num_parts`` parts one more."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    size, extra = divmod(num_items, num_parts)
    return [p * size + min(p, extra) for p in range(num_parts + 1)]


@functools.lru_cache(maxsize=256)
def partition_balanced(weights: tuple[int, ...], num_parts: int) -> tuple[int, ...]:
    """Stage boundaries as ``deepspeed/runtime/utils.py`` ``partition_balanced`` finds them.

    Its dynamic programme minimises the spread (largest minus smallest part weight), not the
    largest part; among equal spreads the last split point tried wins, and unreachable states
    carry infinities that compare equal. All of that decides the result, so it is kept.
    """
    n, m = len(weights), num_parts
    if n <= m:
        return tuple(partition_uniform(n, m))
    inf = float("inf")
    prefix = [0.0] * (n + 1)
    for i, w in enumerate(weights):
        prefix[i + 1] = prefix[i] + float(w)
    hi = [[inf] * (m + 1) for _ in range(n + 1)]
    lo = [[inf] * (m + 1) for _ in range(n + 1)]
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    pos = [[0] * (m + 1) for _ in range(n + 1)]
    hi[0][0] = cost[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                top, bottom = max(hi[k][j - 1], part), min(lo[k][j - 1], part)
                spread = top - bottom
                if cost[i][j] >= spread:
                    cost[i][j], hi[i][j], lo[i][j], pos[i][j] = spread, top, bottom, k
    bounds = [n]
    for j in range(m, 0, -1):
        bounds.append(pos[bounds[-1]][j])
    return tuple(reversed(bounds))


def deepspeed_layer_params(
    num_layers: int, hidden: int, ffn: int, vocab: int, seq: int
) -> tuple[int, ...]:
    """Trainable parameters of each ``PipelineModule`` layer the repo's workload builds
    (``workloads/gpt_deepspeed.py``: Embedding, ``num_layers`` x Block, Head), as
    ``PipelineModule._count_layer_params`` counts them."""
    h, f = hidden, ffn
    embedding = vocab * h + seq * h  # token + learned position embeddings
    # LayerNorm x2 (2h each), qkv (3h^2 + 3h), proj (h^2 + h), fc1 (hf + f), fc2 (fh + h)
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    head = 2 * h + h * vocab  # final LayerNorm and the bias-free output projection
    return (embedding,) + (block,) * num_layers + (head,)


LayerRole = Literal["embedding", "block", "norm", "head", "other"]


@dataclass(frozen=True, slots=True)
class PipeLayer:
    """One entry of a ``PipelineModule``'s layer list."""

    name: str
    """The class (or function) name ``type:REGEX`` is matched against (re.search, no case)."""
    params: int
    """Trainable parameters on one rank, as ``PipelineModule._count_layer_params`` counts."""
    role: LayerRole


def workload_layers(
    num_layers: int, hidden: int, ffn: int, vocab: int, seq: int
) -> tuple[PipeLayer, ...]:
    """The repo workload's layer list: Embedding, ``num_layers`` x Block, Head."""
    params = deepspeed_layer_params(num_layers, hidden, ffn, vocab, seq)
    first, block, head = DEEPSPEED_LAYER_NAMES
    roles: tuple[tuple[str, LayerRole], ...] = (
        ((first, "embedding"),) + ((block, "block"),) * num_layers + ((head, "head"),)
    )
    return tuple(PipeLayer(n, p, r) for (n, r), p in zip(roles, params, strict=True))


@dataclass(frozen=True, slots=True)
class GPTPipeShape:
    """What sets the sizes of Megatron-DeepSpeed's ``GPTModelPipe`` layers on one TP rank."""

    num_layers: int
    block: int  # one ParallelTransformerLayer's parameters on a TP rank
    embedding: int  # EmbeddingPipe: word embeddings (padded vocab / tp) + learned positions
    norm: int  # the final LayerNorm (2h) or RMSNorm (h)
    output: int  # LMHeadPipe (padded vocab / tp x h) when untied
    tied: bool  # the last stage holds a second EmbeddingPipe (TiedLayerSpec 'embed')
    rmsnorm: bool
    half: bool  # fp16/bf16: a trailing float16_to_fp32 function layer


def gpt_model_pipe_layers(shape: GPTPipeShape) -> tuple[PipeLayer, ...]:
    """``GPTModelPipe.specs`` (microsoft/Megatron-DeepSpeed megatron/model/gpt_model.py, dense
    model): the ``_to_float16`` function, EmbeddingPipe (a TiedLayerSpec when tied), one
    ParallelTransformerLayerPipe per layer, the final norm (``MixedFusedLayerNorm`` on CUDA,
    megatron/model/__init__.py, or ``MixedFusedRMSNorm``), then the tied EmbeddingPipe again
    (it computes the logits) or LMHeadPipe, then ``float16_to_fp32`` in 16-bit runs. Function
    layers have no parameters; a TiedLayerSpec is counted on each stage that builds it."""
    norm = "MixedFusedRMSNorm" if shape.rmsnorm else "MixedFusedLayerNorm"
    layers = [PipeLayer("_to_float16", 0, "other"), PipeLayer("EmbeddingPipe", shape.embedding,
              "embedding")]  # fmt: skip
    layers += [PipeLayer("ParallelTransformerLayerPipe", shape.block, "block")] * shape.num_layers
    layers.append(PipeLayer(norm, shape.norm, "norm"))
    if shape.tied:
        layers.append(PipeLayer("EmbeddingPipe", shape.embedding, "head"))
    else:
        layers.append(PipeLayer("LMHeadPipe", shape.output, "head"))
    if shape.half:
        layers.append(PipeLayer("float16_to_fp32", 0, "other"))
    return tuple(layers)


def deepspeed_bounds(method: str, layers: tuple[PipeLayer, ...], pp: int) -> tuple[int, ...]:
    """``PipelineModule._partition_layers``: stage boundaries over the layer list."""
    method = method.lower()
    if method == "uniform":
        return tuple(partition_uniform(len(layers), pp))
    if method == "parameters":
        return partition_balanced(tuple(layer.params for layer in layers), pp)
    if method.startswith("type:"):
        # _find_layer_type: re.search(pattern, class name, IGNORECASE)
        pattern = re.compile(method.split(":")[1], re.IGNORECASE)
        binary = tuple(int(bool(pattern.search(layer.name))) for layer in layers)
        if not any(binary):
            raise SplitError(
                "split_type",
                f"Partitioning '{method.split(':')[1]}' found no valid layers to partition.",
            )
        return partition_balanced(binary, pp)
    raise SplitError("split_method", f"Partitioning method {method} not implemented.")


def deepspeed_stages(
    method: str, layers: tuple[PipeLayer, ...], pp: int
) -> tuple[tuple[int, bool, bool], ...]:
    """Per stage: (transformer blocks, holds the embedding, holds the head); a stage with no
    layer at all is refused (its optimizer would get an empty parameter list)."""
    bounds = deepspeed_bounds(method, layers, pp)
    out = []
    for stage in range(pp):
        start, stop = bounds[stage], bounds[stage + 1]
        if stop <= start:
            raise SplitError(
                "split_empty_stage",
                f"partition_method {method} leaves pipeline stage {stage} of {pp} without any "
                f"layer (boundaries {list(bounds)})",
            )
        roles = [layer.role for layer in layers[start:stop]]
        out.append((roles.count("block"), "embedding" in roles, "head" in roles))
    return tuple(out)
