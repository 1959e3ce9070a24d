"""How fast a study's whole space is enumerated, validated, estimated and ranked: fast vs exact.

Usage: python benchmarks/enumerate.py [--spaces gpt-70b,moe-1e5] [--paths exact,fast,stream]
[--repeat 3] [--timeout 600] [--baseline main]

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
``--timeout`` seconds is stopped and shown as a bound. ``--baseline REV``: each path is also
measured on the tree of git revision ``REV`` (before a change), taking turns with this tree's in
the same run, and a ``vs REV`` column shows its CPU time over this tree's. Wall seconds are shown
too; on a shared machine the CPU seconds are the figure to compare. Targets (issue 36): 10^5
configs in under 1 s, the shipped studies in under 0.2 s each, under 1 GiB for 10^6.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


HERE = Path(__file__).resolve().parent.parent


def run_child(name: str, path: str, timeout: float, tree: Path = HERE) -> dict[str, float] | None:
    """One measurement in a fresh process, of the package in ``tree`` (a checkout's root)."""
    script = tree / "benchmarks" / "enumerate.py"
    cmd = [sys.executable, str(script), "--child", name, "--path", path]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True,
                             cwd=tree, env=env)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def best_of(
    name: str, runs: list[tuple[str, Path]], repeat: int, timeout: float
) -> dict[tuple[str, Path], dict[str, float] | None]:
    """The quickest (CPU seconds) of ``repeat`` runs of each (path, tree), taking turns (so
    that a shared machine's load falls on all alike)."""
    best: dict[tuple[str, Path], dict[str, float] | None] = dict.fromkeys(runs)
    timed_out = dict.fromkeys(runs, False)
    for _ in range(repeat):
        for run in runs:
            if timed_out[run]:
                continue
            row = run_child(name, run[0], timeout, run[1])
            timed_out[run] = row is None
            old = best[run]
            if row is not None and (old is None or row["cpu"] < old["cpu"]):
                best[run] = row
    return best


def export_tree(rev: str, into: Path) -> Path:
    """The files of git revision ``rev`` of the repository in the working directory, written
    under ``into``."""
    archive = subprocess.run(["git", "archive", rev], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spaces", default=",".join(SHIPPED + GENERATED))
    parser.add_argument("--paths", default=",".join(PATHS), help="of exact, fast, stream")
    parser.add_argument("--timeout", type=float, default=600.0, help="per measurement, seconds")
    parser.add_argument("--repeat", type=int, default=3, help="runs per path; the best is shown")
    parser.add_argument("--baseline", help="a git revision to measure beside this tree")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.path)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"": HERE}
        if args.baseline:
            trees[args.baseline] = export_tree(args.baseline, Path(tmp))
        report(args, trees)
    return 0


def report(args: argparse.Namespace, trees: dict[str, Path]) -> None:
    """Measure every space on every path and tree; print a row per (path, tree)."""
    paths = args.paths.split(",")
    head = f"{'space':<14}{'configs':>9}{'path':>7}{'tree':>8}{'wall s':>9}{'configs/s':>11}"
    base = args.baseline
    print(head + f"{'RSS MiB':>9}{'CPU s':>8}{'sims':>8}{'vs exact':>10}"
          + (f"{'vs ' + base:>12}" if base else ""))  # fmt: skip
    for name in args.spaces.split(","):
        size = expand_axes(study(name)).size
        runs = [(path, tree) for path in paths for tree in trees.values()]
        rows = best_of(name, runs, args.repeat, args.timeout)
        for (path, tree), row in rows.items():
            label = next(k for k, v in trees.items() if v == tree) or "this"
            if row is None:
                line = f"{name:<14}{size:>9,}{path:>7}{label[:7]:>8}"
                print(line + f"{'>' + format(args.timeout, '.0f'):>9}"
                      + f"{'<' + format(size / args.timeout, ',.0f'):>11}")  # fmt: skip
                continue
            rate = row["configs"] / row["seconds"]
            line = f"{name:<14}{row['configs']:>9,.0f}{path:>7}{label[:7]:>8}"
            line += f"{row['seconds']:>9.2f}{rate:>11,.0f}{row['rss_mib']:>9.0f}{row['cpu']:>8.2f}"
            line += f"{row['simulations']:>8,.0f}"
            exact = rows.get(("exact", tree))
            # CPU seconds: what a shared machine's load moves least
            if path != "exact" and exact:
                line += f"{exact['cpu'] / row['cpu']:>9.1f}x"
            else:
                line += f"{'-' if path != 'exact' else '':>10}"
            before = rows.get((path, trees[base])) if base else None
            if before and tree == HERE:
                line += f"{before['cpu'] / row['cpu']:>11.2f}x"
            print(line)


if __name__ == "__main__":
    sys.exit(main())
