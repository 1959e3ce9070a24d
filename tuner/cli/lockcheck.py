"""Stop before DeepSpeed starts on a stale torch-extension build lock, with ``tune run``'s
preflight line (:class:`tuner.launch.preflight.BuildLocks`), instead of waiting on it forever.

    python -m tuner.cli.lockcheck [--name NAME]

checks this machine (``make demo-warmup`` runs it before its bare ``torchrun``): exit 0 when no
lock is stale, else one ``NAME: preflight: HOST: stale torch-extension build lock ...`` line per
lock and exit 2. :func:`refuse_stale_locks` is the same for a study's nodes, for what launches a
study's script without ``tune run`` (``tune profile --probe``, tools, benchmarks). A lock is never
removed here: a build may still hold it unseen; the line says how to remove it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tuner.launch.preflight import (
    Preflights,
    Problem,
    exit_code,
    local_lock_problems,
    lock_problems,
    problem_lines,
)
from tuner.spec.study import StudySpec


def refused(problems: Sequence[Problem], name: str = "tune") -> int:
    """Write one ``NAME: preflight: ...`` line per problem to stderr; the exit status (0: none,
    2: a problem on a node, 1: only unreachable nodes)."""
    for line in problem_lines(problems):
        sys.stderr.write(f"{name}: preflight: {line}\n")
    return exit_code(problems)


def refuse_stale_locks(spec: StudySpec, executor: Preflights, name: str = "tune") -> int:
    """The stale build locks on the study's nodes as :func:`refused` lines; the exit status."""
    return refused(lock_problems(spec, executor), name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="tune", help="the lines' first word (default: tune)")
    args = parser.parse_args(argv)
    return refused(local_lock_problems(), args.name)


if __name__ == "__main__":
    sys.exit(main())
