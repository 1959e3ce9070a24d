"""How fast a study's whole space is enumerated, validated, estimated and ranked: fast vs exact.

Usage: python benchmarks/enumerate.py [--spaces gpt-70b,moe-1e5] [--paths exact,fast,stream]
[--repeat 3] [--timeout 600]

Each measurement runs in a fresh process (cold caches, its own peak RSS): ``enumerate_space(spec,
keep_oom=True)`` and its ranking, as ``tune space`` does, on the fast path (bounds on the
allocator settle most verdicts, breakdowns computed when read: docs/speed.md) and on the exact
path (``fast=False``: the allocator simulated for every valid config, as before the fast path);
``stream``: ``stream_space(spec, top=20)``, the fast path holding only the counts, the memory
probes and the 20 first of the ranking. Prints configs/s, peak RSS, CPU seconds and the allocator
simulations run (a count the machine's load does not move) of each, and the ratio of each CPU
time to the exact path's, measured in the same run (CPU time: on a shared machine the wall time
of the same work varies several-fold with the load). Spaces: the shipped studies, and MoE
spaces generated from mixtral-8x7b with EP, ETP, the three dispatchers and selective-recompute
modules, of about 10^5 (``moe-1e5``) and 10^6 (``moe-1e6``) configs. A measurement past
``--timeout`` seconds is stopped and shown as a bound. Targets (issue 36): 10^5 configs in
under 1 s, the shipped studies in under 0.2 s each, under 1 GiB for 10^6.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time

from tuner.models.memory.allocator import reserved_bytes
from tuner.space.enumerate import enumerate_space, expand_axes
from tuner.space.stream import stream_space
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec

SHIPPED = ("gpt-70b", "mixtral-8x7b", "llama3-8b")
GENERATED = ("moe-1e5", "moe-1e6")


def moe_space(size: str) -> StudySpec:
    """mixtral-8x7b over a MoE space of about 10^5 or 10^6 configs."""
    spec = load_study("mixtral-8x7b")
    knobs: dict[str, tuple[object, ...]] = dict(
        tp=(1, 2, 4, 8), pp=(1, 2, 4, 8), cp=(1,), vp=(1, 2), micro_batch_size=(1, 2, 4),
        sequence_parallel=(True, False), ep=(1, 2, 4, 8), etp=(1, 2, 4),
        recompute=("none", "selective", "selective:core_attn+moe_act", "full"),
        recompute_method=("uniform", "block"), recompute_num_layers=(1, 2),
        distributed_optimizer=(True, False), tp_comm_overlap=(False, True),
        moe_token_dispatcher=("alltoall", "allgather", "flex"),
    )  # fmt: skip
    if size == "moe-1e6":
        knobs.update(cp=(1, 2, 4), vp=(1, 2, 4), micro_batch_size=(1, 2, 4, 8),
                     recompute_num_layers=(1, 2, 4))  # fmt: skip
    return dataclasses.replace(spec, space=dataclasses.replace(spec.space, **knobs))  # type: ignore[arg-type]


def study(name: str) -> StudySpec:
    return moe_space(name) if name in GENERATED else load_study(name)


PATHS = ("exact", "fast", "stream")


def measure(name: str, path: str) -> dict[str, float]:
    """One enumeration and ranking in this process: configs, seconds, peak RSS (MiB)."""
    spec = study(name)
    start, cpu = time.perf_counter(), time.process_time()
    if path == "stream":
        report = stream_space(spec, top=20)
    else:
        report = enumerate_space(spec, keep_oom=True, fast=path == "fast")
        report.ranked()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    # allocator simulations run (distinct stages' tensors): a count the machine's load does
    # not move
    sims = reserved_bytes.cache_info().misses
    return {"configs": report.total, "seconds": seconds, "cpu": cpu, "rss_mib": rss,
            "viable": len(report.viable), "simulations": sims}  # fmt: skip


def run_child(name: str, path: str, timeout: float) -> dict[str, float] | None:
    cmd = [sys.executable, __file__, "--child", name, "--path", path]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def best_of(
    name: str, paths: list[str], repeat: int, timeout: float
) -> dict[str, dict[str, float] | None]:
    """The quickest (CPU seconds) of ``repeat`` runs of each path, the paths taking turns (so
    that a shared machine's load falls on all alike)."""
    best: dict[str, dict[str, float] | None] = dict.fromkeys(paths)
    timed_out = dict.fromkeys(paths, False)
    for _ in range(repeat):
        for path in paths:
            if timed_out[path]:
                continue
            row = run_child(name, path, timeout)
            timed_out[path] = row is None
            old = best[path]
            if row is not None and (old is None or row["cpu"] < old["cpu"]):
                best[path] = row
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spaces", default=",".join(SHIPPED + GENERATED))
    parser.add_argument("--paths", default=",".join(PATHS), help="of exact, fast, stream")
    parser.add_argument("--timeout", type=float, default=600.0, help="per measurement, seconds")
    parser.add_argument("--repeat", type=int, default=3, help="runs per path; the best is shown")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.path)))
        return 0
    paths = args.paths.split(",")
    head = f"{'space':<14}{'configs':>9}{'path':>7}{'time s':>10}{'configs/s':>11}{'RSS MiB':>9}"
    print(head + f"{'CPU s':>8}{'sims':>8}{'vs exact':>10}")
    for name in args.spaces.split(","):
        size = expand_axes(study(name)).size
        rows = best_of(name, paths, args.repeat, args.timeout)
        exact = rows.get("exact")
        for path, row in rows.items():
            if row is None:
                line = f"{name:<14}{size:>9,}{path:>7}{'>' + format(args.timeout, '.0f'):>10}"
                print(line + f"{'<' + format(size / args.timeout, ',.0f'):>11}")
                continue
            rate = row["configs"] / row["seconds"]
            line = f"{name:<14}{row['configs']:>9,.0f}{path:>7}{row['seconds']:>10.2f}"
            line += f"{rate:>11,.0f}{row['rss_mib']:>9.0f}{row['cpu']:>8.2f}"
            print(line + f"{row['simulations']:>8,.0f}", end="")
            if path != "exact" and exact:  # CPU seconds: what a shared machine's load moves least
                print(f"{exact['cpu'] / row['cpu']:>9.1f}x")
            else:
                print(f"{'-' if path != 'exact' else '':>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
