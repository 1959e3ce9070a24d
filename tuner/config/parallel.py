"""``ParallelConfig``: one point of the search space.

DP follows from the world size: dp = world / (tp x pp x cp). The frameworks' validity rules over
a config are :mod:`tuner.config.rules`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner._loader import KeptHash
from tuner.spec.pipeline_split import EVEN
from tuner.spec.recompute import (
    DEFAULT_MODULES,
    canonical_modules,
    recompute_text,
)
from tuner.spec.study import (
    RecomputeGranularity,
    RecomputeMethod,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelConfig(KeptHash):
    """How one training run is split over the GPUs, batched and recomputed."""

    __hash__ = KeptHash.__hash__  # hashed once (tuner._loader.KeptHash): a key of several caches

    tp: int = 1
    """Tensor parallel size."""
    pp: int = 1
    """Pipeline parallel size."""
    cp: int = 1
    """Context parallel size."""
    dp: int = 1
    """Data parallel size (derived: world / (tp x pp x cp))."""
    vp: int = 1
    """Virtual pipeline chunks per pipeline rank (1: plain 1F1B)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism over the TP group."""
    micro_batch_size: int = 1
    """Sequences per micro-batch per model replica."""
    global_batch_size: int = 1
    """Sequences per optimizer step."""
    recompute: RecomputeGranularity = "none"
    """Activation recomputation: none, selective (attention core) or full layers."""
    recompute_method: RecomputeMethod | None = None
    """Full recompute only: uniform or block."""
    recompute_num_layers: int | None = None
    """Full recompute only: layers per chunk (uniform) or recomputed layers per stage (block)."""
    recompute_modules: tuple[str, ...] | None = None
    """Selective only: Megatron ``--recompute-modules`` (``tuner.spec.recompute``), kept in its
    order; None: its default, core_attn."""
    distributed_optimizer: bool = False
    """Megatron distributed optimizer (fp32 master weights and Adam states sharded over DP)."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0-3."""
    pipeline_split: str = EVEN
    """How layers are assigned to pipeline stages (``tuner.spec.pipeline_split``): ``even``,
    Megatron ``first=N,last=N`` / ``embedding+loss`` / ``layout:...``, or a DeepSpeed
    ``partition_method`` (``uniform``, ``parameters``, ``type:REGEX``)."""
    ep: int = 1
    """Expert parallel size (MoE layers): experts are split over ``ep`` ranks."""
    etp: int | None = None
    """Expert tensor parallel size; None: the same as ``tp`` (Megatron's default)."""
    moe_token_dispatcher: str = "alltoall"
    """MoE token dispatcher (``--moe-token-dispatcher-type``): alltoall, allgather or flex."""
    tp_comm_overlap: bool = False
    """Megatron ``--tp-comm-overlap``: TE userbuffers under the GEMMs
    (``tuner.models.time.tp_overlap``); for torchtitan: async TP
    (``compile.enable_async_tensor_parallel``)."""
    dp_replicate: int = 1
    """torchtitan: HSDP replicas (``data_parallel_replicate_degree``); dp_shard = dp / this."""
    pp_schedule: str | None = None
    """torchtitan: the pipeline schedule by name (``tuner.spec.torchtitan``); None at pp=1 and
    for the other frameworks (their schedule follows vp)."""
    reshard_after_forward: str = "default"
    """torchtitan: ``fsdp_reshard_after_forward`` (default, always, never)."""
    compile: bool = False
    """torchtitan: ``torch.compile`` of the model and loss (``compile.enable``)."""

    def __post_init__(self) -> None:
        # One value per setting: a stored list reads back as the same tuple, core_attn alone
        # as the default.
        modules = canonical_modules(self.recompute_modules)
        if modules != self.recompute_modules:
            object.__setattr__(self, "recompute_modules", modules)

    @property
    def recomputed_modules(self) -> tuple[str, ...]:
        """What selective recompute checkpoints (empty unless selective)."""
        if self.recompute != "selective":
            return ()
        return DEFAULT_MODULES if self.recompute_modules is None else self.recompute_modules

    @property
    def expert_tp(self) -> int:
        """Tensor parallel size of the expert layers (``etp``, or ``tp`` when unset)."""
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Expert data parallel size: world / (etp x ep x pp) (megatron/core/parallel_state.py
        folds the expert grid etp-ep-dp-pp over the same ranks as tp-cp-dp-pp)."""
        return max(1, self.world_size // (self.expert_tp * self.ep * self.pp))

    @property
    def moe_key(self) -> str:
        """The MoE knobs in a key (empty at their defaults, so dense keys stay as they were)."""
        if self.ep == 1 and self.etp is None and self.moe_token_dispatcher == "alltoall":
            return ""
        etp = f",etp={self.etp}" if self.etp is not None else ""
        return f",ep={self.ep}{etp},dispatcher={self.moe_token_dispatcher}"

    @property
    def dp_shard(self) -> int:
        """FSDP degree (torchtitan ``data_parallel_shard_degree``): dp / dp_replicate."""
        return max(self.dp // max(self.dp_replicate, 1), 1)

    @property
    def fsdp_key(self) -> str:
        """torchtitan's own knobs in a key (empty at their defaults, so other keys stay)."""
        if (self.dp_replicate, self.pp_schedule, self.reshard_after_forward, self.compile) == (
            1, None, "default", False,
        ):  # fmt: skip
            return ""
        return (
            f",dpr={self.dp_replicate},sched={self.pp_schedule},"
            f"reshard={self.reshard_after_forward},compile={int(self.compile)}"
        )

    @property
    def world_size(self) -> int:
        """GPUs one replica set uses: tp x pp x cp x dp."""
        return self.tp * self.pp * self.cp * self.dp

    @property
    def model_parallel_size(self) -> int:
        """tp x pp x cp."""
        return self.tp * self.pp * self.cp

    @property
    def num_microbatches(self) -> int:
        """Gradient accumulation steps m = global batch / (micro-batch x dp), rounded down."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def grad_accum(self) -> int:
        """Alias of num_microbatches (DeepSpeed's gradient_accumulation_steps)."""
        return self.num_microbatches

    @property
    def recompute_setting(self) -> str:
        """The recompute knobs as one value: ``none``, ``selective``,
        ``selective:core_attn+moe_act`` or ``full:uniform:1`` (``tuner.spec.recompute``), the only
        spelling used in keys, tables and the storage."""
        return recompute_text(
            self.recompute, self.recompute_method, self.recompute_num_layers,
            self.recompute_modules,
        )  # fmt: skip

    def key(self) -> str:
        """A canonical text key: equal configs have equal keys (used to never run one twice)."""
        rc = self.recompute_setting
        return (
            (
                f"tp={self.tp},pp={self.pp},cp={self.cp},dp={self.dp},vp={self.vp},"
                f"sp={int(self.sequence_parallel)},mbs={self.micro_batch_size},"
                f"gbs={self.global_batch_size},recompute={rc},"
                f"distopt={int(self.distributed_optimizer)},zero={self.zero_stage}"
            )
            + (f",split={self.pipeline_split}" if self.pipeline_split != EVEN else "")
            + self.moe_key
            + (",tpo=1" if self.tp_comm_overlap else "")
            + self.fsdp_key
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values, plus the derived grad_accum, for JSON, tables and Optuna attributes."""
        return {
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "dp": self.dp,
            "vp": self.vp,
            "sequence_parallel": self.sequence_parallel,
            "micro_batch_size": self.micro_batch_size,
            "global_batch_size": self.global_batch_size,
            "grad_accum": self.num_microbatches,
            "recompute": self.recompute,
            "recompute_method": self.recompute_method,
            "recompute_num_layers": self.recompute_num_layers,
            "recompute_modules": (
                None if self.recompute_modules is None else list(self.recompute_modules)
            ),
            "distributed_optimizer": self.distributed_optimizer,
            "zero_stage": self.zero_stage,
            "pipeline_split": self.pipeline_split,
            "ep": self.ep,
            "etp": self.etp,
            "moe_token_dispatcher": self.moe_token_dispatcher,
            "tp_comm_overlap": self.tp_comm_overlap,
        } | (self._fsdp_dict() if self.fsdp_key else {})

    def _fsdp_dict(self) -> dict[str, Any]:
        """torchtitan's knobs (only when one is off its default: other records stay as they
        were, and ``ParallelConfig(**d)`` reads either back)."""
        return {
            "dp_replicate": self.dp_replicate, "pp_schedule": self.pp_schedule,
            "reshard_after_forward": self.reshard_after_forward, "compile": self.compile,
        }  # fmt: skip
