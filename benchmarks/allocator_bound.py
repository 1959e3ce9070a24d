"""How far the allocator's upper bound is from its simulation, and what a tighter one could save.

Usage: python benchmarks/allocator_bound.py [--spaces gpt-70b,mixtral-8x7b] [--caches 20000]

Per space, each in a fresh process, over the stages the fast path simulates
(``enumerate_space(spec, keep_oom=True)`` and its ranking, as ``tune space``): the upper bound's
``total`` over the simulated one and the simulated one over the lower bound, MiB (median, 10th
and 90th percentile); the stages whose second iteration adds segments; those whose simulated
``total`` is over one iteration's per-call figure (the resident, moments, forward/backward and
step segments at the most: "the second iteration adds nothing" is false there); and the
matching argument's bound (docs/speed.md) over the simulated ``total``, given the simulated
first iteration and free blocks (the most it can give; it fails if that is ever under); the
upper bound with the resident states' exact cache (``allocator._kept``) in place of their
per-call figure, over the simulated ``total``; and a guess that is no bound, "the second
iteration adds at most what the moments and the step's temporaries displaced" (the resident's
exact cache, the moments and the step twice, the forward/backward once, per call) over the
simulated ``total``, with the stages where it is under. Then
the simulations the fast path runs, how many it would run with that matching bound as its
upper ``total``, and with the simulated figures as its upper bound: the floor of any tighter
upper bound (those runs simulate every bounded stage to know them: their time is no figure).
Last, on random caches of the allocator's own ``_Cache``: how often the same transient phase
run twice grows the cache the second time, and how often a cache with more free blocks grows
more over the same phase than without them (best fit is not monotone: why a second iteration
is not bounded by the first).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from enumerate import study

from tuner.models.memory import allocator, bound
from tuner.models.memory.allocator import (
    MIB,
    SMALL_SIZE,
    Reserved,
    StepTensors,
    Sums,
    Tensors,
    reserved_bounds,
    reserved_bytes,
)
from tuner.space.enumerate import enumerate_space

SPACES = ("llama3-8b", "mixtral-8x7b", "gpt-70b")


def _iterations(t: StepTensors) -> tuple[int, int]:
    """Reserved bytes after the first iteration and after the second (the simulation's order)."""
    cache = allocator._Cache.after(t.resident)
    cache.transient(t.fwd_bwd)
    cache.keep(t.lazy)
    cache.transient(t.step)
    first = cache.reserved
    cache.transient(t.fwd_bwd)
    cache.transient(t.step)
    return first, cache.reserved


def _matched(items: list[int], blocks: list[int]) -> int:
    """The most items each given a distinct block at least its size (ascending greedy: the
    smallest item the smallest block that holds it, optimal for this threshold order)."""
    items, blocks = sorted(items), sorted(blocks)
    j = matched = 0
    for item in items:
        while j < len(blocks) and blocks[j] < item:
            j += 1
        if j == len(blocks):
            break
        matched, j = matched + 1, j + 1
    return matched


def _most_bytes(tensors: Tensors, small: bool, budget: int) -> int:
    """The most segment bytes ``budget`` new segments of ``tensors``' calls in one pool can
    make: at most ``ceil(n / (seg // r))`` of a call's (``segments_at_most``), the largest
    first."""
    segs = []
    for size, n in tensors:
        r, seg = allocator._block(size)
        if (r <= SMALL_SIZE) == small:
            segs.append((seg, allocator.segments_at_most(n, r, seg)))
    out = 0
    for seg, count in sorted(segs, reverse=True):
        take = min(count, budget)
        out, budget = out + take * seg, budget - take
    return out


def _matching_bound(t: StepTensors, lazy: bool = False) -> int:
    """An upper bound on the simulated ``total`` that takes the first iteration and the free
    blocks at the second's start from the simulation (so no bound of its own: the most the
    matching argument of docs/speed.md can give): the second forward/backward makes segments
    for at most ``m - matched`` of its ``m`` requests per pool (one request each), its step at
    most its per-call figure. ``lazy``: the first iteration at its per-call figure, and the
    blocks matched after the first forward/backward instead, less one per moment request of
    the pool (each changes one block; the step's segments only add): only those blocks are
    still the simulation's."""
    cache = allocator._Cache.after(t.resident)
    cache.transient(t.fwd_bwd)
    after_fwd = cache.snapshot()
    cache.keep(t.lazy)
    cache.transient(t.step)
    out = cache.reserved + allocator.group_sums(t.step)[2]
    if lazy:  # the first iteration at its per-call figure: only the blocks simulated
        out = sum(sums[2] for sums in allocator.step_sums(t)) + allocator.group_sums(t.step)[2]
    for small in (False, True):
        pool = (after_fwd if lazy else cache.free)[small]
        items = [allocator._block(size)[0] for size, n in t.fwd_bwd for _ in range(n)]
        items = [r for r in items if (r <= SMALL_SIZE) == small]
        blocks = [size for size, n in pool.count.items() for _ in range(n)]
        matched = _matched(items, blocks)
        if lazy:
            moments = sum(
                n for size, n in t.lazy if (allocator._block(size)[0] <= SMALL_SIZE) == small
            )
            matched = max(matched - moments, 0)
        out += _most_bytes(t.fwd_bwd, small, len(items) - matched)
    return out


def gaps(name: str) -> dict[str, Any]:
    """The simulated stages' gaps to the bounds (one fast enumeration and ranking)."""
    seen: list[StepTensors] = []
    inner = reserved_bytes.__wrapped__

    @functools.lru_cache(maxsize=1 << 14)
    def recording(t: StepTensors) -> Reserved:
        seen.append(t)
        return inner(t)

    allocator.reserved_bytes = recording  # what overheads.allocator_slacks reads
    from tuner.models.memory import overheads

    overheads.reserved_bytes = recording  # type: ignore[attr-defined]
    enumerate_space(study(name), keep_oom=True).ranked()
    over, under, matching, adds, over_one = [], [], [], 0, 0
    resident, displaced, displaced_under = [], [], 0
    for t in seen:
        low, high = reserved_bounds(t)
        first, total = _iterations(t)
        (_, _, res, _), (_, _, lazy, _), (_, _, fwd, _), (_, _, step, _) = allocator.step_sums(t)
        over.append((high.total - total) / MIB)
        under.append((total - low.total) / MIB)
        matching.append((_matching_bound(t) - total) / MIB)
        adds += total > first
        over_one += total > res + lazy + fwd + step
        kept = allocator._kept(t.resident)[0]
        resident.append((kept + lazy + 2 * (fwd + step) - total) / MIB)
        displaced.append((kept + 2 * lazy + fwd + 2 * step - total) / MIB)
        displaced_under += displaced[-1] < 0
    assert min(matching, default=0.0) >= 0, "the matching bound under the simulation"
    return {"stages": len(seen), "over": _spread(over), "under": _spread(under),
            "matching": _spread(matching), "adds": adds, "over_one": over_one,
            "resident": _spread(resident), "displaced": _spread(displaced),
            "displaced_under": displaced_under}  # fmt: skip


def _spread(xs: list[float]) -> list[float]:
    xs = sorted(xs)
    return [statistics.median(xs), xs[len(xs) // 10], xs[9 * len(xs) // 10]] if xs else []


def simulations(name: str, upper: str) -> int:
    """The fast path's simulations, with its bounds (``upper`` "fast"), with the simulated
    figures as the upper bound ("exact") or with the matching argument's ``total`` given the
    simulated first iteration ("matching"), both simulated outside the count."""
    if upper != "fast":
        exact = functools.lru_cache(maxsize=1 << 16)(reserved_bytes.__wrapped__)
        matching = functools.lru_cache(maxsize=1 << 16)(_matching_bound)
        robust = upper == "matching-lazy"

        def upper_exact(t: StepTensors, sums: Sums | None = None) -> tuple[Reserved, Reserved]:
            low, high = reserved_bounds(t, sums)
            if upper == "exact":
                return low, exact(t)
            total = float(min(matching(t, robust), high.total))
            assert total >= exact(t).total, "the matching bound under the simulation"
            return low, Reserved(total, total, high.step)

        bound.reserved_bounds = upper_exact  # type: ignore[attr-defined]
        # the judge and the narrowing read a stage's upper bound from stage_figures (its kept
        # terms, no plan) since docs/speed.md's item 29: take each stage's upper figure there
        # from its plan's stage_bound, which reads the reserved_bounds just replaced
        from tuner.models.memory import estimate, stage_figures
        from tuner.space import candidates, deferred

        plain = stage_figures.stage_figures

        def figures(*args: Any) -> stage_figures.StageFigures:
            model, c, stage, _, gpu, framework, precision = args
            least, most, share, envelope = plain(*args)
            plan = estimate.stage_plan(model, c, gpu, framework, precision, stage)
            return least, min(most, bound.stage_bound(plan, gpu)[1]), share, envelope

        stage_figures.stage_figures = figures  # type: ignore[assignment]
        candidates.stage_figures = deferred.stage_figures = figures  # type: ignore[attr-defined,assignment]
    enumerate_space(study(name), keep_oom=True).ranked()
    return reserved_bytes.cache_info().misses


def anomalies(caches: int, seed: int) -> dict[str, float]:
    """On random caches: (replays that grow, supersets that grow more, the largest excess MiB)."""
    rng = random.Random(seed)
    sizes = [0.3, 1.5, 3, 5, 7, 9, 11, 13, 17, 21, 25, 40]

    def tensors() -> Tensors:
        return tuple((rng.choice(sizes) * MIB * rng.uniform(0.9, 1.1), rng.randint(1, 4))
                     for _ in range(rng.randint(1, 6)))  # fmt: skip

    replay = superset = 0
    worst = 0.0
    for _ in range(caches):
        base = allocator._Cache()
        base.keep(tensors()[: rng.randint(0, 4)])
        phase = tensors()
        more = allocator._Cache()
        more.free, more.reserved = base.snapshot(), base.reserved
        for _ in range(rng.randint(1, 3)):
            extra = int(rng.choice(sizes) * MIB * rng.uniform(0.9, 1.3)) // 512 * 512
            more.free[extra <= SMALL_SIZE].add(extra, 1)
        start = more.reserved
        more.transient(phase)
        grown_more = more.reserved - start
        start = base.reserved
        base.transient(phase)
        grown, again = base.reserved - start, base.reserved
        base.transient(phase)
        replay += base.reserved > again
        superset += grown_more > grown
        worst = max(worst, (base.reserved - again) / MIB, (grown_more - grown) / MIB)
    return {"replay": replay, "superset": superset, "worst_mib": worst}


def child(kind: str, name: str) -> dict[str, Any]:
    if kind == "gaps":
        return gaps(name)
    return {"sims": simulations(name, kind)}


def run(kind: str, name: str) -> dict[str, Any]:
    """One measurement in a fresh process (cold caches: the simulation counts are a first
    enumeration's)."""
    cmd = [sys.executable, str(Path(__file__)), "--child", kind, name]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spaces", default=",".join(SPACES))
    parser.add_argument("--caches", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    print(f"{'space':<14}{'stages':>7}{'upper-sim MiB (med p10 p90)':>30}"
          f"{'sim-lower MiB':>22}{'matching-sim MiB':>22}{'2nd adds':>9}{'over 1 it':>10}"
          f"{'sims':>10}{'matching':>10}{'m-lazy':>10}{'exact':>10}")  # fmt: skip
    for name in args.spaces.split(","):
        g = run("gaps", name)
        line = f"{name:<14}{g['stages']:>7,}"
        line += "".join(f"{x:>10,.0f}" for x in g["over"]) + " "
        line += "".join(f"{x:>7,.0f}" for x in g["under"]) + " "
        line += "".join(f"{x:>7,.0f}" for x in g["matching"]) + " "
        line += f"{g['adds']:>9,}{g['over_one']:>10,}"
        kinds = ("fast", "matching", "matching-lazy", "exact")
        line += "".join(f"{run(kind, name)['sims']:>10,}" for kind in kinds)
        print(line)
        print(
            f"{'':<14}upper-sim with the resident exact (med p10 p90): "
            + " ".join(f"{x:,.0f}" for x in g["resident"])
            + "; the displaced guess (no bound) - sim: "
            + " ".join(f"{x:,.0f}" for x in g["displaced"])
            + f", under on {g['displaced_under']:,}"
        )
    a = anomalies(args.caches, args.seed)
    print(f"random caches: {args.caches:,}; the same phase twice grows the cache again: "
          f"{a['replay']:,}; more free blocks grow it more: {a['superset']:,}; "
          f"the largest such growth {a['worst_mib']:.1f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
