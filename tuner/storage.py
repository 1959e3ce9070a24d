"""A study's storage: opening it safely, heartbeats, and the node leases that live beside it.

The storage is SQLite under ``results/<study>/`` by default, any SQLAlchemy URL (PostgreSQL for
workers on several machines), or an Optuna journal file. Several ``tune run`` workers share one
study through it, so everything that must be true across workers is decided here, never in one
worker's memory:

* **Creating** a new storage is safe when workers start at the same moment (Optuna's schema
  creation races: two processes both find no ``alembic_version`` and both insert one). Opening
  and creating the study are serialised by a lock file beside a local database, and retried on
  a server database.
* **Node leases**: a node (and a rendezvous port) runs one trial at a time, whichever worker
  launched it. A lease is claimed atomically (one row per resource under a primary key, or one
  file rewritten under ``flock`` for a journal), renewed with the holder's heartbeat and
  expires when four beats are missed; before an expired lease is taken over, the dead
  holder's processes on those nodes are ended (:mod:`tuner.schedule`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import optuna
import sqlalchemy as sa
from optuna.storages.journal import JournalFileBackend

from tuner.errors import StudyError
from tuner.layout import ResultsLayout

logger = logging.getLogger(__name__)

T = TypeVar("T")
MISSED_BEATS = 4
"""Heartbeats a worker may miss before it is taken as dead."""


@dataclass(frozen=True, slots=True)
class StorageURL:
    """Where a study lives, resolved: an SQLAlchemy URL or a journal file path."""

    url: str
    journal: Path | None = None

    @property
    def local_file(self) -> Path | None:
        """The database or journal file when it is a file here (SQLite or journal)."""
        if self.journal is not None:
            return self.journal
        if self.url.startswith("sqlite:///"):
            return Path(self.url.removeprefix("sqlite:///"))
        return None


def resolve_url(url: str | None, layout: ResultsLayout) -> StorageURL:
    """SQLite under results/ by default; an RDB URL; or a journal file (``*.log``/``journal:``)."""
    if url is None:
        return StorageURL(f"sqlite:///{layout.storage_path.resolve()}")
    if url.startswith("journal:") or url.endswith((".log", ".journal")):
        return StorageURL(url, journal=Path(url.removeprefix("journal:")))
    return StorageURL(url)


@contextlib.contextmanager
def creation_lock(where: StorageURL) -> Iterator[None]:
    """Serialise opening and creating a study among the workers of this machine (a local file
    database or journal); a server database needs none (see :func:`_retrying`)."""
    target = where.local_file
    if target is None:
        yield
        return
    try:
        f = target.with_name(target.name + ".lock").open("a")
    except OSError:  # a read-only results folder: nothing can be created there anyway
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _retrying(what: str, fn: Callable[[], T], attempts: int = 5) -> T:
    """``fn`` again after a short pause when a concurrent schema creation made it fail."""
    for k in range(attempts):
        try:
            return fn()
        except (sa.exc.IntegrityError, sa.exc.OperationalError, sa.exc.ProgrammingError):
            if k == attempts - 1:
                raise
            logger.debug("%s raced with another worker; retrying", what)
            time.sleep(0.2 * (k + 1))
    raise AssertionError("unreachable")


def open_storage(
    url: str | None, layout: ResultsLayout, *, heartbeat_s: float = 30.0
) -> optuna.storages.BaseStorage:
    """Open (creating if needed) the storage of a study; one-line :class:`StudyError` if not.

    RDB storages get heartbeats: the running trials of a worker that died are failed by the
    next worker that looks, which re-runs them as interrupted.
    """
    where = resolve_url(url, layout)
    target = where.local_file
    try:
        if target is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
        with creation_lock(where):
            return _open(where, heartbeat_s)
    except StudyError:
        raise
    except Exception as exc:  # SQLAlchemy raises many types for a bad URL or an unreachable DB
        raise StudyError(f"cannot open storage {where.url!r}: {root_cause(exc)}") from None


def _open(where: StorageURL, heartbeat_s: float) -> optuna.storages.BaseStorage:
    if where.journal is not None:
        return optuna.storages.JournalStorage(JournalFileBackend(str(where.journal)))
    sqlite = where.url.startswith("sqlite")

    def make() -> optuna.storages.RDBStorage:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                where.url,
                heartbeat_interval=max(1, round(heartbeat_s)),
                grace_period=max(1, round(MISSED_BEATS * heartbeat_s)),
                engine_kwargs={"connect_args": {"timeout": 60}} if sqlite else {},
            )

    return _retrying(f"opening {where.url}", make)


def root_cause(exc: BaseException) -> str:
    """The first line of the innermost cause: "database or disk is full", not the wrapper's
    "(Background on this error at: ...)"."""
    inner: BaseException = exc
    while True:
        nxt = getattr(inner, "orig", None) or inner.__cause__ or inner.__context__
        if nxt is None or nxt is inner:
            break
        inner = nxt
    text = str(inner).strip().splitlines()
    return text[0] if text else type(inner).__name__


def create_or_load(
    name: str, storage: optuna.storages.BaseStorage, url: str | None, layout: ResultsLayout,
    sampler: optuna.samplers.BaseSampler,
) -> optuna.Study:  # fmt: skip
    """Create the study or join it; safe when several workers do this at the same moment."""

    def make() -> optuna.Study:
        return optuna.create_study(
            study_name=name, storage=storage, direction="minimize", sampler=sampler,
            load_if_exists=True,
        )  # fmt: skip

    with creation_lock(resolve_url(url, layout)):
        return _retrying(f"creating study {name}", make)


def record_heartbeats(storage: optuna.storages.BaseStorage, study_id: int,
                      numbers: Sequence[int]) -> None:  # fmt: skip
    """Mark the trials ``numbers`` of a study alive (storages without heartbeats: nothing)."""
    if not isinstance(storage, optuna.storages.RDBStorage):
        return
    for number in numbers:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        storage.record_heartbeat(trial_id)


# ----------------------------------------------------------------------------- node leases


@dataclass(frozen=True, slots=True)
class Lease:
    """One resource (``host:NAME`` or ``port:ADDR:PORT``) held by one worker for one trial."""

    resource: str
    holder: str
    """The worker (``host:pid:nonce``) that holds it."""
    renewed_at: float
    """Unix time of the holder's last heartbeat for it."""
    trial: int | None = None
    """The trial running on it, once launched."""
    token: str | None = None
    """The trial's process token (ends its processes if the holder dies)."""
    hosts: tuple[str, ...] = ()
    """Every node of that trial."""
    node_dir: str | None = None
    """The trial directory on the nodes."""

    def expired(self, now: float, heartbeat_s: float) -> bool:
        """Whether its holder missed :data:`MISSED_BEATS` heartbeats."""
        return now - self.renewed_at > MISSED_BEATS * heartbeat_s


