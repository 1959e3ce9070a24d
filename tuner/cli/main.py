"""``tune``: the entry point of the command line (the commands: :mod:`tuner.cli.commands`).

Exit codes: 0 success, 1 the job failed, 2 bad usage or bad input (one line on stderr; the
traceback only with ``--debug``), 130 interrupted, 141 the reader of the output went away
(``tune leaderboard | head -1``: nothing on stderr).

Kept apart from the commands so that it loads nothing: a Ctrl-C in the second or so the command
line takes to load and parse its arguments (a user who sees the wrong study named just after
Enter) was a KeyboardInterrupt traceback of up to 85 lines, not ``tune: interrupted``.
"""

from __future__ import annotations

import io
import os
import select
import sys
from collections.abc import Sequence
from typing import Any

CLOSED_STDOUT = (
    "tune: error: standard output is closed (>&-); send it to a file or /dev/null instead\n"
)
STDOUT = "standard output"
"""The name a failed write to stdout carries (:class:`_NamedStdout`)."""
READER_GONE = 128 + 13
"""The exit status when the program reading the output closed it (``| head -1``): what the
shell reports for every Unix tool killed by SIGPIPE (``seq 1000000 | head -1``: 141), so a
script under ``set -o pipefail`` tells a cut-short output from a whole one (0 would say the
output was all written). Returned, not died of: the signal would end a ``tune run`` without
recording its trials, and a child's pipe (ssh's) that breaks is an error to report."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tune`` script."""
    if 1 in _closed_reopened():
        sys.stderr.write(CLOSED_STDOUT)
        return 2
    _name_stdout()
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
        return _to_null(*_gone())
    except OSError as exc:  # after the command's own one line (tuner.cli.failure): stdout's
        if exc.filename != STDOUT:
            raise
        from tuner.cli.render import visible

        _to_null(1)  # what is still buffered goes nowhere: no "Exception ignored" at exit
        sys.stderr.write(f"tune: error: {visible(f'{STDOUT}: {exc.strerror or exc}')}\n")
        return 2  # where it was sent is the bad input, as a closed one (CLOSED_STDOUT)


def reader_gone() -> bool:
    """Whether the program reading stdout or stderr closed its end (``| head -1``), asked of
    the descriptors themselves (a pipe without a reader polls as an error): a child's pipe
    that breaks (ssh's stdin) is an error of its own to report."""
    return bool(_gone())


def _gone() -> list[int]:
    """stdout and stderr, those of the two whose reader is gone."""
    gone = []
    for fd in (1, 2):
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0)):
            gone.append(fd)
    return gone


def _to_null(*fds: int) -> int:
    """What every command does when its reader is gone, decided here alone: no word (there is
    no one to read it) and :data:`READER_GONE`. Each such descriptor is pointed at /dev/null,
    so what is still buffered (the interpreter's at exit) goes nowhere and says nothing
    ("Exception ignored ... BrokenPipeError"). Before, a table's end was rich's exit status
    1, ``--help``'s argparse's 0, a JSON document's "tune: error: Broken pipe" and 1,
    ``--version``'s a traceback."""
    for fd in fds:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    return READER_GONE


class _NamedStdout(io.FileIO):
    """Descriptor 1, whose failed writes name it: "No space left on device" (``> /dev/full``,
    a full disk or quota under ``> out.txt``) named nothing, read as the results folder's."""

    def write(self, data: Any, /) -> int:
        try:
            return super().write(data)
        except BrokenPipeError:  # the reader gone: reader_gone() answers it
            raise
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, STDOUT) from None


def _name_stdout() -> None:
    """``sys.stdout`` written through :class:`_NamedStdout`, as it was in every other way
    (encoding, errors, buffering); left alone where it is not the process's own (a test's)."""
    out = sys.stdout
    if out is not sys.__stdout__ or type(out) is not io.TextIOWrapper:
        return
    raw = _NamedStdout(1, "w", closefd=False)
    buffered = isinstance(out.buffer, io.BufferedWriter)  # none under python -u
    out.flush()
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(raw) if buffered else raw, encoding=out.encoding, errors=out.errors,
        newline="\n", line_buffering=out.line_buffering, write_through=out.write_through,
    )  # fmt: skip


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
