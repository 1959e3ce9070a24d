"""A study's storage: opening it safely, heartbeats, and the node leases that live beside it.

The storage is SQLite under ``results/<study>/`` by default, any SQLAlchemy URL (PostgreSQL for
workers on several machines), or an Optuna journal file. Several ``tune run`` workers share one
study through it, so everything that must be true across workers is decided here, never in one
worker's memory:

* **Creating** a new storage is safe when workers start at the same moment (Optuna's schema
  creation races: two processes both find no ``alembic_version`` and both insert one). Opening
  and creating the study are serialised by a lock file beside a local database, and retried on
  a server database. ``tune run`` holds that lock across both, and removes a local database or
  journal it made when the study was not made in it (a Ctrl-C during the schema's creation).
* **Node leases**: a node (and a rendezvous port) runs one trial at a time, whichever worker
  launched it. A lease is claimed atomically (one row per resource under a primary key, or one
  file rewritten under ``flock`` for a journal), renewed with the holder's heartbeat and
  expires when four beats are missed; before an expired lease is taken over, the dead
  holder's processes on those nodes are ended (:mod:`tuner.study.schedule`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import optuna
import sqlalchemy as sa
from optuna.distributions import (
    BaseDistribution,
    check_distribution_compatibility,
    distribution_to_json,
    json_to_distribution,
)
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

from tuner.errors import StudyError
from tuner.layout import ResultsLayout, beside, held
from tuner.spec.study import StudySpec
from tuner.study.driver import connect_args
from tuner.study.journal import mend_journal
from tuner.study.row_attrs import ROW_ATTR, ROW_KEYS, kept_text
from tuner.study.url import (
    StorageURL,
    arguments_refused,
    resolve_url,
    root_cause,
    without_password,
)

logger = logging.getLogger(__name__)

FINGERPRINT_ATTR = "tuner_spec_fingerprint"
"""Study attribute: the fingerprint of the study file the study was started with."""

T = TypeVar("T")
MISSED_BEATS = 4
"""Heartbeats a worker may miss before it is taken as dead (Optuna's grace period)."""


CREATION_LOCK_SUFFIX = ".create-lock"
"""The creation lock's file beside the database or journal. Not ``.lock``: that is Optuna's
journal writers' lock (``FILE.lock``, a symbolic link), which waited 30 s for tuner's file of
that name at every start of ``tune run`` on a journal, then deleted it under its holder."""


@contextlib.contextmanager
def creation_lock(where: StorageURL) -> Iterator[None]:
    """Serialise opening and creating a study among the workers of this machine (a local file
    database or journal); a server database needs none (see :func:`_retrying`)."""
    target = where.local_file
    if target is None:
        yield
        return
    try:
        f = beside(target, CREATION_LOCK_SUFFIX).open("a")
    except OSError:  # a read-only results folder: nothing can be created there anyway
        yield
        return
    with f, held(f):
        yield


def retrying(what: str, fn: Callable[[], T], attempts: int = 5) -> T:
    """``fn`` again after a short pause when a concurrent schema creation made it fail; a
    server that could not be reached at all (no statement ran) is not retried: no other worker
    raced for it, and five more connect timeouts would only make the user wait."""
    for k in range(attempts):
        try:
            return fn()
        except (sa.exc.IntegrityError, sa.exc.OperationalError, sa.exc.ProgrammingError) as exc:
            if k == attempts - 1 or exc.statement is None or _waited_for_lock(exc):
                raise
            logger.debug("%s raced with another worker; retrying", what)
            time.sleep(0.2 * (k + 1))
    raise AssertionError("unreachable")


def _waited_for_lock(exc: sa.exc.DBAPIError) -> bool:
    """Whether ``exc`` is SQLite's "database is locked": the driver has waited its busy timeout
    (:data:`~tuner.study.driver.SQLITE_BUSY_TIMEOUT_S`) for another process's lock already, and
    each try more waited as long again: a read command on a database some other program held
    (an ``sqlite3`` shell mid-transaction, a stale lock on NFS) said nothing for five minutes."""
    return "database is locked" in str(exc.orig)


def open_storage(
    url: str | None, layout: ResultsLayout, *, heartbeat_s: float = 30.0, create: bool = True
) -> optuna.storages.BaseStorage:
    """Open (creating if needed) the storage of a study; one-line :class:`StudyError` if not.

    RDB storages get heartbeats: the running trials of a worker that died are failed by the
    next worker that looks, which re-runs them as interrupted. ``create=False``: a read of a
    storage the caller found there (the read commands), which makes no folder and no creation
    lock beside it (a lock file was left beside every database a leaderboard read).
    """
    where = resolve_url(url, layout)
    with _storage_errors(where):
        if not create:
            return _open(where, heartbeat_s)
        _make_folder(where)
        with creation_lock(where):
            return _open(where, heartbeat_s)


def start_study(
    spec: StudySpec, sampler: optuna.samplers.BaseSampler, *, url: str | None,
    layout: ResultsLayout, heartbeat_s: float, force: bool,
) -> tuple[optuna.storages.BaseStorage, optuna.Study]:  # fmt: skip
    """:func:`open_storage` and :func:`open_study` for ``tune run``, under one hold of the
    creation lock. A local database or journal this call made is removed again when the call
    ends before it returns (Ctrl-C during Optuna's schema creation or the study's, a storage
    that could not be opened): left, it held no study (or half a schema), and the next read
    said the study was not in it. Under the lock no other worker of this machine opened it
    meanwhile, and a read command refuses a storage that is not there."""
    where = resolve_url(url, layout)
    with _storage_errors(where):
        _make_folder(where)
    with creation_lock(where), _removed_unless_done(where.local_file):
        with _storage_errors(where):
            storage = _open(where, heartbeat_s)
        return storage, _fingerprinted(spec, _create_or_load(spec.name, storage, sampler), force)


SQLITE_SIDE_FILES = ("-journal", "-wal", "-shm")
"""The files SQLite keeps beside a database while it writes (rollback journal, WAL mode)."""


@contextlib.contextmanager
def _removed_unless_done(target: Path | None) -> Iterator[None]:
    """``target`` (a local database or journal) and SQLite's files beside it removed when the
    block does not finish and ``target`` did not exist before it."""
    made = target is not None and not target.exists()
    try:
        yield
    except BaseException:
        if made and target is not None:
            for path in (target, *(beside(target, side) for side in SQLITE_SIDE_FILES)):
                with contextlib.suppress(OSError):
                    path.unlink()
            logger.debug("removed %s: the study was not created in it", target)
        raise


def _make_folder(where: StorageURL) -> None:
    if where.local_file is not None:
        where.local_file.parent.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def _storage_errors(where: StorageURL) -> Iterator[None]:
    """A failure to open the storage at ``where`` as a one-line :class:`StudyError`."""
    try:
        yield
    except StudyError:
        raise
    except Exception as exc:  # SQLAlchemy raises many types for a bad URL or an unreachable DB
        shown = without_password(where.url)
        raise StudyError(f"cannot open storage {shown!r}: {root_cause(exc)}") from None


def _open(where: StorageURL, heartbeat_s: float) -> optuna.storages.BaseStorage:
    if where.journal is not None:
        lock = JournalFileSymlinkLock(str(where.journal))  # Optuna's writers' own lock
        if where.journal.is_file():
            mend_journal(where.journal, lock)
        backend = JournalFileBackend(str(where.journal), lock)
        try:
            return optuna.storages.JournalStorage(backend)  # replays every record
        except (KeyError, ValueError, TypeError, AssertionError) as exc:  # KeyError: 'op_code'
            raise StudyError(
                f"cannot open storage {where.url!r}: a record this Optuna cannot "
                f"replay ({type(exc).__name__}: {root_cause(exc)})"
            ) from None

    def make() -> optuna.storages.RDBStorage:
        with warnings.catch_warnings(), arguments_refused():  # not a warning: an error
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                where.url,
                heartbeat_interval=max(1, round(heartbeat_s)),
                grace_period=max(1, round(MISSED_BEATS * heartbeat_s)),
                engine_kwargs={"connect_args": connect_args(where.url)},
            )

    return retrying(f"opening {where.url}", make)