class LeaseConflict(Exception):
    """A claim met leases held by others (``held``)."""

    def __init__(self, held: Sequence[Lease]) -> None:
        self.held = tuple(held)
        super().__init__(", ".join(f"{x.resource} ({x.holder})" for x in held))


class Leases:
    """The node leases of one study, shared by every worker through the study's storage.

    ``claim`` takes all of ``resources`` or none (:class:`LeaseConflict` names those held by
    another worker, expired or not); ``take_over`` removes expired leases of a dead holder
    after the caller has made sure nothing of its trial runs any more.
    """

    def __init__(self, backend: _Backend, study: str, *, clock: Callable[[], float] = time.time):
        self._b = backend
        self._study = study
        self._clock = clock

    def claim(self, resources: Sequence[str], holder: str, **details: Any) -> None:
        """Hold ``resources`` for ``holder`` (atomically, all or none)."""
        now = self._clock()
        rows = [Lease(r, holder, now, **details) for r in resources]
        self._b.insert(self._study, rows)

    def attach(self, holder: str, resources: Sequence[str], **details: Any) -> None:
        """Record the trial (number, token, hosts, node dir) that runs on held ``resources``."""
        self._b.update(self._study, holder, resources, details)

    def renew(self, holder: str) -> None:
        """A heartbeat for every lease of ``holder``."""
        self._b.update(self._study, holder, None, {"renewed_at": self._clock()})

    def release(self, holder: str, resources: Sequence[str]) -> None:
        """Give ``resources`` back."""
        self._b.delete(self._study, holder, resources, None)

    def take_over(self, lease: Lease) -> None:
        """Remove ``lease`` if it is still exactly as read (same holder, not renewed since)."""
        self._b.delete(self._study, lease.holder, [lease.resource], lease.renewed_at)

    def held(self, resources: Sequence[str] | None = None) -> list[Lease]:
        """The leases on ``resources`` (all when None)."""
        return self._b.select(self._study, resources)


def open_leases(url: str | None, layout: ResultsLayout) -> Leases:
    """The leases of the study whose storage is ``url`` (same defaults as :func:`open_storage`)."""
    where = resolve_url(url, layout)
    if where.journal is not None:
        return Leases(_FileBackend(where.journal.with_name(where.journal.name + ".leases")),
                      layout.study)  # fmt: skip
    return Leases(_SQLBackend(where.url), layout.study)


class _Backend:
    def insert(self, study: str, rows: Sequence[Lease]) -> None:
        raise NotImplementedError

    def update(self, study: str, holder: str, resources: Sequence[str] | None,
               values: dict[str, Any]) -> None:  # fmt: skip
        raise NotImplementedError

    def delete(self, study: str, holder: str, resources: Sequence[str],
               renewed_at: float | None) -> None:  # fmt: skip
        raise NotImplementedError

    def select(self, study: str, resources: Sequence[str] | None) -> list[Lease]:
        raise NotImplementedError


_META = sa.MetaData()
_TABLE = sa.Table(
    "tuner_node_leases", _META,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("resource", sa.String(512), primary_key=True),
    sa.Column("holder", sa.String(256), nullable=False),
    sa.Column("renewed_at", sa.Float, nullable=False),
    sa.Column("trial", sa.Integer),
    sa.Column("token", sa.String(64)),
    sa.Column("hosts", sa.Text),
    sa.Column("node_dir", sa.Text),
)  # fmt: skip


