"""torchtitan's own validity rules over a :class:`~tuner.config.parallel.ParallelConfig`.

Each rule is a check the pinned release (``tuner.spec.frameworks.TORCHTITAN_RELEASE``) makes at
start-up, with its message and the numbers that broke it; sources are files of that release:

- ``distributed/parallel_dims.py`` ``ParallelDims._validate``: degrees >= 1 (dp_shard -1 takes
  the rest) and ``dp_replicate * dp_shard * cp * tp * pp == WORLD_SIZE``.
- ``models/common/decoder.py``: TP must divide n_heads and n_kv_heads.
- ``trainer.py`` ``Trainer.__init__``: seq_len divisible by tp (with SP) x 2 cp (with CP); the
  global batch a multiple of local batch x DP degree; ``Trainer.Config.__post_init__``:
  local_batch_size divisible by pipeline_parallel_microbatch_size under PP.
- ``distributed/pipeline_parallel.py`` ``_generate_llm_fqn_per_model_part``: every stage gets
  at least one layer once the embedding and the output count as one layer each.
- ``config/configs.py`` ``CompileConfig.__post_init__``: async TP needs compile.
"""

from __future__ import annotations

from tuner.config.parallel import ParallelConfig
from tuner.spec.model import ModelSpec
from tuner.spec.torchtitan import PP_SCHEDULES, RESHARD_POLICIES, local_batch

Violation = tuple[str, str]


def _sizes(c: ParallelConfig, world: int) -> list[Violation]:
    for name in ("tp", "pp", "cp", "dp_replicate", "micro_batch_size", "global_batch_size"):
        if getattr(c, name) < 1:
            return [("positive", "Parallelism degree should be >= 1, except for dp_shard")]
    r, s = c.dp_replicate, c.dp_shard
    if c.dp % r or r * s * c.cp * c.tp * c.pp != world:
        return [(
            "world_divisible",
            f"Invalid parallel dims: dp_replicate({r}) * dp_shard({c.dp // r if r else 0}) * "
            f"cp({c.cp}) * tp({c.tp}) * pp({c.pp}) != WORLD_SIZE({world})",
        )]  # fmt: skip
    return []


def _model(c: ParallelConfig, m: ModelSpec) -> list[Violation]:
    out: list[Violation] = []
    if c.tp > 1 and m.num_attention_heads % c.tp:
        out.append((
            "heads_tp",
            f"tensor_parallel_degree ({c.tp}) must divide n_heads ({m.num_attention_heads}).",
        ))  # fmt: skip
    if c.tp > 1 and m.query_groups % c.tp:
        out.append((
            "query_groups_tp",
            f"tensor_parallel_degree ({c.tp}) must divide n_kv_heads ({m.query_groups}).",
        ))  # fmt: skip
    divisor = (c.tp if c.sequence_parallel else 1) * (2 * c.cp if c.cp > 1 else 1)
    if m.seq_length % divisor:
        out.append((
            "seq_divisible",
            f"Training sequence length ({m.seq_length}) must be divisible by {divisor} for the "
            "configured sequence/context parallelism.",
        ))  # fmt: skip
    return out


def _batch(c: ParallelConfig) -> list[Violation]:
    local = local_batch(c.global_batch_size, c.micro_batch_size, c.dp, c.pp)
    if local < 1 or c.global_batch_size % (local * c.dp):
        return [(
            "global_batch",
            f"global batch size must be multiple of local batch size times data-parallel degree "
            f"({c.global_batch_size} % ({local} * {c.dp}) != 0)",
        )]  # fmt: skip
    if c.pp > 1 and local % c.micro_batch_size:
        return [(
            "pp_microbatch",
            f"training.local_batch_size ({local}) must be evenly divisible by "
            f"parallelism.pipeline_parallel_microbatch_size ({c.micro_batch_size}) when "
            "pipeline parallelism is enabled.",
        )]  # fmt: skip
    return []


def _pipeline(c: ParallelConfig, m: ModelSpec) -> list[Violation]:
    if c.pp == 1:
        return []
    if c.pp_schedule not in PP_SCHEDULES:
        return [("pp_schedule", f"pipeline schedule {c.pp_schedule!r}: one of {PP_SCHEDULES}")]
    stages = c.pp * c.vp
    effective = m.num_layers + 2  # the embedding and the norm + output weigh one layer each
    if stages > effective:
        return [(
            "layers_pp",
            f"Number of stages ({stages}) cannot be greater than effective layers ({effective})",
        )]  # fmt: skip
    if m.tied_embeddings:
        return [("tied_pp", "Weight tying is not supported with Pipeline Parallel.")]
    return []


def _knobs(c: ParallelConfig) -> list[Violation]:
    out: list[Violation] = []
    if c.reshard_after_forward not in RESHARD_POLICIES:
        out.append((
            "reshard",
            f"Invalid reshard_after_forward_policy: {c.reshard_after_forward}.",
        ))  # fmt: skip
    if c.tp_comm_overlap and not c.compile:
        out.append((
            "async_tp_compile",
            "Async TP requires 'model' in --compile.components and --compile.enable",
        ))  # fmt: skip
    if c.tp_comm_overlap and c.tp == 1:
        out.append(("async_tp_tp", "async TP overlaps TP collectives: it needs tp > 1"))
    if c.recompute == "full" and (c.recompute_method, c.recompute_num_layers) not in (
        ("uniform", 1), (None, None),
    ):  # fmt: skip
        out.append((
            "ac_full_every_block",
            "torchtitan's full activation checkpointing wraps every transformer block: "
            "use recompute_method uniform with recompute_num_layers 1",
        ))  # fmt: skip
    if c.recompute_modules is not None:
        out.append((
            "ac_modules",
            "torchtitan's selective activation checkpointing is per-op (its SelectiveAC "
            "policy); Megatron's recompute modules do not apply",
        ))  # fmt: skip
    if c.zero_stage or c.distributed_optimizer or c.ep > 1:
        out.append((
            "torchtitan_knobs",
            "zero_stage, distributed_optimizer and ep are not torchtitan settings (FSDP2 shards "
            "over dp_shard)",
        ))  # fmt: skip
    return out


def torchtitan_violations(c: ParallelConfig, m: ModelSpec, world: int) -> list[tuple[str, str]]:
    """Every torchtitan rule ``c`` breaks for ``m`` on ``world`` ranks, as (rule, message)."""
    out = _sizes(c, world)
    if out and out[0][0] == "positive":
        return out
    return out + _model(c, m) + _batch(c) + _pipeline(c, m) + _knobs(c)
