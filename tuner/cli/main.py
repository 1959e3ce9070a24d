"""``tune``: the entry point of the command line (the commands: :mod:`tuner.cli.commands`).

Exit codes: 0 success, 1 the job failed, 2 bad usage or bad input (one line on stderr; the
traceback only with ``--debug``), 130 interrupted.

Kept apart from the commands so that it loads nothing: a Ctrl-C in the second or so the command
line takes to load and parse its arguments (a user who sees the wrong study named just after
Enter) was a KeyboardInterrupt traceback of up to 85 lines, not ``tune: interrupted``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

CLOSED_STDOUT = (
    "tune: error: standard output is closed (>&-); send it to a file or /dev/null instead\n"
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tune`` script."""
    if 1 in _closed_reopened():
        sys.stderr.write(CLOSED_STDOUT)
        return 2
    try:
        from tuner.cli.commands import main as run

        return run(argv)
    except KeyboardInterrupt:  # loading or parsing: a command's own is answered inside it
        sys.stderr.write("tune: interrupted\n")
        return 130


def _closed_reopened() -> tuple[int, ...]:
    """The standard descriptors (0, 1, 2) that were closed when ``tune`` started, each now open
    on /dev/null. Why: Python leaves ``sys.stdout`` None then (the first table was an
    AttributeError's traceback; a closed stderr turned every one-line error into exit status
    1), and the next file ``tune`` opened (the study's database) took the free descriptor, where
    a child process inheriting "its stdout" (ssh, sbatch) would have written into it."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if 1 in closed:
        sys.stdout = open(1, "w", closefd=False)
    if 2 in closed:
        sys.stderr = open(2, "w", closefd=False)
    return tuple(closed)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
