"""How long ``tune`` takes to start: ``--version`` and ``space --help``, against bare Python.

Usage: python benchmarks/startup.py [--repeat 7]
Target (issue 36): each under 0.3 s. Shows the best of ``--repeat`` runs of each (a shared
machine's load only adds), wall-clock and the process's CPU time (what the load does not
inflate), and the interpreter's own start-up beside them.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "tune --version": [sys.executable, "-m", "tuner.cli.main", "--version"],
    "tune space --help": [sys.executable, "-m", "tuner.cli.main", "space", "--help"],
}


def best(cmd: list[str], repeat: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child), each the best of ``repeat`` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return min(walls), min(cpus)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    for name, cmd in COMMANDS.items():
        wall, cpu = best(cmd, args.repeat)
        print(f"{name:<20} best of {args.repeat}: wall {wall:.3f} s, CPU {cpu:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
