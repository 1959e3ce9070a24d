"""An Optuna journal file's last record, checked before a worker appends to it
(:func:`mend_journal`); :mod:`tuner.study.storage` opens the journal."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from optuna.storages.journal import JournalFileSymlinkLock

from tuner.errors import StudyError

logger = logging.getLogger(__name__)

JOURNAL_TAIL_BYTES = 1 << 20
"""How far from its end a journal is read for its last record (a record is a few KiB)."""


def mend_journal(path: Path, lock: JournalFileSymlinkLock) -> None:
    """Check a journal's last record before Optuna appends to it. A torn last record (a worker
    stopped mid-write: no line end) is cut off under the writers' lock: Optuna's reader skips
    it, but appended to, it joined the next record into a line no reader can parse, and the
    study after it was lost to every command (a JSONDecodeError traceback in ``tune run``). A
    last whole line that is no record (an edit, another file) is a :class:`StudyError`."""
    tail, start = _tail(path)
    whole = tail[: tail.rfind(b"\n") + 1]  # up to the last line end: the last whole record
    last = whole.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    if whole == tail:
        if last and not _is_record(last):
            shown = last[:60].decode(errors="backslashreplace")
            raise StudyError(f"cannot open storage {str(path)!r}: its last line is not an "
                             f"Optuna journal record: {shown!r}")  # fmt: skip
        return
    if not _is_record(last):  # no whole record before the tear: no journal to mend
        raise StudyError(f"cannot open storage {str(path)!r}: not an Optuna journal (its last "
                         "line has no line end and no record comes before it)")  # fmt: skip
    lock.acquire()
    try:
        tail, start = _tail(path)  # again, now that no writer is midway
        cut = tail.rfind(b"\n") + 1
        if tail.endswith(b"\n"):
            return  # a writer was midway, and has finished it
        if cut == 0 and start > 0:
            raise StudyError(f"cannot open storage {str(path)!r}: its last "
                             f"{len(tail):,} bytes are one torn record")  # fmt: skip
        with path.open("rb+") as f:
            f.truncate(start + cut)
    finally:
        lock.release()
    logger.warning(
        "%s: cut off its last record, torn by a worker that stopped mid-write "
        "(%d bytes; its trial is recovered from its folder)",
        path,
        len(tail) - cut,
    )


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # not JSON (a JSONDecodeError), not UTF-8 (a UnicodeDecodeError)
        return False


def _tail(path: Path) -> tuple[bytes, int]:
    """The last :data:`JOURNAL_TAIL_BYTES` of ``path`` and where they start."""
    with path.open("rb") as f:
        start = max(0, f.seek(0, os.SEEK_END) - JOURNAL_TAIL_BYTES)
        f.seek(start)
        return f.read(), start
