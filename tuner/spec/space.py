"""The ``space`` section of a study: the knobs to search, a list of values each or ``auto``
(:mod:`tuner.spec.study` holds the whole study)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from tuner.errors import ConfigError
from tuner.spec.bounds import _ENV_NAME as _ENV_NAME
from tuner.spec.bounds import (
    MAX_BATCH,
    _size,
)
from tuner.spec.bounds import MAX_FILE_BYTES as MAX_FILE_BYTES
from tuner.spec.cluster import ClusterSpec as ClusterSpec
from tuner.spec.cluster import SlurmSpec as SlurmSpec
from tuner.spec.cluster import SSHSpec as SSHSpec
from tuner.spec.frameworks import Framework as Framework
from tuner.spec.model import ModelSpec as ModelSpec
from tuner.spec.model import Precision as Precision
from tuner.spec.model import TrainingSpec as TrainingSpec
from tuner.spec.moe import TokenDispatcher
from tuner.spec.pipeline_split import parse_split
from tuner.spec.recompute import parse_recompute, recompute_text
from tuner.spec.torchtitan import PPSchedule, Reshard

KNOB_ALIASES = {
    "sp": "sequence_parallel",
    "mbs": "micro_batch_size",
    "micro_batch": "micro_batch_size",
    "distopt": "distributed_optimizer",
    "dist_opt": "distributed_optimizer",
    "zero": "zero_stage",
    "recompute_granularity": "recompute",
    "split": "pipeline_split",
    "dispatcher": "moe_token_dispatcher",
    "tpo": "tp_comm_overlap",
}
"""The short names of the space's knobs: ``--set mbs=2`` and the config spelling's words. A
space in a file spells each knob in full (``micro_batch_size``); an alias there is refused
naming the field it stands for."""

RecomputeGranularity = Literal["none", "selective", "full"]
RecomputeMethod = Literal["uniform", "block"]
Auto = Literal["auto"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SpaceSpec:
    """The knobs to search: a list of values each, or ``auto``. DP follows from the world size."""

    tp: tuple[int, ...] | Auto = (1,)
    """Tensor parallel sizes; auto: powers of two up to gpus_per_node dividing the heads."""
    pp: tuple[int, ...] | Auto = (1,)
    """Pipeline parallel sizes; auto: divisors of num_layers that fit the world size."""
    cp: tuple[int, ...] | Auto = (1,)
    """Context parallel sizes; auto: powers of two up to 8 that divide seq_length / 2."""
    vp: tuple[int, ...] | Auto = (1,)
    """Virtual pipeline chunks per rank (interleaved 1F1B); auto: 1, 2, 3, 4."""
    micro_batch_size: tuple[int, ...] | Auto = (1,)
    """Micro-batch sizes; auto: powers of two up to 16 that divide the global batch."""
    sequence_parallel: tuple[bool, ...] = (False,)
    """Megatron sequence parallelism (only meaningful with tp > 1)."""
    recompute: tuple[str, ...] = ("none",)
    """Activation recomputation: none, selective (the attention core), ``selective:MOD+MOD``
    (Megatron ``--recompute-modules``: core_attn, moe_act, layernorm, mlp, moe,
    shared_experts; ``tuner.spec.recompute``) or full (with ``recompute_method`` /
    ``recompute_num_layers``)."""
    recompute_method: tuple[RecomputeMethod, ...] = ("uniform",)
    """For full recompute: uniform or block."""
    recompute_num_layers: tuple[int, ...] | Auto = (1,)
    """For full recompute: layers per chunk (uniform) or per stage (block)."""
    distributed_optimizer: tuple[bool, ...] = (False,)
    """Megatron ``--use-distributed-optimizer`` (ZeRO-1-style sharding over DP)."""
    tp_comm_overlap: tuple[bool, ...] = (False,)
    """Megatron ``--tp-comm-overlap`` (TE userbuffers; only with sequence parallelism)."""
    zero_stage: tuple[int, ...] = (0,)
    """DeepSpeed ZeRO stage, 0-3."""
    ep: tuple[int, ...] | Auto = (1,)
    """Expert parallel sizes (``--expert-model-parallel-size``; MoE models); auto: powers of two
    dividing num_experts."""
    etp: tuple[int, ...] | None = None
    """Expert tensor parallel sizes (``--expert-tensor-parallel-size``); None: equal to tp."""
    moe_token_dispatcher: tuple[TokenDispatcher, ...] = ("alltoall",)
    """MoE token dispatchers (``--moe-token-dispatcher-type``): alltoall, allgather, flex."""
    pipeline_split: tuple[str, ...] | Auto = ("even",)
    """How layers go to pipeline stages (used at pp > 1): ``even``; Megatron ``first=N,last=N``
    (or one of them), ``embedding``, ``loss``, ``embedding+loss``, ``layout:STRING``; DeepSpeed
    ``uniform``, ``parameters``, ``type:REGEX``; auto: the framework-accepted first/last counts
    near ``num_layers / pp`` (docs/guides/frameworks.md, "Uneven pipeline splits")."""
    dp_shard: tuple[int, ...] = (-1,)
    """torchtitan: FSDP2 degrees (``data_parallel_shard_degree``); -1: the ranks left after
    dp_replicate, tp, pp and cp."""
    dp_replicate: tuple[int, ...] = (1,)
    """torchtitan: HSDP replica counts (``data_parallel_replicate_degree``)."""
    pp_schedule: tuple[PPSchedule, ...] = ("1F1B",)
    """torchtitan: pipeline schedules at pp > 1 (1F1B, GPipe, Interleaved1F1B)."""
    reshard_after_forward: tuple[Reshard, ...] = ("default",)
    """torchtitan: ``fsdp_reshard_after_forward`` policies (default, always, never)."""
    compile: tuple[bool, ...] = (False,)
    """torchtitan: ``torch.compile`` off / on."""

    def __post_init__(self) -> None:
        recompute = [_recompute_entry(text, i) for i, text in enumerate(self.recompute)]
        if len(set(recompute)) != len(recompute):
            i = next(i for i, t in enumerate(recompute) if t in recompute[:i])
            raise ConfigError(f"{self.recompute[i]!r} is listed twice", path=f"recompute[{i}]")
        seen_splits: set[str] = set()
        splits = () if self.pipeline_split == "auto" else self.pipeline_split
        for i, text in enumerate(splits):
            try:
                canonical = parse_split(text).text
            except ConfigError as e:
                raise ConfigError(e.reason, path=f"pipeline_split[{i}]") from None
            if canonical in seen_splits:
                raise ConfigError(f"{text!r} is listed twice", path=f"pipeline_split[{i}]")
            seen_splits.add(canonical)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == "auto" or (f.name == "etp" and value is None):
                continue
            if not value:
                raise ConfigError("the list is empty", path=f.name)
            seen: set[object] = set()
            for i, item in enumerate(value):
                if item in seen:
                    raise ConfigError(f"{item!r} is listed twice", path=f"{f.name}[{i}]")
                seen.add(item)
                if f.name == "zero_stage" or (f.name == "dp_shard" and item == -1):
                    continue
                if isinstance(item, int) and not isinstance(item, bool):
                    # No axis value exceeds the world size or the batch: one bound for all.
                    _size(item, MAX_BATCH, f"{f.name}[{i}]", "larger than any world or batch")
        for i, z in enumerate(self.zero_stage):
            if not 0 <= z <= 3:
                raise ConfigError(
                    f"ZeRO stage must be 0, 1, 2 or 3, got {z}", path=f"zero_stage[{i}]"
                )


def _recompute_entry(text: str, i: int) -> str:
    """One ``space.recompute`` value in its canonical spelling (``tuner.spec.recompute``)."""
    try:
        knobs = parse_recompute(text)
    except ConfigError as e:
        raise ConfigError(e.reason, path=f"recompute[{i}]") from None
    if knobs.method is not None:
        raise ConfigError(
            "full takes its method and layers from recompute_method and recompute_num_layers; "
            "list plain full",
            path=f"recompute[{i}]",
        )
    return recompute_text(knobs.granularity, None, None, knobs.modules)
