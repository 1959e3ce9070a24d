"""torchtitan's option table: the knobs ``tune`` searches, spelled as the pinned release reads.

Release: ``torchtitan 0.3.0`` (PyPI; ``tuner.spec.frameworks.TORCHTITAN_RELEASE``). Its trainer is
``python -m torchtitan.train --module M --config F`` followed by ``--section.option value``
overrides that tyro parses onto the ``Trainer.Config`` the config function returns
(``torchtitan/config/manager.py`` ``ConfigManager.parse_args``). The command-line surface of that
release is frozen (``torchtitan/config/configs.py`` module docstring), so these names hold for it;
a later release renames some (``local_batch_size`` / ``seq_len`` become per-microbatch token
counts there), which is why one release is pinned.

Where each option lives in 0.3.0:

- ``TrainingConfig`` (``config/configs.py``): ``local_batch_size`` (8), ``global_batch_size`` (-1:
  local x DP), ``seq_len`` (2048), ``steps``, ``mixed_precision_param`` (bfloat16 / float32),
  ``gc_freq`` (50).
- ``ParallelismConfig`` (same file): ``data_parallel_replicate_degree`` (1),
  ``data_parallel_shard_degree`` (-1: the rest), ``fsdp_reshard_after_forward``
  (default / always / never), ``tensor_parallel_degree``, ``enable_sequence_parallel`` (True),
  ``pipeline_parallel_degree``, ``pipeline_parallel_schedule`` ("1F1B"),
  ``pipeline_parallel_microbatch_size`` (1), ``context_parallel_degree``.
- ``CompileConfig``: ``enable``, ``enable_async_tensor_parallel`` (needs ``enable`` and "model" in
  ``components``).
- ``MetricsProcessor.Config`` (``components/metrics.py``): ``log_freq`` (10),
  ``disable_color_printing``.
- ``Trainer.Config.activation_checkpoint`` (``distributed/activation_checkpoint.py``): a tyro
  subcommand, ``selective`` (per-op SAC, **the default**), ``full``, ``memory-budget`` or ``none``.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

PPSchedule = Literal["1F1B", "GPipe", "Interleaved1F1B"]
PP_SCHEDULES: tuple[PPSchedule, ...] = get_args(PPSchedule)
"""The pipeline schedules ``tune`` models (``torch.distributed.pipelining.schedules``
``get_schedule_class`` names). 1F1B and GPipe are single-stage schedules (one stage per rank);
Interleaved1F1B is looped, and without ``pipeline_parallel_layers_per_stage`` torchtitan gives it
two stages per rank (``distributed/pipeline_parallel.py``)."""

LOOPED: frozenset[str] = frozenset({"Interleaved1F1B"})
"""Schedules with more than one stage per rank (``PipelineScheduleMulti`` subclasses)."""

Reshard = Literal["default", "always", "never"]
RESHARD_POLICIES: tuple[Reshard, ...] = get_args(Reshard)
"""``parallelism.fsdp_reshard_after_forward``; ``default`` reshards unless PP is on
(``distributed/fsdp.py`` ``get_fsdp_reshard_after_forward_policy``)."""

KNOBS: tuple[str, ...] = (
    "dp_shard",
    "dp_replicate",
    "pp_schedule",
    "reshard_after_forward",
    "compile",
)
"""torchtitan's own knobs, which no other framework's launch reads."""


def not_torchtitan(framework: str) -> str:
    """Why one of :data:`KNOBS` is refused in a study of another ``framework`` (its space or
    ``--set``)."""
    return f"is a torchtitan knob; this study's framework is {framework}"


AC_MODES: dict[str, str] = {"none": "none", "full": "full", "selective": "selective"}
"""tune's ``recompute`` -> the ``activation_checkpoint`` subcommand: ``selective`` is
torchtitan's per-op SAC (saves matmul, attention and reduction outputs except every second
matmul), not Megatron's attention-core recompute."""

