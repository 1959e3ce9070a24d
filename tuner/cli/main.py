"""``tune``: the entry point of the command line (the commands: :mod:`tuner.cli.commands`).

Exit codes: 0 success, 1 the job failed, 2 bad usage or bad input (one line on stderr; the
traceback only with ``--debug``), 130 interrupted, 141 the reader of the output went away
(``tune leaderboard | head -1``: nothing on stderr).

Kept apart from the commands so that it loads nothing: a Ctrl-C in the second or so the command
line takes to load and parse its arguments (a user who sees the wrong study named just after
Enter) was a KeyboardInterrupt traceback of up to 85 lines, not ``tune: interrupted``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tuner.cli.stdout import (
    CLOSED_STDOUT,
    READER_GONE,
    STDOUT,
    closed_reopened,
    gone_descriptors,
    name_stdout,
    reader_gone,
    to_null,
)

__all__ = ["CLOSED_STDOUT", "READER_GONE", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tune`` script."""
    if 1 in closed_reopened():
        sys.stderr.write(CLOSED_STDOUT)
        return 2
    name_stdout()
    try:
        from tuner.cli.commands import main as run

        try:
            return run(argv)
        finally:  # a failed write found here, not in the exit's "Exception ignored"
            sys.stdout.flush()
    except KeyboardInterrupt:  # loading or parsing: a command's own is answered inside it
        sys.stderr.write("tune: interrupted\n")
        return 130
    except BrokenPipeError:  # a command's own, not stdout's, is one line inside it
        if not reader_gone():
            raise
        return to_null(*gone_descriptors())
    except OSError as exc:  # after the command's own one line (tuner.cli.failure): stdout's
        if exc.filename != STDOUT:
            raise
        from tuner.cli.render import visible

        to_null(1)  # what is still buffered goes nowhere: no "Exception ignored" at exit
        sys.stderr.write(f"tune: error: {visible(f'{STDOUT}: {exc.strerror or exc}')}\n")
        return 2  # where it was sent is the bad input, as a closed one (CLOSED_STDOUT)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
