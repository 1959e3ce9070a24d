"""Where an expert-parallel step's all-to-all time goes: each call's own time and the ranks' skew.

    PYTHONPATH=benchmarks/collective_trace TUNER_COLLECTIVE_TRACE=DIR <a demo-moe run>
    python benchmarks/moe_skew.py DIR [--profile results/clusters/<cluster>.json]

The trace (``benchmarks/collective_trace/sitecustomize.py``) holds each rank's collective calls
and timed steps on one clock. For every two-rank process pair and every timed step after the
first, the all-to-alls inside the step are matched across the ranks by order: a call's *own*
time is the later-arriving rank's time inside it (the exchange once both are there), its
*wait* the difference of the two arrivals (what the earlier rank spends waiting for the other).
Printed per config (ep, micro-batch, accumulation, layers): the step, the calls per step, the
own time per call (median and mean: a step pays the mean) and the wait per call and per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Call:
    op: str
    enter: int
    exit: int


@dataclass(frozen=True, slots=True)
class Step:
    key: tuple[int, int, int, int]  # ep, micro-batch, accumulation, layers
    iter: int
    start: int
    end: int


def read(path: Path) -> tuple[list[Call], list[Step]]:
    calls, steps = [], []
    for line in path.read_text().splitlines():
        f = line.split()
        if f and f[0] == "c" and len(f) == 5:
            calls.append(Call(f[1], int(f[2]), int(f[3])))
        elif f and f[0] == "s" and len(f) == 8:
            key = (int(f[1]), int(f[2]), int(f[3]), int(f[4]))
            steps.append(Step(key, int(f[5]), int(f[6]), int(f[7])))
    return calls, steps


def pairs(folder: Path) -> list[tuple[Path, Path]]:
    """Rank 0 and rank 1 files of one process group: the rank-1 file whose first call is
    nearest rank 0's."""

    def first(p: Path) -> int:
        calls, _ = read(p)
        return calls[0].enter if calls else 0

    ones = {p: first(p) for p in folder.glob("rank1-*.txt")}
    out = []
    for zero in sorted(folder.glob("rank0-*.txt")):
        t = first(zero)
        if ones:
            one = min(ones, key=lambda p: abs(ones[p] - t))
            out.append((zero, one))
            del ones[one]
    return out


@dataclass
class Acc:
    steps: list[float]
    calls: list[int]
    own: list[float]
    wait: list[float]
    wait_step: list[float]
    own_step: list[float]


Key = tuple[str, int, int, int, int]
"""Rank 0's pid (or *), ep, micro-batch, accumulation, layers."""


def gather(folder: Path, by_process: bool = False) -> dict[Key, Acc]:
    out: dict[Key, Acc] = defaultdict(lambda: Acc([], [], [], [], [], []))
    for zero, one in pairs(folder):
        proc = zero.stem.split("-")[1] if by_process else "*"
        c0, s0 = read(zero)
        c1, s1 = read(one)
        if [c.op for c in c0] != [c.op for c in c1] or len(s0) != len(s1):
            print(f"{zero.name} / {one.name}: the ranks' calls differ, skipped", file=sys.stderr)
            continue
        i = 0
        for a, b in zip(s0, s1, strict=True):
            while i < len(c0) and c0[i].enter < a.start:
                i += 1
            j = i
            own, wait = [], []
            while j < len(c0) and c0[j].exit <= a.end:
                x, y = c0[j], c1[j]
                if x.op == "all_to_all_single":
                    late = x if x.enter >= y.enter else y
                    own.append((late.exit - late.enter) / 1e6)
                    wait.append(abs(x.enter - y.enter) / 1e6)
                j += 1
            i = j
            if a.iter == 1:
                continue
            acc = out[(proc, *a.key)]
            acc.steps.append(max(a.end - a.start, b.end - b.start) / 1e6)
            acc.calls.append(len(own))
            acc.own += own
            acc.wait += wait
            acc.own_step.append(sum(own))
            acc.wait_step.append(sum(wait))
    return out


def row(a: Acc) -> str:
    """One config's figures (ms), as :func:`main` heads them."""
    med, mean = statistics.median, statistics.fmean
    if not a.own:
        calls = " ".join(f"{'-':>8}" for _ in range(5))
    else:
        in_call = mean(a.own) + mean(a.wait) / 2
        calls = (f"{med(a.own):8.3f} {mean(a.own):8.3f} {med(a.wait):8.3f} {mean(a.wait):8.3f} "
                 f"{in_call:8.3f}")  # fmt: skip
    return (f"{len(a.steps):5d} {med(a.steps):8.1f} {med(a.calls):5.0f} {calls} "
            f"{med(a.own_step):8.2f} {med(a.wait_step):8.2f}")  # fmt: skip


HEAD = ("steps", "step ms", "calls", "own med", "own mean", "wait med", "wait mean", "in-call",
        "own/step", "wait/step")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--by-process", action="store_true", help="one row per process and config")
    args = p.parse_args(argv)
    found = gather(args.folder, args.by_process)
    widths = (5, 8, 5, 8, 8, 8, 8, 8, 8, 8)
    print(
        f"{'process ep mbs ga L':<20} "
        + " ".join(f"{h[:w]:>{w}}" for h, w in zip(HEAD, widths, strict=True))
    )
    for key in sorted(found):
        print(f"{' '.join(map(str, key)):<20} {row(found[key])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
