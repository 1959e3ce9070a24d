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
"""

from __future__ import annotations

import bisect
import datetime
import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState

from tuner.space.collection import paused_collection

_SPECIAL = {"INF_POS": float("inf"), "INF_NEG": float("-inf"), "NAN": float("nan")}

MAX_IN = 500
"""Unfinished trial ids named in one ``IN (...)``; past it the reader asks for every trial from
the first unfinished one and keeps those it wants. A database bounds the variables of one
statement (SQLite's oldest default is 999); Optuna catches the error and reads everything."""


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
        if len(self._open) <= MAX_IN:
            since = sa.or_(t.c.trial_id > self._last, t.c.trial_id.in_(sorted(self._open)))
        else:  # every id from the first unfinished one: a superset, narrowed below
            since = t.c.trial_id >= min(self._open)
        # the same rows, bounded from below by id: SQLite then walks the trials from there
        # (the primary key) instead of every trial of the study (its study-id index)
        lowest = min([*self._open, self._last + 1])
        wanted = sa.and_(t.c.trial_id >= lowest, t.c.study_id == self.study_id, since)
        with engine.connect() as conn:
            trials = conn.execute(
                sa.select(t.c.trial_id, t.c.number, t.c.state, t.c.datetime_start,
                          t.c.datetime_complete).where(wanted).order_by(t.c.trial_id)
            ).all()  # fmt: skip
            children = {
                name: _rows(conn, table, columns, wanted)
                for name, table, columns in (
                    ("values", models.TrialValueModel, ("objective", "value", "value_type")),
                    ("params", models.TrialParamModel,
                     ("param_id", "param_name", "param_value", "distribution_json")),
                    ("user", models.TrialUserAttributeModel, ("key", "value_json")),
                    ("system", models.TrialSystemAttributeModel, ("key", "value_json")),
                    ("steps", models.TrialIntermediateValueModel,
                     ("step", "intermediate_value", "intermediate_value_type")),
                )
            }  # fmt: skip
        if trials:
            self._mark = (trials[-1][0], trials[-1][3])
        return [
            self._frozen(row, children) for row in trials
            if row[0] > self._last or row[0] in self._open
        ]  # fmt: skip

    def _frozen(self, row: Any, children: dict[str, dict[int, list[Any]]]) -> FrozenTrial:
        trial_id, number, state, start, complete = row
        values: list[float] | None = None
        if children["values"][trial_id]:
            values = [0.0] * len(children["values"][trial_id])
            for objective, value, kind in children["values"][trial_id]:
                values[objective] = _SPECIAL.get(_name(kind), value)
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
            datetime_start=_local(start), datetime_complete=_local(complete), params=params,
            distributions=dists,
            user_attrs=_attrs(children["user"][trial_id]),
            system_attrs=_attrs(children["system"][trial_id]),
            intermediate_values={
                step: _SPECIAL.get(_name(kind), value)
                for step, value, kind in children["steps"][trial_id]
            },
            trial_id=trial_id,
        )  # fmt: skip


def _rows(conn: sa.Connection, model: Any, columns: Iterable[str],
          wanted: sa.ColumnElement[bool]) -> dict[int, list[Any]]:  # fmt: skip
    """``columns`` of ``model``'s rows of the wanted trials, by trial id."""
    table, trials = model.__table__, models.TrialModel.__table__
    query = sa.select(table.c.trial_id, *(table.c[c] for c in columns)).join(
        trials, trials.c.trial_id == table.c.trial_id
    )
    out: dict[int, list[Any]] = defaultdict(list)
    for row in _fetch_plain(conn, query.where(wanted)):
        out[row[0]].append(row[1:])
    return out


def _fetch_plain(conn: sa.Connection, query: sa.Select[Any]) -> list[Any]:
    """The rows of ``query`` as the database driver gives them, for columns that need no
    conversion (numbers and text; an enum column as its stored name, which :func:`_name`
    reads): SQLAlchemy's result rows cost about as much again as the driver's fetch, and the
    attribute tables of 10,000 trials are some 250,000 rows. Through SQLAlchemy where the
    driver's connection is not at hand."""
    compiled = query.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    raw = getattr(conn.connection, "driver_connection", None)
    if raw is None or compiled.positiontup is None and compiled.positional:
        return list(conn.execute(query))
    params = compiled.params
    args: Any = (tuple(params[k] for k in compiled.positiontup or ()) if compiled.positional
                 else params)  # fmt: skip
    cursor = raw.cursor()
    try:
        cursor.execute(str(compiled), args)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def _attrs(rows: list[Any]) -> dict[str, Any]:
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


def _local(utc: datetime.datetime | None) -> datetime.datetime | None:
    """Optuna's stored UTC time as the naive local time its ORM model gives."""
    if utc is None:
        return None
    return utc.replace(tzinfo=datetime.UTC).astimezone().replace(tzinfo=None)
