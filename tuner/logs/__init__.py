"""Training-log parsers: Megatron-LM, DeepSpeed, and the outcome of a run.

``parse_log(text)`` turns a log into :class:`RunMetrics`. Per-step figures are steady-state:
the first ``warmup`` step records (by iteration number where the log has one) are dropped and the
median of the rest is taken. By default ``warmup`` is the larger of 1 and 20 % of the records
(rounded down), and at least one record is always kept. Fixture header lines (``# source:``,
``# --- ``) are skipped. No input makes a parser raise.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from tuner.errors import ParseError
from tuner.logs.classify import Failure, decide, find_failure
from tuner.logs.deepspeed import SIGNATURES as _DEEPSPEED_SIGNATURES
from tuner.logs.deepspeed import parse_deepspeed
from tuner.logs.megatron import parse_megatron
from tuner.logs.metrics import JSON_KEYS, RunMetrics, warmup_count

Framework = Literal["megatron", "deepspeed"]

__all__ = [
    "JSON_KEYS",
    "Failure",
    "Framework",
    "RunMetrics",
    "decide",
    "detect_framework",
    "find_failure",
    "parse_deepspeed",
    "parse_log",
    "parse_log_file",
    "parse_megatron",
    "read_log",
    "warmup_count",
]


def detect_framework(text: str) -> Framework:
    """``deepspeed`` when the log has a line only DeepSpeed prints, else ``megatron``."""
    return "deepspeed" if _DEEPSPEED_SIGNATURES.search(text) else "megatron"


def parse_log(
    text: str,
    framework: Framework | None = None,
    warmup: int | None = None,
    *,
    exit_codes: Sequence[int | None] = (),
    timed_out: bool = False,
    global_batch_size: int | None = None,
) -> RunMetrics:
    """Parse one run's log (all ranks' output may be mixed in).

    ``framework`` None detects it. ``exit_codes`` (one per process or node, negative for a signal)
    and ``timed_out`` (killed at the trial limit) come from the executor and refine the outcome as
    :func:`tuner.logs.classify.decide` describes. ``global_batch_size`` lets a DeepSpeed log that
    logs only samples/s yield a step time.
    """
    chosen = framework or detect_framework(text)
    if chosen == "deepspeed":
        return parse_deepspeed(
            text,
            warmup,
            global_batch_size=global_batch_size,
            exit_codes=exit_codes,
            timed_out=timed_out,
        )
    return parse_megatron(text, warmup, exit_codes=exit_codes, timed_out=timed_out)


def read_log(path: str | Path) -> str:
    """A log file's text (undecodable bytes replaced); :class:`ParseError` when unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ParseError(f"{path}: cannot read log: {exc.strerror or exc}") from exc


def parse_log_file(
    path: str | Path,
    framework: Framework | None = None,
    warmup: int | None = None,
    *,
    exit_codes: Sequence[int | None] = (),
    timed_out: bool = False,
    global_batch_size: int | None = None,
) -> RunMetrics:
    """:func:`parse_log` on a file's contents; :class:`ParseError` when it cannot be read."""
    return parse_log(
        read_log(path),
        framework,
        warmup,
        exit_codes=exit_codes,
        timed_out=timed_out,
        global_batch_size=global_batch_size,
    )
