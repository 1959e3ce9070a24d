"""A config's knobs as table columns: the one naming the leaderboard and the space's DataFrame
share, so that a row of either reads the same (``tp``, ``micro_batch``, ``grad_accum``, ...)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import MemoryBreakdown
from tuner.models.time.estimate import TimeBreakdown

if TYPE_CHECKING:
    import pandas as pd


class Candidate(Protocol):
    """What a row is made of (:class:`tuner.space.enumerate.Candidate` has it)."""

    @property
    def config(self) -> ParallelConfig: ...
    @property
    def memory(self) -> MemoryBreakdown: ...
    @property
    def fits(self) -> bool: ...
    @property
    def time(self) -> TimeBreakdown | None: ...


KNOB_COLUMNS = (
    "tp", "pp", "dp", "cp", "vp", "sp", "micro_batch", "grad_accum", "recompute",
    "distributed_optimizer", "zero_stage", "tp_comm_overlap", "ep", "etp", "dispatcher",
)  # fmt: skip
"""The knobs' column names, in the leaderboard's order."""
PREDICTED_COLUMNS = (
    "predicted_step_s", "predicted_tokens_per_s", "predicted_mfu", "predicted_peak_gib", "fits",
)  # fmt: skip
"""What :func:`space_frame` adds to the knobs for each config."""


def config_columns(c: ParallelConfig | None) -> dict[str, Any]:
    """``c``'s knobs under :data:`KNOB_COLUMNS` (all None without a config)."""
    if c is None:
        return dict.fromkeys(KNOB_COLUMNS)
    return {
        "tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp, "vp": c.vp, "sp": c.sequence_parallel,
        "micro_batch": c.micro_batch_size, "grad_accum": c.num_microbatches,
        "recompute": c.recompute_setting, "distributed_optimizer": c.distributed_optimizer,
        "zero_stage": c.zero_stage, "tp_comm_overlap": c.tp_comm_overlap, "ep": c.ep,
        "etp": c.expert_tp, "dispatcher": c.moe_token_dispatcher,
    }  # fmt: skip


def space_frame(candidates: Sequence[Candidate]) -> pd.DataFrame:
    """One row per candidate, in the given order: ``rank`` (1 = first), the knobs, the
    predictions (step time s, tokens/s, MFU, peak GiB, fits) and the config's ``key``."""
    import pandas as pd

    rows = []
    for rank, cand in enumerate(candidates, 1):
        t = cand.time
        rows.append({
            "rank": rank, **config_columns(cand.config),
            "predicted_step_s": t.step if t else None,
            "predicted_tokens_per_s": t.tokens_per_s if t else None,
            "predicted_mfu": t.mfu if t else None,
            "predicted_peak_gib": cand.memory.to_dict()["peak_gib"], "fits": cand.fits,
            "key": cand.config.key(),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=["rank", *KNOB_COLUMNS, *PREDICTED_COLUMNS, "key"])
