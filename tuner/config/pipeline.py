"""Pipeline stages: which transformer layers each stage holds, and what its schedule keeps alive.

One definition used by the memory model, the time model, the validity rules and the templates.
The layer arithmetic itself is :mod:`tuner.spec.pipeline_split` (the frameworks' rules, over ints).

Schedules (what a rank holds at its activation peak):

- Megatron-LM 1F1B (``megatron/core/pipeline_parallel/schedules.py``
  ``forward_backward_pipelining_without_interleaving``) and DeepSpeed ``TrainSchedule``
  (``deepspeed/runtime/pipe/schedule.py``): stage i runs ``p - i - 1`` warm-up forwards, then
  one forward before each backward, so it holds ``min(p - i, m)`` micro-batches.
- Megatron-LM interleaved 1F1B (``forward_backward_pipelining_with_interleaving``,
  ``get_pp_rank_microbatches``): rank r runs ``W = (p - r - 1) * 2 + (v - 1) * g`` warm-up
  chunk-forwards (g = ``microbatch_group_size_per_vp_stage``, default p), capped at ``m v``; in
  steady state one forward precedes each backward, so ``min(W + 1, m v)`` chunk micro-batches
  are alive, each of one model chunk's layers. Which chunks they are follows the schedule table
  (``get_schedule_table``): forwards walk groups of g micro-batches chunk by chunk, backwards the
  same table with the chunk order reversed.
"""

from __future__ import annotations

import functools

from tuner.config.parallel import ParallelConfig
from tuner.config.pipe_layers import pipe_layers
from tuner.errors import SplitError, ValidationError
from tuner.spec.deepspeed_partition import deepspeed_stages
from tuner.spec.frameworks import traits
from tuner.spec.pipeline_split import (
    DEEPSPEED_DEFAULT_METHOD,
    Chunks,
    megatron_chunks,
    parse_split,
)
from tuner.spec.study import Framework, ModelSpec
from tuner.spec.torchtitan import rank_chunks


def deepspeed_method(config: ParallelConfig, framework: Framework = "deepspeed") -> str:
    """The ``partition_method`` the framework's ``PipelineModule`` gets (``even``: its own
    default, ``tuner.spec.frameworks``)."""
    s = parse_split(config.pipeline_split)
    if s.kind == "deepspeed":
        return str(s.method)
    return traits(framework).default_partition or DEEPSPEED_DEFAULT_METHOD


def _deepspeed(
    model: ModelSpec, config: ParallelConfig, framework: Framework
) -> tuple[tuple[int, bool, bool], ...]:
    layers = pipe_layers(model, framework, config.tp)
    return deepspeed_stages(deepspeed_method(config, framework), layers, config.pp)


def chunk_layers(model: ModelSpec, config: ParallelConfig, framework: Framework) -> Chunks:
    """Transformer layers per pipeline rank and model chunk (``[rank][chunk]``, vp chunks).

    Raises :class:`ValidationError` with the framework's message for a split it refuses (the
    validity rules of ``tuner.config.parallel`` report the same message first).
    """
    key = (model, framework, config.pp, config.vp, config.pipeline_split, config.tp)
    chunks = _CHUNKS.get(key)
    if chunks is None:
        chunks = chunk_layers_uncached(model, config, framework)
        if len(_CHUNKS) >= MAX_CACHED_SPLITS:
            _CHUNKS.clear()
        _CHUNKS[key] = chunks
    return chunks


MAX_CACHED_SPLITS = 4096
"""Splits :func:`chunk_layers` keeps; a space has one per (pp, vp, split, tp) at most, so a few
dozen: the cap only bounds a process that walks many studies."""
_CHUNKS: dict[tuple[ModelSpec, Framework, int, int, str, int], Chunks] = {}


def chunk_layers_uncached(
    model: ModelSpec, config: ParallelConfig, framework: Framework
) -> Chunks:
    """:func:`chunk_layers` computed afresh. It reads only pp, vp, the split and (DeepSpeed's
    layer list) tp of ``config``, which is what :func:`chunk_layers` keys its cache on (the
    configs of a space share a few splits, and the memory and time models ask per stage);
    tests/test_space_fast.py holds the two equal over whole spaces."""
    if traits(framework).fsdp2:  # torchtitan's own split (tuner.spec.torchtitan)
        if config.pp * config.vp > model.num_layers + 2:
            raise ValidationError(
                f"Number of stages ({config.pp * config.vp}) cannot be greater than effective "
                f"layers ({model.num_layers + 2})"
            )
        return rank_chunks(model.num_layers, config.pp, config.vp)
    try:
        if traits(framework).deepspeed_pipeline:
            return tuple((blocks,) for blocks, _, _ in _deepspeed(model, config, framework))
        return megatron_chunks(model.num_layers, config.pp, config.vp, config.pipeline_split)
    except SplitError as e:
        raise ValidationError(e.message) from None


def stage_layers(
    model: ModelSpec, config: ParallelConfig, framework: Framework
) -> tuple[int, ...]:
    """Transformer layers on each pipeline stage, first to last (``len == config.pp``); kept
    on :func:`chunk_layers`' key (its sums: asked per stage and config by both models)."""
    key = (model, framework, config.pp, config.vp, config.pipeline_split, config.tp)
    layers = _STAGES.get(key)
    if layers is None:
        layers = tuple(sum(chunks) for chunks in chunk_layers(model, config, framework))
        if len(_STAGES) >= MAX_CACHED_SPLITS:
            _STAGES.clear()
        _STAGES[key] = layers
    return layers


_STAGES: dict[tuple[ModelSpec, Framework, int, int, str, int], tuple[int, ...]] = {}