def create_or_load(
    name: str, storage: optuna.storages.BaseStorage, url: str | None, layout: ResultsLayout,
    sampler: optuna.samplers.BaseSampler,
) -> optuna.Study:  # fmt: skip
    """Create the study or join it; safe when several workers do this at the same moment."""
    with creation_lock(resolve_url(url, layout)):
        return _create_or_load(name, storage, sampler)


def _create_or_load(
    name: str, storage: optuna.storages.BaseStorage, sampler: optuna.samplers.BaseSampler
) -> optuna.Study:
    def make() -> optuna.Study:
        return optuna.create_study(
            study_name=name, storage=storage, direction="minimize", sampler=sampler,
            load_if_exists=True,
        )  # fmt: skip

    return retrying(f"creating study {name}", make)


def record_heartbeats(storage: optuna.storages.BaseStorage, study_id: int,
                      numbers: Sequence[int]) -> None:  # fmt: skip
    """Mark the trials ``numbers`` of a study alive (storages without heartbeats: nothing)."""
    if not isinstance(storage, optuna.storages.RDBStorage):
        return
    for number in numbers:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        storage.record_heartbeat(trial_id)


def open_study(
    spec: StudySpec, storage: optuna.storages.BaseStorage, sampler: optuna.samplers.BaseSampler,
    *, force: bool, url: str | None, layout: ResultsLayout,
) -> optuna.Study:  # fmt: skip
    """Create or resume the Optuna study; refuse a changed spec unless ``force``."""
    return _fingerprinted(spec, create_or_load(spec.name, storage, url, layout, sampler), force)


