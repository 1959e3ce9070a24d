"""Where ``tune`` writes: its standard descriptors as the command line finds them, and what
it does when the reader of its output is gone or the output cannot be written.

Read by the entry point (:mod:`tuner.cli.main`) and by the one-line errors
(:mod:`tuner.cli.failure`), one definition for both; it loads nothing.
"""

from __future__ import annotations

import io
import os
import select
import sys
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


def reader_gone() -> bool:
    """Whether the program reading stdout or stderr closed its end (``| head -1``), asked of
    the descriptors themselves (a pipe without a reader polls as an error): a child's pipe
    that breaks (ssh's stdin) is an error of its own to report."""
    return bool(gone_descriptors())


def gone_descriptors() -> list[int]:
    """stdout and stderr, those of the two whose reader is gone."""
    gone = []
    for fd in (1, 2):
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0)):
            gone.append(fd)
    return gone


def to_null(*fds: int) -> int:
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


def name_stdout() -> None:
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


def closed_reopened() -> tuple[int, ...]:
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
