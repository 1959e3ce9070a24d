"""How far a running trial has got, from the tail of its log: the last iteration it printed
(Megatron's ``iteration k/ n |`` lines, DeepSpeed's ``steps: k``, the workloads' ``tuner-step:
iter=k``), for the live display of ``tune run``."""

from __future__ import annotations

from pathlib import Path

from tuner.logs.deepspeed import _PIPELINE, _TUNER_STEP
from tuner.logs.megatron import _ITERATION

TAIL_BYTES = 16384
"""How much of the end of a log is read: a few iteration lines, whatever the model prints."""


def last_iteration(text: str) -> int | None:
    """The highest iteration number the text shows (None: none yet)."""
    found: list[int] = [int(m.group(1)) for m in _ITERATION.finditer(text)]
    found += [int(m.group(1)) for m in _PIPELINE.finditer(text)]
    for m in _TUNER_STEP.finditer(text):
        fields = dict(word.split("=", 1) for word in m.group(1).split())
        if (it := fields.get("iter", "")).isascii() and it.isdigit() and len(it) <= 18:
            found.append(int(it))
    return max(found) if found else None


def log_iteration(path: Path) -> int | None:
    """:func:`last_iteration` of the end of the log at ``path`` (None: no log or no line yet)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL_BYTES))
            return last_iteration(f.read().decode("utf-8", "replace"))
    except OSError:
        return None
