"""Line handling shared by the parsers: fixture headers, rank prefixes, glued prints, fields."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

# Headers of the fixture excerpts (shared/fixtures/logs/README.md): not log text.
_HEADER = ("# source:", "# --- ")
# Terminal escapes (colour codes, the literal "^[c" reset pasted into some logs).
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[@-Z\\-_]|\^\[c")
# Per-rank prefixes put in front of every line: torch >= 2.4 "[rank3]:", torchrun --tee
# "[default0]:", srun --label "3: ". Only tags followed by ':' go: "[Rank 1] (after" is content.
_PREFIX = re.compile(r"^(?:\s*(?:\[(?:rank|default)\d+\]:|\d{1,5}: ))+")
# Where a new record starts inside a line that holds two prints glued without a newline.
BOUNDARY = re.compile(
    r"\[Rank \d+\]"
    r"|\[(?:rank|default)\d+\]:"
    r"|\s?\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d"
    r"|\biteration\s+\d+\s*/\s*\d+\s*\|"
    r"|\bafter \d+ iterations\)? memory"
    r"|\btime \(ms\)"
    r"|\btuner-step:"
)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)\b", re.I)


def log_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` without fixture headers, escapes and per-rank prefixes.

    ``\\r`` also ends a line, so progress bars redrawn in place become lines of their own.
    """
    for raw in text.splitlines():
        if raw.startswith(_HEADER):
            continue
        line = _ESCAPES.sub("", raw)
        yield _PREFIX.sub("", line, count=1)


def segment_end(line: str, start: int) -> int:
    """Where the record that starts before ``start`` ends: the next glued record, or the end."""
    match = BOUNDARY.search(line, start)
    return match.start() if match else len(line)


def number(text: str) -> float | None:
    """The first number in ``text`` (``100.2TFLOPS`` -> 100.2), None when there is none or NaN."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    value = float(match.group())
    return value if math.isfinite(value) else None


def normalise_key(key: str) -> str:
    """``Tokens per gpu per second(tgs) `` -> ``tokens per gpu per second (tgs)``."""
    key = re.sub(r"\s*\(", " (", key.strip().lower())
    return re.sub(r"\s+", " ", key)


def bar_fields(segment: str, *, closed: bool) -> dict[str, str]:
    """``| key: value | key: value |`` pieces of ``segment`` as a dict of normalised keys.

    With ``closed`` a piece counts only when a ``|`` follows it, so a line cut off in the middle of
    its last value is not misread; memory reports end without a ``|`` and pass ``closed=False``.
    """
    pieces = segment.split("|")
    if closed:
        pieces = pieces[:-1]
    fields: dict[str, str] = {}
    for piece in pieces:
        key, sep, value = piece.rpartition(":")
        if sep and key.strip():
            fields.setdefault(normalise_key(key), value.strip())
    return fields
