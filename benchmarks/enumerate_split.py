"""Where a first enumeration's CPU goes: each part of ``enumerate_space`` and its ranking, timed
around its calls.

Usage: python benchmarks/enumerate_split.py [--spaces gpt-70b,moe-1e5]

Each space runs in a fresh process (cold caches), as benchmarks/enumerate.py's fast path does:
``enumerate_space(spec, keep_oom=True)`` and ``report.ranked()``. The parts are timed by
wrapping the functions the enumeration calls, each part's own CPU seconds
(``time.process_time``) with the parts called inside it taken out, so the rows add up to the
whole: the rules and the walk (the valid configs' values), the stages' bounds from their kept
terms (``stage_figures``: the first computation of a stage's states and activations included),
the stage plans built to simulate them, the allocator simulations (``reserved_bytes``, cache hits
included; the misses are the simulations run), whole breakdowns, the time model and what is left
(the judge's own loop, building configs and candidates, the memory probes' choice and the
ranking's sort and narrowing loop). The wrappers add about a microsecond a call, so read the
shares. Issue 36's targets: 10^5 configs in under 1 s, the shipped studies in under 0.2 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from enumerate import study

import tuner.models.memory.overheads as overheads
import tuner.models.memory.stage_figures as figures
import tuner.space.candidates as candidates
import tuner.space.deferred as deferred
import tuner.space.enumerate as enumeration
from tuner.models.memory.allocator import reserved_bytes

PARTS = {
    "rules": "rules and walk (valid configs' values)",
    "figures": "stage bounds (stage_figures)",
    "plans": "stage plans to simulate",
    "sims": "allocator simulations",
    "whole": "whole breakdowns",
    "time": "time model",
    "rest": "the rest (judge loop, configs, candidates, probes, ranking)",
}

SECONDS: Counter[str] = Counter()
CALLS: Counter[str] = Counter()
_inner: list[float] = []  # per open timed call, the seconds of the timed calls inside it


def _timed(part: str, f: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        _inner.append(0.0)
        start = time.process_time()
        try:
            return f(*args, **kwargs)
        finally:
            elapsed = time.process_time() - start
            SECONDS[part] += elapsed - _inner.pop()
            CALLS[part] += 1
            if _inner:
                _inner[-1] += elapsed

    return call


def _timed_iter(part: str, f: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    def walk(*args: Any, **kwargs: Any) -> Iterator[Any]:
        items = f(*args, **kwargs)
        step = _timed(part, lambda: next(items, None))
        while (item := step()) is not None:
            yield item

    return walk


def measure(name: str) -> dict[str, Any]:
    """One fast enumeration and ranking of ``name`` in this process, split into parts."""
    enumeration.valid_values = _timed_iter("rules", enumeration.valid_values)
    for module in (figures, candidates, deferred):
        module.stage_figures = _timed("figures", module.stage_figures)  # type: ignore[attr-defined]
    for module in (candidates, deferred):
        module.stage_plan = _timed("plans", module.stage_plan)  # type: ignore[attr-defined]
        module.estimate_memory = _timed("whole", module.estimate_memory)  # type: ignore[attr-defined]
    candidates.stage_plans = _timed("whole", candidates.stage_plans)
    overheads.reserved_bytes = _timed("sims", overheads.reserved_bytes)
    enumeration.estimate_time = _timed("time", enumeration.estimate_time)
    spec = study(name)
    start = time.process_time()
    report = enumeration.enumerate_space(spec, keep_oom=True)
    report.ranked()
    total = time.process_time() - start
    SECONDS["rest"] = total - sum(SECONDS.values())
    return {"configs": report.total, "cpu": total, "seconds": dict(SECONDS),
            "calls": dict(CALLS), "simulations": reserved_bytes.cache_info().misses}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spaces", default="gpt-70b,mixtral-8x7b,llama3-8b,moe-1e5")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return 0
    here = Path(__file__).resolve()
    for name in args.spaces.split(","):
        out = subprocess.run([sys.executable, str(here), "--child", name], capture_output=True,
                             text=True, check=True, cwd=here.parent.parent)  # fmt: skip
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name}: {row['configs']:,} configs, {row['cpu']:.2f} s of CPU, "
              f"{row['simulations']:,} simulations")  # fmt: skip
        for part, label in PARTS.items():
            seconds = row["seconds"].get(part, 0.0)
            calls = row["calls"].get(part)
            line = f"  {label:<62}{seconds:>8.3f} s{100 * seconds / row['cpu']:>6.1f}%"
            print(line + (f"{calls:>10,} calls" if calls else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
