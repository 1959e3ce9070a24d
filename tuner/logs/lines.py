"""Line handling shared by the parsers: splitting, fixture headers, rank prefixes, glued prints,
fields.

Everything here is linear in the size of the log: text arrives in chunks, a line longer than
:data:`MAX_LINE_CHARS` is cut to that length before any pattern sees it (the rest of it is
skipped, never held), and no pattern used on a line can backtrack quadratically.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
from collections.abc import Iterable, Iterator

# Headers of the fixture excerpts (shared/fixtures/logs/README.md): not log text.
_HEADER = ("# source:", "# --- ")
# Terminal escapes (colour codes, the literal "^[c" reset pasted into some logs).
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[@-Z\\-_]|\^\[c")
# Per-rank prefixes put in front of every line: torch >= 2.4 "[rank3]:", torchrun --tee
# "[default0]:", srun --label "3: ". Only tags followed by ':' go: "[Rank 1] (after" is content.
_PREFIX = re.compile(r"^(?:\s*(?:\[(?:rank|default)\d+\]:|\d{1,5}: ))+")
# Where a new record starts inside a line that holds two prints glued without a newline. The
# word-starting ones must not follow a letter, digit or '_'. A timestamp's record starts at the
# blank before it.
_BOUNDARY_AT = {
    "[": re.compile(
        r"\[Rank \d+\]|\[(?:rank|default)\d+\]:|(\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)"
    ),
    "iteration": re.compile(r"iteration\s+\d+\s*/\s*\d+\s*\|"),
    "after ": re.compile(r"after \d+ iterations\)? memory"),
    "time (ms)": re.compile(r"time \(ms\)"),
    "tuner-step:": re.compile(r"tuner-step:"),
}
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)\b", re.I)


#: Longest line a parser looks at. Why: the longest real lines (Megatron iteration lines with
#: every field, two prints glued together, an OOM message) are under 2 KiB; cutting there bounds
#: the work per line whatever a job prints (a 50 MB line of base64, a progress bar never ended).
MAX_LINE_CHARS = 8192
#: Size of the pieces a log is read in.
CHUNK_CHARS = 1 << 20
# Line ends str.splitlines() knows besides "\n" and "\r": rare in logs, turned into "\n".
_RARE_BREAKS = ("\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


def text_chunks(text: str) -> Iterator[str]:
    """``text`` in pieces of :data:`CHUNK_CHARS`."""
    for start in range(0, len(text), CHUNK_CHARS):
        yield text[start : start + CHUNK_CHARS]


def _one_break(chunk: str) -> str:
    """``chunk`` with every line end ``str.splitlines`` knows written as ``"\n"``."""
    if "\r" in chunk:  # progress bars redrawn in place become lines of their own
        chunk = chunk.replace("\r\n", "\n").replace("\r", "\n")
    for brk in _RARE_BREAKS:
        if brk in chunk:
            chunk = chunk.replace(brk, "\n")
    return chunk


def _blocks(chunks: Iterable[str]) -> Iterator[str]:
    """The text of ``chunks`` in blocks of whole lines joined by ``"\n"``. A line that runs over
    chunks is kept only up to :data:`MAX_LINE_CHARS` (the rest is skipped, never held), so memory
    stays bounded by one chunk however long a line is; lines inside a block are cut by the caller.
    """
    carry = ""  # the start of a line no chunk has ended yet (at most MAX_LINE_CHARS)
    skipping = False  # that line was cut: drop what follows up to its end
    for raw in chunks:
        chunk = _one_break(raw)
        if skipping:
            end = chunk.find("\n")
            if end < 0:
                continue
            chunk, skipping = chunk[end:], False
        last = chunk.rfind("\n")
        if last < 0:
            carry += chunk
        else:
            yield carry + chunk[: last + 1]
            carry = chunk[last + 1 :]
        if len(carry) > MAX_LINE_CHARS:
            carry, skipping = carry[:MAX_LINE_CHARS], True
    if carry:
        yield carry


def split_lines(chunks: Iterable[str]) -> Iterator[str]:
    """The lines of text arriving in ``chunks`` (as ``str.splitlines`` splits), each cut to
    :data:`MAX_LINE_CHARS`."""
    for block in _blocks(chunks):
        parts = block.split("\n")
        if block.endswith("\n"):
            parts.pop()
        for line in parts:
            yield line[:MAX_LINE_CHARS] if len(line) > MAX_LINE_CHARS else line


def select_lines(chunks: Iterable[str], markers: Iterable[str]) -> Iterator[str]:
    """The lines of :func:`split_lines` that hold at least one of ``markers``, in order.

    Why: most of a big log is lines no parser reads (NCCL INFO, warnings). Each marker is found
    with ``str.find`` over a whole block, so those lines cost no Python work at all; only the lines
    around a hit are cut out. Linear: after a hit the search goes on from the end of its line.
    """
    wanted = tuple(markers)
    for block in _blocks(chunks):
        starts: set[int] = set()
        for marker in wanted:
            hit = block.find(marker)
            while hit >= 0:
                starts.add(block.rfind("\n", 0, hit) + 1)
                end = block.find("\n", hit)
                hit = block.find(marker, end) if end >= 0 else -1
        for start in sorted(starts):
            end = block.find("\n", start, start + MAX_LINE_CHARS)
            yield block[start : end if end >= 0 else start + MAX_LINE_CHARS]


def clean_lines(raw_lines: Iterable[str]) -> Iterator[str]:
    """``raw_lines`` without fixture headers, terminal escapes and per-rank prefixes."""
    for raw in raw_lines:
        if raw.startswith(_HEADER):
            continue
        if "\x1b" in raw or "^[" in raw:
            raw = _ESCAPES.sub("", raw)
        yield _PREFIX.sub("", raw, count=1)


def log_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` without fixture headers, escapes and per-rank prefixes.

    ``\\r`` also ends a line, so progress bars redrawn in place become lines of their own.
    """
    return clean_lines(split_lines(text_chunks(text)))