def stage_holds(
    model: ModelSpec, config: ParallelConfig, framework: Framework
) -> tuple[tuple[bool, bool], ...]:
    """Per stage: (holds the embedding, holds the output layer and loss).

    Megatron-LM builds the embedding on the first and the output layer on the last pp rank
    (``GPTModel`` pre_process / post_process). DeepSpeed's partition may leave the embedding
    alone on stage 0, but it is always the first layer and the head the last one (in
    Megatron-DeepSpeed's ``GPTModelPipe`` the tied EmbeddingPipe that computes the logits,
    after the final norm).
    """
    if traits(framework).deepspeed_pipeline and config.pp > 1:
        return tuple((emb, head) for _, emb, head in _deepspeed(model, config, framework))
    p = config.pp
    return tuple((stage == 0, stage == p - 1) for stage in range(p))


def warmup_microbatches(config: ParallelConfig, stage: int) -> int:
    """Forward passes (of one model chunk) rank ``stage`` runs before its first backward."""
    p, v, m = config.pp, max(config.vp, 1), max(config.num_microbatches, 1)
    if p == 1:
        return 0
    if v == 1:
        return min(p - stage - 1, m)
    return min((p - stage - 1) * 2 + (v - 1) * p, m * v)


def in_flight(config: ParallelConfig, stage: int) -> float:
    """Micro-batches of the stage's layers whose activations ``stage`` holds at its peak.

    1F1B: ``min(p - i, m)``. Interleaved: ``min(W + 1, m v)`` chunk micro-batches of ``1/v`` of
    the rank's layers each (equal chunks; :func:`held_layer_microbatches` weighs unequal ones).
    """
    if config.pp == 1:
        return 1.0
    v, m = max(config.vp, 1), max(config.num_microbatches, 1)
    if config.pp_schedule == "GPipe":  # all forwards before any backward: every micro-batch
        return float(m)
    return min(warmup_microbatches(config, stage) + 1, m * v) / v


def schedule_table(config: ParallelConfig) -> list[tuple[int, int]]:
    """Megatron's interleaved order of (micro-batch, model chunk) forwards (group size p)."""
    m, v = max(config.num_microbatches, 1), max(config.vp, 1)
    return list(_schedule_table(m, v, config.pp))


@functools.lru_cache(maxsize=1 << 10)
def _schedule_table(m: int, v: int, g: int) -> tuple[tuple[int, int], ...]:
    table: list[tuple[int, int]] = []
    for start in range(0, m, g):
        stop = m if start + g >= m else start + g
        table += [(mb, chunk) for chunk in range(v) for mb in range(start, stop)]
    return tuple(table)


def in_flight_chunks(config: ParallelConfig, stage: int, weights: tuple[int, ...]) -> list[int]:
    """Micro-batches held per model chunk when ``sum(held[c] * weights[c])`` is largest.

    Walks the rank's schedule: forwards in table order; after the warm-up, each forward is
    followed by the backward of the oldest one (chunk order reversed, as Megatron's
    ``get_model_chunk_id(forward=False)`` does).
    """
    v = max(config.vp, 1)
    if config.pp == 1:
        return [1] * v
    warm = warmup_microbatches(config, stage)
    m = max(config.num_microbatches, 1) if v > 1 else config.num_microbatches
    return list(_held_chunks(m, v, config.pp, warm, weights))


@functools.lru_cache(maxsize=1 << 14)
def _held_chunks(m: int, v: int, pp: int, warm: int, weights: tuple[int, ...]) -> tuple[int, ...]:
    """:func:`in_flight_chunks` over plain ints, cached: many configs of a space share a
    schedule (it depends on pp, vp, the micro-batch count and the stage's chunk sizes only)."""
    table = _schedule_table(m, v, pp) if v > 1 else tuple((mb, 0) for mb in range(m))
    total = len(table)
    held, best, best_load = [0] * v, [0] * v, -1
    load = 0  # sum(h * w for h, w in zip(held, weights)), kept as held changes (whole numbers)
    for k in range(total):
        chunk = table[k][1]
        held[chunk] += 1
        load += weights[chunk]
        if k < warm:
            continue
        if load > best_load:
            best, best_load = list(held), load
        back = v - 1 - table[k - warm][1]
        held[back] -= 1
        load -= weights[back]
    if best_load < 0:  # every micro-batch in warm-up: all held at once
        best = list(held)
    return tuple(best)


def held_layer_microbatches(
    model: ModelSpec, config: ParallelConfig, framework: Framework, stage: int
) -> float:
    """Layer x micro-batch activations ``stage`` holds at its peak (chunks weighed by layers)."""
    chunks = chunk_layers(model, config, framework)[stage]
    if config.pp == 1:
        return float(sum(chunks))
    if len(chunks) == 1:
        return in_flight(config, stage) * chunks[0]
    held = in_flight_chunks(config, stage, chunks)
    return float(sum(h * n for h, n in zip(held, chunks, strict=True)))


def pipe_buffers(config: ParallelConfig, stage: int, framework: Framework) -> int:
    """Stage-boundary tensors (input and output activation pairs) ``stage`` keeps allocated.

    DeepSpeed ``TrainSchedule.num_pipe_buffers``: ``max(2, min(p - i, m))``, so the last stage
    keeps two although one micro-batch is in flight. Megatron keeps one input/output pair per
    in-flight chunk micro-batch (``input_tensors`` / ``output_tensors``), freed at its backward.
    """
    if config.pp == 1:
        return 0
    m = max(config.num_microbatches, 1)
    if traits(framework).deepspeed_pipeline:
        return max(2, min(config.pp - stage, m))
    v = max(config.vp, 1)
    return min(warmup_microbatches(config, stage) + 1, m * v)
