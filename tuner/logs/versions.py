"""The software versions a training log names (for the header of an exported full run).

Only lines a framework prints by itself are read: DeepSpeed's engine logs ``DeepSpeed info:
version=0.19.8, git-hash=...`` when it starts (deepspeed/runtime/engine.py). Megatron-LM prints
no version line, so a Megatron log yields nothing, and the export says so rather than guess.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

_PATTERNS = {
    "deepspeed": re.compile(r"DeepSpeed info: version=([0-9][0-9A-Za-z.+_-]{0,40})"),
}
#: How much of a log's start is read: the version lines come before the first iteration.
HEAD_BYTES = 1 << 20


def versions_in_text(text: str) -> dict[str, str]:
    """``{"deepspeed": "0.19.8"}`` for each version line found in ``text`` (the first of each)."""
    out: dict[str, str] = {}
    for name, pattern in _PATTERNS.items():
        match = pattern.search(text)
        if match:
            out[name] = match.group(1).rstrip(".,")
    return out


def versions_in_logs(paths: Iterable[Path]) -> dict[str, str]:
    """The versions named at the start of the logs ``paths`` (missing files are skipped)."""
    out: dict[str, str] = {}
    for path in paths:
        try:
            with path.open("rb") as f:
                head = f.read(HEAD_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        for name, version in versions_in_text(head).items():
            out.setdefault(name, version)
    return out
