"""What ``tune`` prints and returns when a command fails: one line on stderr and an exit status
(2 for bad input, 1 for a failure of the machine or its files, 130 when interrupted), never a
traceback unless ``--debug`` asks for it."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from tuner.errors import TunerError


def exit_status(exc: BaseException) -> int | None:
    """Write the one line for ``exc`` and return the exit status, or None when ``exc`` is a
    defect of the tool (its traceback is what a bug report needs) or a failure of where the
    output goes (its reader gone, a full device: answered by :mod:`tuner.cli.stdout`)."""
    from tuner.cli.render import visible  # one line, whatever a message quotes

    if isinstance(exc, TunerError):
        sys.stderr.write(f"tune: error: {visible(str(exc))}\n")
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        sys.stderr.write("tune: interrupted\n")
        return 130
    if isinstance(exc, OSError):
        from tuner.cli.stdout import STDOUT, reader_gone

        # `| head -1`, `> /dev/full`: where the output goes, answered by tuner.cli.stdout
        if exc.filename == STDOUT or (isinstance(exc, BrokenPipeError) and reader_gone()):
            return None
    if isinstance(exc, OSError):  # a read-only or full results folder, a file that vanished
        where = f"{exc.filename}: " if exc.filename else ""
        sys.stderr.write(f"tune: error: {visible(f'{where}{exc.strerror or exc}')}\n")
        return 1
    if _from_storage(exc):
        # Opening worked but reading did not: the file at the study's storage path is some other
        # program's SQLite database, or a schema Optuna cannot read. Bad input, not a crash.
        from tuner.study.url import root_cause

        why = "another program's database, or a schema this Optuna cannot read?"
        sys.stderr.write(
            f"tune: error: cannot read the study's storage: {root_cause(exc)} ({why})\n"
        )
        return 2
    return None


def _from_storage(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by Optuna's storage or SQLAlchemy (read without importing
    either: a dry look never loads them)."""
    return any(t.__module__.split(".")[0] in ("optuna", "sqlalchemy") for t in type(exc).__mro__)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill``, a scheduler ending the login session's job, ``timeout``) and SIGHUP
    (the terminal or ssh session closed; not under ``nohup``) raised as
    :class:`KeyboardInterrupt` while a command runs, as Ctrl-C is: by default both end
    Python without unwinding, so a job a command started on other nodes (a profile probe over
    SSH or Slurm) was never cancelled. Unwinding runs every ``except BaseException: cancel``
    on the way out. ``tune run``'s loop installs its own handlers while it runs (stop
    cleanly, record the trials). Only on the main thread (signals are delivered there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    from tuner.study.signals import stopping_signals

    caught = [sig for sig in stopping_signals() if sig != signal.SIGINT]  # SIGINT raises it
    previous = {sig: signal.signal(sig, interrupt) for sig in caught}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
