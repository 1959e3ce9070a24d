"""What ``tune`` prints and returns when a command fails: one line on stderr and an exit status
(2 for bad input, 1 for a failure of the machine or its files, 130 when interrupted), never a
traceback unless ``--debug`` asks for it."""

from __future__ import annotations

import sys

from tuner.errors import TunerError


def exit_status(exc: BaseException) -> int | None:
    """Write the one line for ``exc`` and return the exit status, or None when ``exc`` is a
    defect of the tool (its traceback is what a bug report needs)."""
    if isinstance(exc, TunerError):
        sys.stderr.write(f"tune: error: {exc}\n")
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        sys.stderr.write("tune: interrupted\n")
        return 130
    if isinstance(exc, OSError):  # a read-only or full results folder, a file that vanished
        where = f"{exc.filename}: " if exc.filename else ""
        sys.stderr.write(f"tune: error: {where}{exc.strerror or exc}\n")
        return 1
    if _from_storage(exc):
        # Opening worked but reading did not: the file at the study's storage path is some other
        # program's SQLite database, or a schema Optuna cannot read. Bad input, not a crash.
        from tuner.study.storage import root_cause

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