def changed_study(spec: StudySpec, recorded: str) -> str:
    """Why ``tune run`` refuses to resume a study started under the fingerprint ``recorded``."""
    return (f"study {spec.name!r} was started with a different study file (fingerprint "
            f"{recorded}, now {spec.fingerprint()}); resume with --force, or give the study a "
            "new name")  # fmt: skip


def _fingerprinted(spec: StudySpec, study: optuna.Study, force: bool) -> optuna.Study:
    """``study`` holding ``spec``'s fingerprint (a new one: set now); a changed spec refused
    unless ``force``."""
    recorded = study.user_attrs.get(FINGERPRINT_ATTR)
    mine = spec.fingerprint()
    if recorded is None:
        study.set_user_attr(FINGERPRINT_ATTR, mine)
        with warnings.catch_warnings():  # experimental in Optuna, stable since 3.2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["step_time_s"])  # optuna-dashboard names the objective
    elif recorded != mine:
        if not force:
            raise StudyError(changed_study(spec, recorded))
        logger.warning("study file changed since the study started; resuming (--force)")
        study.set_user_attr(FINGERPRINT_ATTR, mine)
    return study


def check_results_dir(layout: ResultsLayout) -> None:
    """Refuse to start when the study's results folder cannot take a trial's files."""
    try:
        layout.study_dir.mkdir(parents=True, exist_ok=True)
        probe = layout.study_dir / f".write-test-{os.getpid()}"
        probe.write_text("ok\n")
        probe.unlink()
    except OSError as exc:
        raise StudyError(f"results folder {layout.study_dir} is not writable: "
                         f"{exc.strerror or exc}") from None  # fmt: skip
    free = shutil.disk_usage(layout.study_dir).free
    if free < MIN_FREE_BYTES:
        raise StudyError(
            f"results folder {layout.study_dir} has only {free / 2**20:.1f} MiB free; the study "
            f"needs at least {MIN_FREE_BYTES // 2**20} MiB for its storage and trial logs"
        )


MIN_FREE_BYTES = 64 * 2**20
"""A trial's logs are tens of kB to a few MB and SQLite needs room for its journal: below this
the next trial's result could not be stored (a full disk loses it)."""


