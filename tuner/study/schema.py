"""Opening a stored study for reading without Optuna's alembic import, when its schema is known
to be current.

``RDBStorage.__init__`` always builds Optuna's schema version manager, which imports alembic
(0.3 to 0.4 s of CPU, a sixth of ``tune leaderboard`` at 10,000 trials) to read the storage's
``alembic_version`` revision and compare it with the newest of Optuna's migration scripts.
:func:`schema_checked` stands a :class:`CheckedVersions` in for that manager while a storage is
opened: it reads the revision with one plain query and the newest script revision from the
scripts' own ``revision`` / ``down_revision`` lines, and when the storage is at that revision
(and has Optuna's version row) nothing else is needed: Optuna's own check would pass. Anything
else (a storage of another schema version, a new one to stamp, a revision it cannot read)
builds Optuna's manager as before, so the same error or migration follows; so does any other
use of the manager (``upgrade``, ``get_all_versions``, ...).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

_REVISION = re.compile(r'^revision\s*=\s*["\']([^"\']+)["\']', re.MULTILINE)
_DOWN = re.compile(r'^down_revision\s*=\s*["\']([^"\']+)["\']', re.MULTILINE)


@functools.cache
def head_revision() -> str | None:
    """The newest revision of Optuna's migration scripts (the one no script revises), None
    if they do not name exactly one."""
    import optuna.storages._rdb as rdb

    revisions, revised = set(), set()
    for script in (Path(rdb.__file__).parent / "alembic" / "versions").glob("*.py"):
        text = script.read_text(encoding="utf-8")
        revisions.update(_REVISION.findall(text))
        revised.update(_DOWN.findall(text))
    heads = revisions - revised
    return heads.pop() if len(heads) == 1 else None


def at_head(engine: sa.Engine) -> bool:
    """Whether the storage's ``alembic_version`` is :func:`head_revision` and its
    ``version_info`` row exists (what Optuna's check reads; any failure to read: False)."""
    head = head_revision()
    if head is None:
        return False
    try:
        with engine.connect() as conn:
            revisions = conn.execute(sa.text("SELECT version_num FROM alembic_version"))
            stamped = [r[0] for r in revisions]
            info = conn.execute(sa.text("SELECT COUNT(*) FROM version_info")).scalar()
    except sa.exc.SQLAlchemyError:
        return False
    return stamped == [head] and bool(info)


class CheckedVersions:
    """Stands in for Optuna's ``_VersionManager`` (same constructor): nothing more when the
    storage is at the head revision (:func:`at_head`), Optuna's manager otherwise and for any
    other use."""

    def __init__(self, url: str, engine: sa.Engine, scoped_session: Any) -> None:
        self._args = (url, engine, scoped_session)
        self._manager: Any = None
        if not at_head(engine):
            self._optunas()

    def _optunas(self) -> Any:
        if self._manager is None:
            self._manager = optuna_manager()(*self._args)
        return self._manager

    def check_table_schema_compatibility(self) -> None:
        """Optuna's check where the storage is not known to be at the head revision."""
        if self._manager is not None:
            self._manager.check_table_schema_compatibility()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._optunas(), name)


@functools.cache
def optuna_manager() -> Any:
    """Optuna's ``_VersionManager`` (read before :func:`schema_checked` first stands in for
    it: it is the first to call this), None where its storage module has none."""
    from optuna.storages._rdb import storage

    return getattr(storage, "_VersionManager", None)


@contextlib.contextmanager
def schema_checked() -> Iterator[None]:
    """Storages opened inside check their schema by :class:`CheckedVersions` (where Optuna's
    storage module has the manager this replaces; otherwise unchanged)."""
    from optuna.storages._rdb import storage

    own, name = optuna_manager(), "_VersionManager"
    if own is None or getattr(storage, name, None) is not own:
        yield  # no manager to stand in for, or already stood in for
        return
    setattr(storage, name, CheckedVersions)  # what RDBStorage.__init__ builds, by this name
    try:
        yield
    finally:
        setattr(storage, name, own)
