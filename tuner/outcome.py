"""The outcomes of a trial (DESIGN.md, "Outcomes of a trial")."""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """What happened to one configuration; the values appear in JSON, CSV and the storage."""

    OK = "ok"
    PRUNED_MEMORY = "pruned_memory"  # predicted OOM: never launched
    INVALID = "invalid"  # breaks a rule of the framework: never launched
    PRUNED_TIME = "pruned_time"  # its shortest useful trial exceeds the user's time limit
    OOM = "oom"  # real CUDA out-of-memory
    NCCL_TIMEOUT = "nccl_timeout"
    LAUNCH_ERROR = "launch_error"  # bad flag, missing file, import error
    NODE_ERROR = "node_error"  # ssh refused, host down: retried elsewhere
    TIMEOUT = "timeout"  # killed at the trial limit after iteration lines had arrived
    HANG = "hang"  # killed at the trial limit before any iteration line: hung at start-up
    DIVERGED = "diverged"  # loss NaN/inf or nan/skipped iterations logged: not a measurement
    NO_METRICS = "no_metrics"  # exited but logged no usable step time
    INTERRUPTED = "interrupted"  # the study was stopped: re-run on resume

    @property
    def launched(self) -> bool:
        """Whether a trial with this outcome used nodes (counts against the run budget)."""
        return self not in (Outcome.PRUNED_MEMORY, Outcome.INVALID, Outcome.PRUNED_TIME)
