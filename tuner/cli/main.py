"""``tune``: the entry point of the command line (the commands: :mod:`tuner.cli.commands`).

Exit codes: 0 success, 1 the job failed, 2 bad usage or bad input (one line on stderr; the
traceback only with ``--debug``), 130 interrupted.

Kept apart from the commands so that it loads nothing: a Ctrl-C in the second or so the command
line takes to load and parse its arguments (a user who sees the wrong study named just after
Enter) was a KeyboardInterrupt traceback of up to 85 lines, not ``tune: interrupted``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tune`` script."""
    try:
        from tuner.cli.commands import main as run

        return run(argv)
    except KeyboardInterrupt:  # loading or parsing: a command's own is answered inside it
        sys.stderr.write("tune: interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
