"""When the study's storage fails mid-study: one message with the real cause and the file.

A failing storage shows up as many errors at once: the heartbeat thread's next beat, the trial
being recorded, every trial cancelled after it, each wrapped by SQLAlchemy and Optuna in words of
their own ("An exception is raised during the commit ... exceeding max length"). The worker stops
at the first one (:class:`StorageFailure`, raised by :func:`tuner.study.record.storage_errors`)
and :class:`StorageWatch` says what happened to the file: deleted, replaced, its folder made
read-only, the disk full. The CLI prints that one line; the rest is logged at debug level.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tuner.errors import StorageError
from tuner.study.url import root_cause, without_password


class StorageFailure(StorageError):
    """The storage failed while ``what`` was done; ``original`` is what was raised."""

    def __init__(self, what: str, original: BaseException) -> None:
        self.what = what
        self.original = original
        super().__init__(f"{what}: the study storage failed: {_cause(original)}")


def _cause(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return root_cause(exc)


class StorageWatch:
    """Knows the study's storage file (SQLite or journal; None for a server database) as it
    was when the study opened it, to tell later what became of it."""

    def __init__(self, file: Path | None, url: str) -> None:
        self.file = file
        self.url = without_password(url)
        self._inode = _inode(file)

    def explain(self, exc: StorageError) -> StorageError:
        """``exc`` as one message naming the real cause and the file (or URL)."""
        original = exc.original if isinstance(exc, StorageFailure) else exc
        what = f"{exc.what}: " if isinstance(exc, StorageFailure) else ""
        if isinstance(original, OSError) and original.filename:
            return StorageError(f"{what}{_cause(original)}")  # a trial's file, named already
        cause = root_cause(original)
        if self.file is None:
            return StorageError(f"{what}the study storage {self.url} failed: {cause}")
        inode = _inode(self.file)
        if inode is None:
            return StorageError(f"{what}the study storage {self.file} was deleted while the "
                                f"study ran ({cause})")  # fmt: skip
        if inode != self._inode:
            return StorageError(f"{what}the study storage {self.file} was replaced while the "
                                f"study ran ({cause})")  # fmt: skip
        folder = self.file.parent
        if not os.access(folder, os.W_OK) or not os.access(self.file, os.W_OK):
            return StorageError(f"{what}the study storage {self.file} cannot be written: its "
                                f"folder or file is read-only ({cause})")  # fmt: skip
        if shutil.disk_usage(folder).free < 1 << 20:
            return StorageError(f"{what}the study storage {self.file} failed: the disk is full "
                                f"({cause})")  # fmt: skip
        return StorageError(f"{what}the study storage {self.file} failed: {cause}")


def _inode(file: Path | None) -> tuple[int, int] | None:
    try:
        st = os.stat(file) if file is not None else None
    except OSError:
        return None
    return None if st is None else (st.st_dev, st.st_ino)