def set_user_attrs(trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    """``trial.set_user_attr(key, value)`` for each of ``attrs``, on an SQLite or PostgreSQL
    storage in one statement and one transaction.

    Optuna writes each attribute in a transaction of its own (a select of the trial, an
    upsert, a commit: about 2 ms of CPU each); a launched trial has some 25, written at its
    screen, its launch and its record. The same upsert on the same table, for all of them at
    once, and the same refusal once the trial is finished
    (:class:`optuna.exceptions.UpdateFinishedTrialError`). Other storages: one by one."""
    backend = upsert_backend(trial.storage)
    if backend is None or not attrs:
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return
    write_trial(backend, trial, {}, attrs)


def upsert_backend(storage: optuna.storages.BaseStorage) -> optuna.storages.RDBStorage | None:
    """The RDB storage under ``storage`` (Optuna's cache) when its dialect takes the upsert
    :func:`write_trial` writes with; None for any other storage (written through Optuna)."""
    backend = getattr(storage, "_backend", storage)  # under Optuna's cache
    if isinstance(backend, optuna.storages.RDBStorage) and backend.engine.dialect.name in _UPSERT:
        return backend
    return None


def write_trial(
    backend: optuna.storages.RDBStorage, trial: optuna.Trial,
    params: dict[str, tuple[float, BaseDistribution]], attrs: dict[str, Any],
    system: dict[str, Any] | None = None,
    end: tuple[optuna.trial.TrialState, float | None] | None = None, *, keep: bool = False,
) -> None:  # fmt: skip
    """A running trial's new parameters (name -> internal value and distribution, as
    ``Storage.set_trial_param`` takes them), user attributes and ``system`` attributes in one
    transaction: what Optuna's ``set_trial_param``, ``set_trial_user_attr`` and
    ``set_trial_system_attr`` leave in its tables, with their refusals (a finished trial; a
    parameter whose distribution differs in kind, or in choices, from the one the study stored
    first: :func:`~optuna.distributions.check_distribution_compatibility`). Updates the
    trial's cached view as Optuna does. ``end``: its final state and value, in the same
    transaction, as ``Storage.set_trial_state_values`` leaves them (:func:`_end`). ``keep``
    (with ``end``): the trial's shown attributes, as stored once ``attrs`` are written, also
    kept together as one (:mod:`tuner.study.row_attrs`)."""
    from optuna.storages._rdb import models

    trials = models.TrialModel.__table__
    own = sa.select(trials.c.state, trials.c.study_id).where(trials.c.trial_id == trial._trial_id)
    with backend.engine.begin() as conn:
        state, study_id = conn.execute(own.with_for_update()).one()
        if optuna.trial.TrialState[str(getattr(state, "name", state))].is_finished():
            raise optuna.exceptions.UpdateFinishedTrialError(
                f"Trial#{trial.number} has already finished and can not be updated."
            )
        if params:
            table = models.TrialParamModel.__table__
            first = _first_distributions(conn, backend, study_id, list(params))
            rows = []
            for name, (value, dist) in params.items():
                if name in first:
                    check_distribution_compatibility(first[name], dist)
                rows.append({"trial_id": trial._trial_id, "param_name": name, "param_value": value,
                             "distribution_json": _to_json(dist)})  # fmt: skip
            conn.execute(table.insert(), rows)
        for model, values in ((models.TrialUserAttributeModel, attrs),
                              (models.TrialSystemAttributeModel, system or {})):  # fmt: skip
            if values:
                rows = [{"trial_id": trial._trial_id, "key": k, "value_json": json.dumps(v)}
                        for k, v in values.items()]  # fmt: skip
                conn.execute(_upsert(backend.engine.dialect.name, model.__table__), rows)
        if end is not None:
            if keep:
                attrs = {**attrs, ROW_ATTR: _keep(conn, backend, trial._trial_id)}
            _end(conn, trial._trial_id, *end)
    cached = trial._cached_frozen_trial
    for name, (value, dist) in params.items():
        cached.distributions[name] = dist
        cached.params[name] = dist.to_external_repr(value)
    cached.user_attrs.update(attrs)


def _keep(conn: sa.Connection, backend: optuna.storages.RDBStorage, trial_id: int) -> Any:
    """Write trial ``trial_id``'s :data:`~tuner.study.row_attrs.ROW_KEYS` as stored (in the
    caller's transaction, the trial locked) as one attribute; its value."""
    from optuna.storages._rdb import models

    table = models.TrialUserAttributeModel.__table__
    mine = (table.c.trial_id == trial_id) & table.c.key.in_(ROW_KEYS)
    rows = conn.execute(sa.select(table.c.key, table.c.value_json).where(mine)
                        .order_by(table.c.key)).all()  # fmt: skip
    text = kept_text([(key, value) for key, value in rows])
    row = {"trial_id": trial_id, "key": ROW_ATTR, "value_json": text}
    conn.execute(_upsert(backend.engine.dialect.name, table), [row])
    return json.loads(text)


def _end(conn: sa.Connection, trial_id: int, state: optuna.trial.TrialState,
         value: float | None) -> None:  # fmt: skip
    """What ``RDBStorage.set_trial_state_values(trial_id, state, [value])`` writes for a
    running trial (already locked by the caller's select): the objective's value row (updated
    if one is there), the state and the completion time."""
    from optuna.storages._rdb import models

    if value is not None:
        table = models.TrialValueModel.__table__
        stored, kind = models.TrialValueModel.value_to_stored_repr(value)
        row = {"value": stored, "value_type": kind}
        where = (table.c.trial_id == trial_id) & (table.c.objective == 0)
        if conn.execute(sa.select(table.c.trial_value_id).where(where)).first() is None:
            conn.execute(table.insert(), [{"trial_id": trial_id, "objective": 0, **row}])
        else:
            conn.execute(table.update().where(where).values(**row))
    trials = models.TrialModel.__table__
    conn.execute(trials.update().where(trials.c.trial_id == trial_id)
                 .values(state=state, datetime_complete=datetime.datetime.now()))  # fmt: skip


def _first_distributions(
    conn: sa.Connection, backend: optuna.storages.RDBStorage, study_id: int, names: list[str]
) -> dict[str, BaseDistribution]:
    """The distribution the study stored first for each of ``names`` that it has stored (what
    Optuna checks a new parameter against): one query for those not found before (the first
    row of a parameter stays the first: Optuna never deletes a trial of a study it keeps)."""
    from optuna.storages._rdb import models

    known = _FIRST.setdefault(backend, {}).setdefault(study_id, {})
    missing = [name for name in names if name not in known]
    if missing:
        table, trials = models.TrialParamModel.__table__, models.TrialModel.__table__
        first = (
            sa.select(sa.func.min(table.c.param_id))
            .join(trials, trials.c.trial_id == table.c.trial_id)
            .where(trials.c.study_id == study_id, table.c.param_name.in_(missing))
            .group_by(table.c.param_name)
        )
        query = sa.select(table.c.param_name, table.c.distribution_json).where(
            table.c.param_id.in_(first)
        )
        known.update((name, _from_json(text)) for name, text in conn.execute(query))
    return {name: known[name] for name in names if name in known}


_FIRST: weakref.WeakKeyDictionary[Any, dict[int, dict[str, BaseDistribution]]] = (
    weakref.WeakKeyDictionary()
)
"""Storage -> study id -> parameter name -> the distribution its first row holds (kept as long
as the storage object, like Optuna's own cache of them)."""


def _upsert(dialect: str, table: sa.Table) -> Any:
    """``INSERT ... ON CONFLICT (trial_id, key) DO UPDATE`` of an attribute table, for rows
    given at execution (built once: SQLAlchemy compiles it once per dialect and table)."""
    key = (dialect, table.name)
    if key not in _UPSERTS:
        insert = _UPSERT[dialect](table)
        new = {"value_json": insert.excluded.value_json}
        _UPSERTS[key] = insert.on_conflict_do_update(index_elements=["trial_id", "key"], set_=new)
    return _UPSERTS[key]


_UPSERTS: dict[tuple[str, str], Any] = {}


_JSON: dict[BaseDistribution, str] = {}
_DISTS: dict[str, BaseDistribution] = {}


def _to_json(dist: BaseDistribution) -> str:
    """``distribution_to_json``, each distribution written once per process."""
    text = _JSON.get(dist)
    return text if text is not None else _JSON.setdefault(dist, distribution_to_json(dist))


def _from_json(text: str) -> BaseDistribution:
    """``json_to_distribution``, each stored spelling decoded once per process."""
    dist = _DISTS.get(text)
    return dist if dist is not None else _DISTS.setdefault(text, json_to_distribution(text))


def _sqlite_insert(table: sa.Table) -> Any:
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(table)


def _postgresql_insert(table: sa.Table) -> Any:
    from sqlalchemy.dialects import postgresql

    return postgresql.insert(table)


_UPSERT: dict[str, Callable[[sa.Table], Any]] = {
    "sqlite": _sqlite_insert,
    "postgresql": _postgresql_insert,
}
"""The dialects whose insert takes ``ON CONFLICT DO UPDATE`` (SQLite since 3.24)."""
