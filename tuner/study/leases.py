"""Node leases: a node (and a rendezvous port, and a running config) is used by one trial at a
time, whichever worker of the study launched it.

A lease is claimed atomically (one row per resource under a primary key in the study's SQL
database, or one file beside a journal rewritten under ``flock``), renewed with the holder's
heartbeat and expires when :data:`MISSED_BEATS` beats are missed, or at once when its holder is
provably dead (:mod:`tuner.study.holder`); before such a lease is taken over, the dead holder's
processes on those nodes are ended (:mod:`tuner.study.schedule`).
A study-wide ``budget:`` lease is held (:func:`exclusive`) while a worker counts the runs
and launches one, so two workers never overshoot ``n_trials`` together, and while it claims a
proxy's confirmation, so two workers never confirm one config twice.
Times are the workers' own clocks (NTP-synchronised login nodes differ by far less than a beat).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tuner.errors import StudyError
from tuner.layout import ResultsLayout, held, write_atomic
from tuner.study.driver import connect_args
from tuner.study.holder import provably_dead
from tuner.study.storage import MISSED_BEATS, retrying
from tuner.study.url import resolve_url

logger = logging.getLogger(__name__)

BUDGET_LEASE = "budget:"
"""The study-wide lease a worker holds (:func:`exclusive`) while it counts the runs and launches
one, or claims a proxy's confirmation (:mod:`tuner.study.proxy`)."""


@dataclass(frozen=True, slots=True)
class Lease:
    """One resource (``host:NAME`` or ``port:ADDR:PORT``) held by one worker for one trial."""

    resource: str
    holder: str
    """The worker that holds it (:func:`tuner.study.holder.worker_name`)."""
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

    def lost(self, now: float, heartbeat_s: float) -> bool:
        """Whether its holder is gone: it missed :data:`MISSED_BEATS` heartbeats, or it is
        provably dead (:func:`tuner.study.holder.provably_dead`) and need not be waited out."""
        return self.expired(now, heartbeat_s) or provably_dead(self.holder)


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

    def release_all(self, holder: str) -> None:
        """Give back every lease ``holder`` still has (a worker on its way out)."""
        mine = [x.resource for x in self.held() if x.holder == holder]
        if mine:
            self.release(holder, mine)

    def take_over(self, lease: Lease) -> None:
        """Remove ``lease`` if it is still exactly as read (same holder, not renewed since)."""
        self._b.delete(self._study, lease.holder, [lease.resource], lease.renewed_at)

    def held(self, resources: Sequence[str] | None = None) -> list[Lease]:
        """The leases on ``resources`` (all when None)."""
        return self._b.select(self._study, resources)


@contextlib.contextmanager
def exclusive(leases: Leases, resource: str, holder: str, heartbeat_s: float) -> Iterator[bool]:
    """Hold ``resource`` alone for the block: yields True, or False when a live worker holds it.

    A lease its holder stopped renewing (a dead worker) is taken over. Released on exit."""
    try:
        leases.claim([resource], holder)
    except LeaseConflict as conflict:
        now = time.time()
        stale = [x for x in conflict.held if x.lost(now, heartbeat_s)]
        if len(stale) < len(conflict.held):
            yield False
            return
        for lease in stale:
            leases.take_over(lease)
        try:
            leases.claim([resource], holder)
        except LeaseConflict:
            yield False
            return
    try:
        yield True
    finally:
        leases.release(holder, [resource])


def give_back(leases: Leases, holder: str) -> None:
    """Release every lease ``holder`` still has, when the storage lets it: a worker on its way
    out. When it cannot, the next start on this machine takes them over at once
    (:mod:`tuner.study.holder`), elsewhere once they expire."""
    try:
        leases.release_all(holder)
    except Exception as exc:  # a failed storage: the error on its way out already says so
        logger.debug("could not give back the leases of %s: %s", holder, exc)


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
        self._engine = sa.create_engine(url, connect_args=connect_args(url))
        retrying("creating the lease table", lambda: _META.create_all(self._engine))

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
    """One JSON file beside the journal, read and replaced whole under an exclusive ``flock`` of
    a lock file beside it (the data file is renamed over, so the lock cannot be on it): a worker
    killed mid-write, or a full disk, left it cut short, and every later command a traceback."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = path.with_name(path.name + ".lock")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, Any]]]:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock.open("a") as f, held(f):
            data = self._read()
            before = json.dumps(data, sort_keys=True)
            yield data
            after = json.dumps(data, sort_keys=True)
            if after != before:
                write_atomic(self._path, after)

    def _read(self) -> dict[str, dict[str, Any]]:
        """The leases in the file; a StudyError naming it when it holds no leases."""
        try:
            text = self._path.read_text(encoding="utf-8") if self._path.exists() else ""
            data = json.loads(text) if text.strip() else {}
            if not isinstance(data, dict):
                raise ValueError("not a JSON object of leases")
            for key, row in data.items():
                if not isinstance(row, dict) or "\n" not in key:
                    raise ValueError(f"{key[:40]!r} is no lease")
                lease = self._lease(row)
                if not isinstance(lease.renewed_at, int | float) or not all(
                    isinstance(v, str) for v in (lease.resource, lease.holder)
                ):
                    raise ValueError(f"{key[:40]!r} is no lease")
        except (OSError, ValueError, TypeError) as exc:
            raise StudyError(
                f"the node leases {self._path} cannot be read ({exc}): another program's file, "
                "or edited; remove it once no worker of the study runs"
            ) from None
        return data

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