def _to_row(study: str, lease: Lease) -> dict[str, Any]:
    row = asdict(lease)
    row["hosts"] = json.dumps(list(lease.hosts))
    return {"study": study, **row}


def _from_row(row: Any) -> Lease:
    m = dict(row._mapping)
    return Lease(m["resource"], m["holder"], float(m["renewed_at"]), m["trial"], m["token"],
                 tuple(json.loads(m["hosts"] or "[]")), m["node_dir"])  # fmt: skip


class _SQLBackend(_Backend):
    """One row per resource; the primary key makes a claim atomic on any SQL database."""

    def __init__(self, url: str) -> None:
        args = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        self._engine = sa.create_engine(url, **args)
        _retrying("creating the lease table", lambda: _META.create_all(self._engine))

    def insert(self, study: str, rows: Sequence[Lease]) -> None:
        try:
            with self._engine.begin() as conn:
                conn.execute(sa.insert(_TABLE), [_to_row(study, r) for r in rows])
        except sa.exc.IntegrityError:
            held = self.select(study, [r.resource for r in rows])
            raise LeaseConflict([x for x in held if x.holder != rows[0].holder]) from None

    def update(self, study: str, holder: str, resources: Sequence[str] | None,
               values: dict[str, Any]) -> None:  # fmt: skip
        if "hosts" in values:
            values = {**values, "hosts": json.dumps(list(values["hosts"]))}
        q = sa.update(_TABLE).where(_TABLE.c.study == study, _TABLE.c.holder == holder)
        if resources is not None:
            q = q.where(_TABLE.c.resource.in_(list(resources)))
        with self._engine.begin() as conn:
            conn.execute(q.values(**values))

    def delete(self, study: str, holder: str, resources: Sequence[str],
               renewed_at: float | None) -> None:  # fmt: skip
        q = sa.delete(_TABLE).where(_TABLE.c.study == study, _TABLE.c.holder == holder,
                                    _TABLE.c.resource.in_(list(resources)))  # fmt: skip
        if renewed_at is not None:
            q = q.where(_TABLE.c.renewed_at == renewed_at)
        with self._engine.begin() as conn:
            conn.execute(q)

    def select(self, study: str, resources: Sequence[str] | None) -> list[Lease]:
        q = sa.select(_TABLE).where(_TABLE.c.study == study)
        if resources is not None:
            q = q.where(_TABLE.c.resource.in_(list(resources)))
        with self._engine.connect() as conn:
            return [_from_row(r) for r in conn.execute(q)]


class _FileBackend(_Backend):
    """One JSON file beside the journal, read and rewritten under an exclusive ``flock``."""

    def __init__(self, path: Path) -> None:
        self._path = path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, Any]]]:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with self._path.open("a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.seek(0)
                text = f.read()
                data: dict[str, dict[str, Any]] = json.loads(text) if text.strip() else {}
                before = json.dumps(data, sort_keys=True)
                yield data
                after = json.dumps(data, sort_keys=True)
                if after != before:
                    f.seek(0)
                    f.truncate()
                    f.write(after)
                    f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    @staticmethod
    def _key(study: str, resource: str) -> str:
        return f"{study}\n{resource}"

    def insert(self, study: str, rows: Sequence[Lease]) -> None:
        with self._locked() as data:
            keys = [self._key(study, r.resource) for r in rows]
            held = [self._lease(data[k]) for k in keys if k in data]
            if held:
                raise LeaseConflict([x for x in held if x.holder != rows[0].holder])
            for r in rows:
                data[self._key(study, r.resource)] = {**asdict(r), "hosts": list(r.hosts)}

    def update(self, study: str, holder: str, resources: Sequence[str] | None,
               values: dict[str, Any]) -> None:  # fmt: skip
        with self._locked() as data:
            for k, row in data.items():
                if k.split("\n", 1)[0] != study or row["holder"] != holder:
                    continue
                if resources is None or row["resource"] in resources:
                    row.update({n: list(v) if n == "hosts" else v for n, v in values.items()})

    def delete(self, study: str, holder: str, resources: Sequence[str],
               renewed_at: float | None) -> None:  # fmt: skip
        with self._locked() as data:
            for r in resources:
                row = data.get(self._key(study, r))
                if row is None or row["holder"] != holder:
                    continue
                if renewed_at is None or row["renewed_at"] == renewed_at:
                    del data[self._key(study, r)]

    def select(self, study: str, resources: Sequence[str] | None) -> list[Lease]:
        with self._locked() as data:
            return [
                self._lease(row) for k, row in data.items()
                if k.split("\n", 1)[0] == study and (resources is None or row["resource"]
                                                     in resources)
            ]  # fmt: skip

    @staticmethod
    def _lease(row: dict[str, Any]) -> Lease:
        return Lease(**{**row, "hosts": tuple(row.get("hosts") or ())})
