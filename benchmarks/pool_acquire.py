"""The node pool at scale: hand out every node of a large pool one group at a time, give them back.

    python benchmarks/pool_acquire.py [--hosts 36036] [--per-trial 1] [--avoid 0]

``NodePool`` over ``--hosts`` nodes (36,036 single-node groups is the most its master ports
allow from 29500): ``acquire`` until none is left, each group kept; ``release`` all; ``acquire``
all again (a released node goes back among the free ones). ``--avoid N``: every acquire passes
the first N nodes as held by another worker. Prints the CPU seconds (``time.process_time``) of
each phase and per acquire. The pool scanned every host and rebuilt the ports in use on each
acquire (36,036 acquires took 221 s); figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.launch import NodeGroup, NodePool  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=36036)
    parser.add_argument("--per-trial", type=int, default=1)
    parser.add_argument("--avoid", type=int, default=0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    hosts = [f"node{i:06d}" for i in range(args.hosts)]
    avoid = hosts[: args.avoid]
    pool = NodePool(hosts, args.per_trial, port_range=args.hosts)

    def take() -> tuple[list[NodeGroup], float]:
        start = time.process_time()
        groups = []
        while (group := pool.acquire(avoid)) is not None:
            groups.append(group)
        return groups, time.process_time() - start

    groups, first = take()
    start = time.process_time()
    for group in groups:
        pool.release(group)
    back = time.process_time() - start
    again, second = take()
    n = len(groups)
    print(
        f"{args.hosts:,} hosts, {args.per_trial} per group, {args.avoid:,} avoided: {n:,} groups"
    )
    print(f"  acquire all   {first:8.3f} CPU s  ({1e6 * first / max(n, 1):8.1f} us per acquire)")
    print(f"  release all   {back:8.3f} CPU s")
    print(f"  acquire again {second:8.3f} CPU s  ({len(again):,} groups)")


if __name__ == "__main__":
    main()