def record_starts(line: str) -> list[tuple[int, int]]:
    """Where glued records start in ``line``: ``(position, start)`` pairs in order; ``start`` is
    one less than ``position`` when a timestamp's blank belongs to the record.

    Each literal is found with ``str.find`` and checked once, so the work is linear in the line
    (one alternation tried at every position cost 70 ns a character, and searching again from
    each record made a line of many records quadratic).
    """
    found: list[tuple[int, int]] = []
    for literal, pattern in _BOUNDARY_AT.items():
        i = line.find(literal)
        while i >= 0:
            match = pattern.match(line, i)
            word_ok = literal == "[" or i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "_")
            if match is not None and word_ok:
                stamped = literal == "[" and match.group(1) is not None
                found.append((i, i - 1 if stamped and i and line[i - 1].isspace() else i))
            i = line.find(literal, i + 1)
    found.sort()
    return found


def segment_end(line: str, start: int, starts: list[tuple[int, int]] | None = None) -> int:
    """Where the record that starts before ``start`` ends: the next glued record, or the end.
    ``starts`` is :func:`record_starts` of ``line`` when the caller already has it."""
    starts = record_starts(line) if starts is None else starts
    k = bisect.bisect_left(starts, (start, -1))
    if k == len(starts):
        return len(line)
    position, begin = starts[k]
    return begin if begin >= start else position


def number(text: str, *, finite: bool = True) -> float | None:
    """The first number in ``text`` (``100.2TFLOPS`` -> 100.2), None when there is none; NaN and
    infinities count only with ``finite=False`` (to spot a diverged loss)."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    value = float(match.group())
    return value if not finite or math.isfinite(value) else None


_OPEN_PAREN = re.compile(r"\s*\(")
_SPACES = re.compile(r"\s+")


@functools.lru_cache(maxsize=4096)  # the same few dozen keys come back on every line
def normalise_key(key: str) -> str:
    """``Tokens per gpu per second(tgs) `` -> ``tokens per gpu per second (tgs)``."""
    return _SPACES.sub(" ", _OPEN_PAREN.sub(" (", key.strip().lower()))


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
        if sep and (name := normalise_key(key)):
            fields.setdefault(name, value.strip())
    return fields
