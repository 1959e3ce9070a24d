"""Training-log parsers: Megatron-LM, DeepSpeed, and the outcome of a run.

``parse_log(text)`` turns a log into :class:`RunMetrics`. Per-step figures are steady-state:
the first ``warmup`` step records (by iteration number where the log has one) are dropped and the
median of the rest is taken. By default ``warmup`` is the larger of 1 and 20 % of the records
(rounded down), and at least one record is always kept. Fixture header lines (``# source:``,
``# --- ``) are skipped. No input makes a parser raise.

Parsing is one linear pass: the log is read in chunks, only the lines holding a literal some
parser needs are cut out of them (:func:`~tuner.logs.lines.select_lines`, at most
:data:`~tuner.logs.lines.MAX_LINE_CHARS` each), each line parser and failure signature runs
only on lines holding its own literal, and the framework is detected on the same pass. A file
larger than :data:`MAX_LOG_BYTES` is read at its start and its end (a trial's iterations and its
failure signature), never whole.

May import: :mod:`tuner.spec` (framework names), :mod:`tuner.errors`, :mod:`tuner.outcome`. The
``tune parse-log`` command is :mod:`tuner.cli.parse_log`.

The package's names load on first use (PEP 562, :data:`_EXPORTS`): importing one of its light
modules (:mod:`tuner.logs.versions`, the version ``tune --version`` prints) loads no parser.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner import lazy_getattr

if TYPE_CHECKING:
    from tuner.logs.classify import Failure, decide, find_failure
    from tuner.logs.metrics import JSON_KEYS, RunMetrics, warmup_count
    from tuner.logs.parse import (
        MAX_LOG_BYTES,
        Framework,
        detect_framework,
        parse_chunks,
        parse_deepspeed,
        parse_log,
        parse_log_file,
        parse_log_files,
        parse_megatron,
        read_log,
    )

__all__ = [
    "JSON_KEYS",
    "MAX_LOG_BYTES",
    "Failure",
    "Framework",
    "RunMetrics",
    "decide",
    "detect_framework",
    "find_failure",
    "parse_chunks",
    "parse_deepspeed",
    "parse_log",
    "parse_log_file",
    "parse_log_files",
    "parse_megatron",
    "read_log",
    "warmup_count",
]

_EXPORTS = {
    "Failure": "tuner.logs.classify",
    "decide": "tuner.logs.classify",
    "find_failure": "tuner.logs.classify",
    "JSON_KEYS": "tuner.logs.metrics",
    "RunMetrics": "tuner.logs.metrics",
    "warmup_count": "tuner.logs.metrics",
    **dict.fromkeys(
        ("MAX_LOG_BYTES", "Framework", "detect_framework", "parse_chunks", "parse_deepspeed",
         "parse_log", "parse_log_file", "parse_log_files", "parse_megatron", "read_log"),
        "tuner.logs.parse",
    ),
}  # fmt: skip
"""Each public name and the module that defines it, imported on first use."""

__getattr__ = lazy_getattr(__name__, _EXPORTS)
