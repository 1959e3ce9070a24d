"""Reading the framework probe's node logs (:mod:`tuner.profile.probe`): each point's part, framed
by :data:`POINT` lines, parsed by the framework's own log parser into :class:`ProbeRow` s; a
point measured again (:mod:`tuner.profile.recheck`) is framed by :data:`AGAIN` instead of
``start`` and read apart from its first run."""

from __future__ import annotations

import re
import statistics
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import LaunchError
from tuner.logs import parse_log
from tuner.profile.probe_rows import ProbeRow

if TYPE_CHECKING:
    from tuner.profile.probe_rows import ProbeRun
    from tuner.spec.study import StudySpec

PROBE_WARMUP = 1
"""Iterations always left out of the median: the first optimizer step builds the optimizer's
lazy state (Adam's moments, ZeRO's partitions), the autograd graph's first allocations and the
workloads' memory accounting."""
WARM_SLOW = 1.25
"""After those, a leading iteration slower than this times the median of the ones after it is
still warming up (allocator growth, first collectives on a new communicator) and is left out
too (:func:`steady_samples`)."""
MIN_STEADY = 3
"""The fewest iterations a median is taken over."""
POINT = "TUNER_STACK_POINT"
"""The line that frames each point's output in the node logs: ``TUNER_STACK_POINT <k> start``
and ``TUNER_STACK_POINT <k> end rc=<code>``; a script that interleaves its points' steps
(:data:`INTERLEAVED`) frames each later part of a point by ``<k> resume`` and ``<k> pause``."""
INTERLEAVED = "resume"
"""The framing word that says a point's steps were interleaved with the other points' (one step
of each per round, the rounds numbered by the steps' iteration): their samples pair by round."""
AGAIN = "again"
"""The framing word of a point's second run, after the first pass (``<k> again`` ... ``<k> end
rc=<code>``): the points :mod:`tuner.profile.recheck` found inconsistent, measured again."""


_FRAME = re.compile(
    rf"{POINT} (\d{{1,9}}) (start|end|{AGAIN}|{INTERLEAVED}|pause)(?:\s|$)", re.ASCII
)
"""A whole frame line: the point's index in ASCII digits, its framing word."""


def frame(line: str) -> tuple[int, str]:
    """A frame line's point index and word; a line that starts as one and is not (another
    process's output run into it, a cut) is a one-line :class:`LaunchError` quoting it: its
    index was an int() ValueError's traceback out of ``tune profile --probe`` (``x``), a
    point of its own (``４``), or its point's lines went unread ("measured nothing")."""
    found = _FRAME.match(line)
    if found is None:
        raise LaunchError(f"probe node log: a garbled {POINT} line (two processes' output run "
                          f"together?): {line[:80]!r}")  # fmt: skip
    return int(found.group(1)), found.group(2)


def _whole_lines(text: str) -> list[str]:
    """``text``'s lines but a last frame line without its line break: still being written
    while the probe runs (it read as a garbled frame), or cut short where the output ended."""
    lines = text.splitlines()
    cut = lines and not text.endswith("\n") and lines[-1].startswith(POINT)
    return lines[:-1] if cut else lines


def split_points(text: str, word: str = "start") -> dict[int, str]:
    """Each point's lines of one node log, by point index: the last run of each (an executor
    may append a probe's log to an earlier probe's in the same directory), its interleaved parts
    (``resume`` ... ``pause``) joined. ``word`` :data:`AGAIN`: the points' second runs
    instead."""
    out: dict[int, list[str]] = {}
    current: int | None = None
    opens = (word,) if word == AGAIN else (word, INTERLEAVED)
    for line in _whole_lines(text):
        if line.startswith(POINT):
            k, framing = frame(line)
            current = k if framing in opens else None
            if framing == word:
                out[k] = []
            continue
        if current is not None:
            out.setdefault(current, []).append(line)
    return {k: "\n".join(v) + "\n" for k, v in out.items()}


def versions(text: str) -> dict[str, str]:
    """The stack's versions from a workload's ``tuner-versions: python=... torch=...`` line."""
    for line in text.splitlines():
        if "tuner-versions:" in line:
            words = line.split("tuner-versions:", 1)[1].split()
            return dict(w.split("=", 1) for w in words if "=" in w)
    return {}


def rows_from_logs(
    spec: StudySpec, runs: Sequence[ProbeRun], logs: Sequence[str], word: str = "start",
    only: Collection[int] | None = None,
) -> list[ProbeRow]:  # fmt: skip
    """The rows of every run (of the indices in ``only``, in that order), each parsed from its
    part of all node logs (``word``: :func:`split_points`); a run without a step time is a
    one-line :class:`LaunchError` naming it."""
    parts = [split_points(text, word) for text in logs]
    paired = any(f"{POINT} {k} {INTERLEAVED}" in text for text in logs for k in range(len(runs)))
    rows = []
    for k in range(len(runs)) if only is None else only:
        run = runs[k]
        text = "".join(p.get(k, "") for p in parts)
        m = parse_log(
            text, spec.framework, PROBE_WARMUP, global_batch_size=spec.training.global_batch_size
        )
        if m.step_time_s is None or m.peak_memory_gib is None:
            tail = " | ".join(text.strip().splitlines()[-2:]) or "no output"
            again = " (measured again)" if word == AGAIN else ""
            raise LaunchError(f"probe run p{k}{again} ({run.launched.key()}, {run.depth} "
                              f"layers) measured nothing ({m.outcome}): {tail}")  # fmt: skip
        steady = steady_samples(m.step_times_s)
        # the samples are the run's last iterations (1, 2, ... in the workloads' step lines)
        first = len(m.step_times_s) - len(steady) + 1
        rows.append(ProbeRow(key=run.launched.key(), depth=run.depth,
                             step_s=statistics.median(steady),
                             samples_s=tuple(steady), peak_gib=m.peak_memory_gib,
                             reserved_gib=m.peak_reserved_gib,
                             rounds=tuple(range(first, first + len(steady))) if paired
                             else ()))  # fmt: skip
    return rows


def read_log(path: Path) -> str:
    """A node log's text so far ("" before it exists)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def ended(text: str) -> int:
    """How many points of a node log have ended (their ``end`` line, first runs or second)."""
    return len({k for ln in _whole_lines(text) if ln.startswith(POINT)
                for k, framing in [frame(ln)] if framing == "end"})  # fmt: skip


def steady_samples(times: Sequence[float]) -> tuple[float, ...]:
    """The step times past the warm-up: the first :data:`PROBE_WARMUP` always dropped, then each
    leading one more than :data:`WARM_SLOW` times the median of those after it, while at least
    :data:`MIN_STEADY` stay (all of them when there are fewer)."""
    rest = list(times[PROBE_WARMUP:])
    if len(rest) < MIN_STEADY:
        return tuple(times[-MIN_STEADY:]) or tuple(times)
    while len(rest) > MIN_STEADY and rest[0] > WARM_SLOW * statistics.median(rest[1:]):
        rest.pop(0)
    return tuple(rest)
