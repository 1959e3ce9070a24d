"""Every trial of a stored study, read in a few plain queries: what the leaderboard, the best
trial and the report read.

Optuna's RDB storage builds each trial from ORM objects, one per row of each of its tables: a
trial of the loop has about 25 attributes and 15 parameters, so 10,000 trials are some 400,000
ORM objects, about 10 s of CPU before the leaderboard has a row. :class:`TrialReader` selects the
same rows as plain tuples (one query per table, joined here by trial id) and builds the same
:class:`~optuna.trial.FrozenTrial` objects, each distinction of a parameter decoded once.

Like Optuna's cached storage it keeps the finished trials it read (a finished trial never
changes) and reads again only the unfinished ones and those added since, so a long-lived reader
sees what other workers add or finish. Other storages (a journal file) are read through Optuna.
An unfinished trial whose rows read as the last read's is that read's object (not built again),
and each statement is compiled once per shape (the number of unfinished trials it names,
rounded up to a power of two).
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime
import json
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState

from tuner.space.collection import paused_collection

SPECIAL_VALUES = {"INF_POS": float("inf"), "INF_NEG": float("-inf"), "NAN": float("nan")}
"""A stored value's type (Optuna's ``value_type`` column) that stands for a value of its own."""

MAX_IN = 500
"""Unfinished trial ids named in one ``IN (...)``; past it the reader asks for every trial from
the first unfinished one and keeps those it wants. A database bounds the variables of one
statement (SQLite's oldest default is 999); Optuna catches the error and reads everything."""


def in_size(n: int) -> int:
    """How many ids an ``IN (...)`` of ``n`` unfinished trials names: ``n`` rounded up to a
    power of two (at most :data:`MAX_IN`), the last id repeated. Each statement is compiled
    once per size (about 1 ms of CPU each on SQLite), and with 64 trials in flight the count
    moves on nearly every read."""
    return 0 if n == 0 else min(MAX_IN, 1 << (n - 1).bit_length())


class TrialReader:
    """The trials of study ``study_id`` in ``storage``, read incrementally."""

    def __init__(self, storage: optuna.storages.BaseStorage, study_id: int) -> None:
        self.storage, self.study_id = storage, study_id
        self._finished: dict[int, FrozenTrial] = {}  # by trial id
        self._done: list[FrozenTrial] = []  # the same trials, in trial-id order
        self._done_ids: list[int] = []  # their ids, in that order
        self._open: set[int] = set()
        self._last = -1
        self._distributions: dict[str, BaseDistribution] = {}
        self._mark: tuple[int, Any] | None = None  # the last trial read: id, stored start
        self._statements: dict[tuple[Any, ...], _Statement] = {}  # see _rows
        self._unfinished: dict[int, tuple[tuple[Any, ...], FrozenTrial]] = {}  # see _read

    def unchanged(self) -> bool:
        """Whether the storage still holds the last trial read, as read (its study and start
        time): False when the database was made anew since, even on the same file or inode,
        and what this reader kept is another database's."""
        if self._mark is None or not isinstance(self.storage, optuna.storages.RDBStorage):
            return True
        t = models.TrialModel.__table__
        trial_id, start = self._mark
        with self.storage.engine.connect() as conn:
            row = conn.execute(
                sa.select(t.c.study_id, t.c.datetime_start).where(t.c.trial_id == trial_id)
            ).first()  # fmt: skip
        return row is not None and tuple(row) == (self.study_id, start)

    def settled(self) -> tuple[int, int]:
        """A trial id below which every trial of the study is finished, and how many trials of
        the study are below it, as the last read found them: the first unfinished trial, else
        the one after the last read (0 and 0 before a read, or where Optuna reads). A finished
        trial never changes and a new trial's id is above every id there is, so this stays
        true: a query of the unfinished or new trials may start at that id
        (:mod:`tuner.study.asking`) instead of walking every trial of the study."""
        below = min(self._open) if self._open else self._last + 1
        return below, bisect.bisect_left(self._done_ids, below)

    def trials(self) -> list[FrozenTrial]:
        """Every trial of the study, in trial-id order (Optuna's ``get_all_trials`` order)."""
        if not isinstance(self.storage, optuna.storages.RDBStorage):
            return self.storage.get_all_trials(self.study_id, deepcopy=False)
        with paused_collection():
            fresh = self._read(self.storage.engine)
        self._open = set()
        unfinished = []
        for t in fresh:  # in trial-id order
            self._last = max(self._last, t._trial_id)
            if t.state.is_finished():
                self._add_finished(t)
            else:
                self._open.add(t._trial_id)
                unfinished.append(t)
        if not unfinished:
            return list(self._done)
        # The finished trials before the first unfinished one as they are (a slice: no walk
        # over the thousands kept), the rest merged with the unfinished ones by id.
        cut = bisect.bisect_left(self._done_ids, unfinished[0]._trial_id)
        tail = sorted([*self._done[cut:], *unfinished], key=lambda t: t._trial_id)
        return self._done[:cut] + tail

    def _add_finished(self, t: FrozenTrial) -> None:
        """Keep a trial read finished (a finished trial never changes), in trial-id order."""
        tid = t._trial_id
        if tid in self._finished:  # read finished again: the same trial, kept in its place
            self._done[bisect.bisect_left(self._done_ids, tid)] = t
        elif not self._done_ids or tid > self._done_ids[-1]:
            self._done_ids.append(tid)
            self._done.append(t)
        else:  # finished after a later trial did
            at = bisect.bisect_left(self._done_ids, tid)
            self._done_ids.insert(at, tid)
            self._done.insert(at, t)
        self._finished[tid] = t

    def _read(self, engine: sa.Engine) -> list[FrozenTrial]:
        t = models.TrialModel.__table__
        opened = sorted(self._open)
        values: dict[str, Any] = {"study": self.study_id, "last": self._last,
                                  "lowest": min([*opened, self._last + 1])}  # fmt: skip
        if len(opened) <= MAX_IN:
            # the list padded with its last id to a power of two (the same set): a few
            # shapes to compile, not one per number of trials in flight
            size = in_size(len(opened))
            values |= {f"open{i}": opened[min(i, len(opened) - 1)] for i in range(size)}
            since = t.c.trial_id > sa.bindparam("last")
            if opened:
                named: list[Any] = [sa.bindparam(f"open{i}") for i in range(size)]
                since = sa.or_(since, t.c.trial_id.in_(named))
            shape: tuple[Any, ...] = ("in", size)
        else:  # every id from the first unfinished one: a superset, narrowed below
            since, shape = t.c.trial_id >= sa.bindparam("lowest"), ("from",)
        # the same rows, bounded from below by id: SQLite then walks the trials from there
        # (the primary key) instead of every trial of the study (its study-id index)
        wanted = sa.and_(t.c.trial_id >= sa.bindparam("lowest"),
                         t.c.study_id == sa.bindparam("study"), since)  # fmt: skip
        with engine.connect() as conn:
            trials = conn.execute(
                sa.select(t.c.trial_id, t.c.number, t.c.state, t.c.datetime_start,
                          t.c.datetime_complete).where(wanted).order_by(t.c.trial_id),
                values,
            ).all()  # fmt: skip
            children = {
                name: self._rows(conn, (name, *shape), table, columns, wanted, values)
                for name, table, columns in _CHILDREN
            }  # fmt: skip
        if trials:
            self._mark = (trials[-1][0], trials[-1][3])
        # An unfinished trial whose rows are all as the last read read them is that read's
        # trial object: building a trial (its attributes' JSON, its parameters) cost more
        # than comparing its rows, and most of the trials in flight change nothing between
        # two reads. Rows are compared, not ids: a value written over keeps its row's id.
        out, seen = [], {}
        for row in trials:
            tid = row[0]
            if tid <= self._last and tid not in self._open:
                continue
            rows = (tuple(row), *(tuple(children[name][tid]) for name, _, _ in _CHILDREN))
            kept = self._unfinished.get(tid)
            same = kept is not None and kept[0] == rows
            trial = kept[1] if kept is not None and same else self._frozen(row, children)
            if not trial.state.is_finished():
                seen[tid] = (rows, trial)
            out.append(trial)
        self._unfinished = seen
        return out

    def _rows(self, conn: sa.Connection, shape: tuple[Any, ...], model: Any,
              columns: Iterable[str], wanted: sa.ColumnElement[bool], values: dict[str, Any],
              ) -> dict[int, list[Any]]:  # fmt: skip
        """``columns`` of ``model``'s rows of the wanted trials, by trial id; the statement
        compiled once per ``shape`` (SQLAlchemy's compilation took three times the query's
        own time on SQLite: the plain fetch bypasses its cache)."""
        statement = self._statements.get(shape)
        if statement is None:
            table, trials = model.__table__, models.TrialModel.__table__
            query = sa.select(table.c.trial_id, *(table.c[c] for c in columns)).join(
                trials, trials.c.trial_id == table.c.trial_id
            )
            statement = self._statements[shape] = compile_statement(conn, query.where(wanted))
        out: dict[int, list[Any]] = defaultdict(list)
        for row in fetch_plain(conn, statement, values):
            out[row[0]].append(row[1:])
        return out

    def _frozen(self, row: Any, children: dict[str, dict[int, list[Any]]]) -> FrozenTrial:
        trial_id, number, state, start, complete = row
        values: list[float] | None = None
        if children["values"][trial_id]:
            values = [0.0] * len(children["values"][trial_id])
            for objective, value, kind in children["values"][trial_id]:
                values[objective] = SPECIAL_VALUES.get(_name(kind), value)
        params: dict[str, Any] = {}
        dists: dict[str, BaseDistribution] = {}
        for _pid, name, value, text in sorted(children["params"][trial_id]):
            dist = self._distributions.get(text) or self._distributions.setdefault(
                text, json_to_distribution(text)
            )
            dists[name] = dist
            params[name] = dist.to_external_repr(value)
        return FrozenTrial(
            number=number, state=TrialState[_name(state)], value=None, values=values,
            datetime_start=local_time(start), datetime_complete=local_time(complete),
            params=params, distributions=dists,
            user_attrs=decode_attrs(children["user"][trial_id]),
            system_attrs=decode_attrs(children["system"][trial_id]),
            intermediate_values={
                step: SPECIAL_VALUES.get(_name(kind), value)
                for step, value, kind in children["steps"][trial_id]
            },
            trial_id=trial_id,
        )  # fmt: skip


_CHILDREN = (
    ("values", models.TrialValueModel, ("objective", "value", "value_type")),
    ("params", models.TrialParamModel,
     ("param_id", "param_name", "param_value", "distribution_json")),
    ("user", models.TrialUserAttributeModel, ("key", "value_json")),
    ("system", models.TrialSystemAttributeModel, ("key", "value_json")),
    ("steps", models.TrialIntermediateValueModel,
     ("step", "intermediate_value", "intermediate_value_type")),
)  # fmt: skip
"""The tables of a trial's parts: name, ORM model, the columns read."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Statement:
    """A query with named parameters, compiled once for a dialect."""

    query: sa.Select[Any]
    sql: str | None  # None: a dialect whose parameters' order is not known; run by SQLAlchemy
    names: tuple[str, ...] | None  # the parameters' order, for a positional driver


def compile_statement(conn: sa.Connection, query: sa.Select[Any]) -> _Statement:
    compiled = query.compile(dialect=conn.dialect)
    if compiled.positional and compiled.positiontup is None:
        return _Statement(query, None, None)
    names = tuple(compiled.positiontup or ()) if compiled.positional else None
    return _Statement(query, str(compiled), names)


def fetch_plain(conn: sa.Connection, statement: _Statement, values: dict[str, Any]) -> list[Any]:
    """The rows of ``statement`` as the database driver gives them, for columns that need no
    conversion (numbers and text; an enum column as its stored name, which :func:`_name`
    reads): SQLAlchemy's result rows cost about as much again as the driver's fetch, and the
    attribute tables of 10,000 trials are some 250,000 rows. Through SQLAlchemy where the
    driver's connection is not at hand."""
    raw = getattr(conn.connection, "driver_connection", None)
    if raw is None or statement.sql is None:
        return list(conn.execute(statement.query, values))
    names = statement.names
    args: Any = values if names is None else tuple(values[k] for k in names)
    cursor = raw.cursor()
    try:
        cursor.execute(statement.sql, args)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def decode_attrs(rows: list[Any]) -> dict[str, Any]:
    """A trial's attributes from their stored ``(key, value_json)`` rows, decoded as one JSON
    object: one ``json.loads`` per trial instead of one per attribute (some 25 a trial: the
    call's own overhead was most of the leaderboard's decoding). A key is unique per trial (the
    table's constraint), so the object holds the same pairs in the same order."""
    if not rows:
        return {}
    keys = _KEYS
    text = ",".join(f"{keys.get(k) or keys.setdefault(k, json.dumps(k))}:{v}" for k, v in rows)
    return dict(json.loads("{" + text + "}"))


_KEYS: dict[str, str] = {}
"""Attribute keys as JSON strings, by key: a study has a few dozen, each quoted once."""


def _name(value: Any) -> str:
    """An enum column's value as its member name (a plain select may give either)."""
    return str(getattr(value, "name", value))


def local_time(utc: datetime.datetime | None) -> datetime.datetime | None:
    """Optuna's stored UTC time as the naive local time its ORM model gives
    (``utc.replace(tzinfo=UTC).astimezone().replace(tzinfo=None)``), by CPython's own steps for
    it: the local zone's offset is ``localtime``'s ``tm_gmtoff`` at the time's whole second
    (floored), added to the time. Without the two aware times and the zone object CPython makes
    for each, half the cost (the report reads 20,000 times at 10,000 trials);
    ``tests/test_local_time.py`` holds it to ``astimezone`` across zones and their changes."""
    if utc is None:
        return None
    if utc.tzinfo is not None or not _GMTOFF:
        return utc.replace(tzinfo=datetime.UTC).astimezone().replace(tzinfo=None)
    offset = time.localtime((utc - _EPOCH) // _SECOND).tm_gmtoff
    delta = _OFFSETS.get(offset)
    if delta is None:
        delta = _OFFSETS[offset] = datetime.timedelta(seconds=offset)
    return utc + delta


_EPOCH = datetime.datetime(1970, 1, 1)
_SECOND = datetime.timedelta(seconds=1)
_GMTOFF = hasattr(time.localtime(0), "tm_gmtoff")
"""Whether ``localtime`` gives the zone's offset (CPython's ``astimezone`` reads it where the
C library has it; elsewhere it works the offset out another way, and so does :func:`local_time`
then: through ``astimezone``)."""
_OFFSETS: dict[int, datetime.timedelta] = {}
"""The local zone's offsets met, in seconds, as time deltas."""
