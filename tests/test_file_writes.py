"""A file written whole and a file held alone (in :mod:`tuner.layout`): one definition of each,
which every writer and every lock of the package goes through."""

from __future__ import annotations

import ast
import errno
import os
import threading
import time
from pathlib import Path, PurePosixPath

import pytest

from tuner.layout import beside, held, temp_beside, write_atomic

PACKAGE = Path(__file__).resolve().parents[1] / "tuner"


def _modules_importing(name: str) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name == name for a in node.names):
                found.append(str(path.relative_to(PACKAGE.parent)))
            elif isinstance(node, ast.ImportFrom) and node.module == name:
                found.append(str(path.relative_to(PACKAGE.parent)))
    return found


def test_only_the_layout_takes_a_lock_or_names_a_copy_being_written() -> None:
    """The study's creation lock, the calibration's merge lock and the journal's lease file
    each took their ``flock`` in code of their own, and the calibration's save and the SSH
    executor's upload each named their half-written copy their own way (the save wrote
    ``write_atomic`` again, less its removal of the copy on failure): one definition each."""
    assert _modules_importing("fcntl") == ["tuner/layout.py"]
    named = [
        str(p.relative_to(PACKAGE.parent)) for p in sorted(PACKAGE.rglob("*.py"))
        if '.tmp"' in p.read_text() and p.name != "layout.py"
    ]  # fmt: skip
    assert named == []


def test_a_whole_write_returns_the_status_the_file_has(tmp_path: Path) -> None:
    """The calibration keys its cache by the written file's status; the copy's status before
    the rename is the file's after it (same inode, size and modification time)."""
    path = tmp_path / "c.yaml"
    written = write_atomic(path, "a: 1\n", mode=0o600)
    now = path.stat()
    assert (written.st_ino, written.st_size, written.st_mtime_ns) == (
        now.st_ino, now.st_size, now.st_mtime_ns,
    )  # fmt: skip
    assert now.st_mode & 0o777 == 0o600 and path.read_text() == "a: 1\n"
    assert sorted(os.listdir(tmp_path)) == ["c.yaml"]


def test_a_failed_whole_write_leaves_the_file_and_no_copy(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "\udcff")  # a lone surrogate: no UTF-8 for it
    assert path.read_text() == "old\n" and sorted(os.listdir(tmp_path)) == ["c.yaml"]


def test_a_whole_write_that_fails_names_the_file_asked_for(tmp_path: Path) -> None:
    """``tune report --out /proc/r.html`` said "/proc/.r.html.5356acd3.tmp: No such file or
    directory", a file the user never named."""
    path = tmp_path / "gone" / "r.html"
    with pytest.raises(OSError) as failed:
        write_atomic(path, "x")
    assert failed.value.filename == str(path)


def test_a_copy_the_file_system_will_not_remove_hides_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a read-only file system the cleanup's unlink failed too (EROFS, not "missing"), and
    its error, naming the hidden copy, replaced the write's."""

    def refused(self: Path, missing_ok: bool = False) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    def write_refused(self: Path, *_args: object, **_kwargs: object) -> int:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "unlink", refused)
    monkeypatch.setattr(Path, "write_text", write_refused)
    path = tmp_path / "r.html"
    with pytest.raises(OSError) as failed:
        write_atomic(path, "x")
    assert failed.value.errno == errno.EROFS and failed.value.filename == str(path)


def test_each_writer_names_its_own_copy() -> None:
    a, b = temp_beside(Path("/d/x.db")), temp_beside(Path("/d/x.db"))
    assert a != b and a.parent == Path("/d") and a.name.startswith(".x.db.")
    assert isinstance(temp_beside(PurePosixPath("/n/launch.sh")), PurePosixPath)
    assert beside(Path("/d/x.db"), ".create-lock") == Path("/d/x.db.create-lock")


def test_a_held_file_is_held_alone(tmp_path: Path) -> None:
    """A second holder (another open of the same file, as another process makes) waits until
    the first lets go."""
    lock = tmp_path / "x.lock"
    order: list[str] = []
    with lock.open("a") as first, held(first):

        def second() -> None:
            with lock.open("a") as f, held(f):
                order.append("second")

        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.2)
        order.append("first")
    t.join(timeout=10)
    assert order == ["first", "second"]