MODULE = "llama3"
"""The ``--module`` the template selects unless the study's ``launch.script_args`` say other."""

PREFIX = "--"


def stages_per_rank(schedule: str) -> int:
    """Stages each pipeline rank holds under ``schedule`` when no layers-per-stage is given."""
    return 2 if schedule in LOOPED else 1


def reshards_after_forward(policy: str, pp: int) -> bool:
    """torchtitan 0.3.0 ``get_fsdp_reshard_after_forward_policy``: ``default`` is True without PP
    and False with it (so each micro-batch does not all-gather the stage again)."""
    if policy == "always":
        return True
    if policy == "never":
        return False
    return pp == 1


def local_batch(global_batch: int, micro_batch: int, dp: int, pp: int) -> int:
    """``training.local_batch_size`` for a config: with PP the whole per-DP-rank batch, split into
    ``pipeline_parallel_microbatch_size`` micro-batches by the schedule (one flush per step);
    without PP one micro-batch per gradient-accumulation step."""
    return global_batch // dp if pp > 1 else micro_batch


FsdpKnobs = tuple[int, int, str, str, bool]
"""(dp_shard, dp_replicate, pp_schedule, reshard_after_forward, compile): one combination of a
torchtitan study's own lists."""
FSDP_DEFAULT: FsdpKnobs = (-1, 1, "1F1B", "default", False)


def config_fields(
    knobs: FsdpKnobs | None, world: int, tp: int, pp: int, cp: int, vp: int, first: str
) -> tuple[int, int, dict[str, Any] | None]:
    """(dp, vp, torchtitan's ParallelConfig fields) of one combination; fields None: a repeat.

    torchtitan: dp = dp_shard x dp_replicate, dp_shard -1 taking the ranks left (ParallelDims
    ``_validate``; a product that misses the world is judged by the rules); vp follows the
    schedule (two stages per rank for a looped one); at pp=1 no schedule runs."""
    if knobs is None:
        return max(world // (tp * pp * cp), 1), vp, {}
    shard, replicate, schedule, reshard, compiled = knobs
    if pp == 1 and schedule != first:
        return 0, 0, None
    if shard == -1:
        shard = max(world // (replicate * tp * pp * cp), 1)
    fields: dict[str, Any] = {
        "dp_replicate": replicate, "reshard_after_forward": reshard, "compile": compiled,
        "pp_schedule": schedule if pp > 1 else None,
    }  # fmt: skip
    return shard * replicate, stages_per_rank(schedule) if pp > 1 else 1, fields


def stage_layer_counts(num_layers: int, stages: int) -> tuple[int, ...]:
    """Transformer layers per pipeline stage by torchtitan 0.3.0's default split
    (``distributed/pipeline_parallel.py`` ``_generate_llm_fqn_per_model_part`` with
    ``pipeline_parallel_first_stage_less_layers`` and ``..._last_stage_less_layers`` at 1): the
    embedding and the norm + output weigh one layer each, the ``L + 2`` effective layers are
    dealt out evenly with the remainder to the first stages. Callers check ``stages <= L + 2``."""
    if stages == 1:
        return (num_layers,)
    effective = num_layers + 2
    per, extra = divmod(effective, stages)
    out, left = [], num_layers
    for i in range(stages):
        share = per + (1 if i < extra else 0) - (1 if i in (0, stages - 1) else 0)
        take = min(max(share, 0), left)
        out.append(take)
        left -= take
    return tuple(out)


def rank_chunks(num_layers: int, pp: int, vp: int) -> tuple[tuple[int, ...], ...]:
    """Layers per pipeline rank and stage (``[rank][chunk]``): stage ``s`` of ``pp x vp`` runs
    on rank ``s % pp`` (the looped placement of ``Interleaved1F1B``)."""
    counts = stage_layer_counts(num_layers, pp * vp)
    return tuple(tuple(counts[r + k * pp] for k in range(vp)) for r in range(pp))
