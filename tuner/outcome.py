"""The outcomes of a trial (DESIGN.md, "Outcomes of a trial")."""

from __future__ import annotations

import enum
import math


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


RERUNNABLE = frozenset(Outcome) - {Outcome.OK, Outcome.INVALID, Outcome.PRUNED_MEMORY}
"""Outcomes a user may ask to run again (``tune run --rerun``): a measured failure. Here, not
beside the trials it selects (:mod:`tuner.space.trials`, which needs Optuna): ``tune run``'s
command line reads it, and a study file it refuses need not wait for Optuna's import."""


def figure(value: object) -> float | None:
    """``value`` when a trial may be ranked by it (a measured step time, tokens/s): a finite
    number above zero. A NaN, an infinity, a zero or a negative figure (a stored or hand-edited
    ``tokens_per_s: .inf``, a step time of 0) is no measurement: ranked by it, it would win (an
    infinite rate, a step of no time) or sort where Python's comparisons happen to put it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def rankable(step: object, tokens: object) -> bool:
    """Whether a measured trial may rank and be called the best: its step time is a
    :func:`figure`, and so is its tokens/s where it stored one (None: not stored). The
    leaderboard's rows and the report's rows are judged by this one rule."""
    return figure(step) is not None and (tokens is None or figure(tokens) is not None)
