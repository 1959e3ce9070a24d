"""A stored study's trials as the read commands show them: each trial's number, state and the
user attributes a command names, without building Optuna's trials.

:class:`tuner.study.reader.TrialReader` builds every trial whole (its parameters and their
distributions, values, system attributes, intermediate values, times), which the loop and the
exports need. ``tune leaderboard`` reads a few dozen user attributes of each trial and nothing
else, and at 10,000 trials the whole read was about 1.3 s of CPU of the command's 3. Here the
trials' rows and the named attributes only: on SQLite each trial's attributes come back as one
JSON text made by the database (``group_concat`` of ``key: value`` pairs), decoded with one
``json.loads`` a trial; elsewhere (or an SQLite without its JSON functions) as rows joined
here, as the reader joins them. An attribute whose stored text repeats from trial to trial (a
config: a long study measures a few hundred configs again and again; its hosts) can be read
as shared: each distinct text decoded once, its object shared by every trial that stored it
(so never to be changed by the caller). A trial recorded by the loop keeps the attributes the
read commands show together as one (:mod:`tuner.study.row_attrs`): where every attribute asked
(but the shared ones) is among those, such a trial is read by that one attribute, the others
one by one. A storage that is not an RDB storage (a journal file) is read through Optuna.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState

from tuner.space.collection import paused_collection
from tuner.study.reader import (
    SPECIAL_VALUES,
    compile_statement,
    decode_attrs,
    fetch_plain,
    local_time,
)
from tuner.study.row_attrs import ROW_ATTR, ROW_KEYS

KEPT = frozenset(ROW_KEYS)


@dataclasses.dataclass(frozen=True, slots=True)
class TrialAttrs:
    """A stored trial's number, state and the user attributes read (a subset of Optuna's
    :class:`~optuna.trial.FrozenTrial`'s, as they are stored)."""

    trial_id: int
    """The storage's id of the trial (Optuna's ``_trial_id``)."""
    number: int
    """The trial's number in its study."""
    state: TrialState
    """Its state."""
    user_attrs: dict[str, Any]
    """The user attributes read: those named (all, when none were), each as Optuna decodes it
    (a shared one's object is shared with other trials: read it, never change it)."""
    datetime_start: datetime.datetime | None = None
    """When it started, as Optuna's trial gives it (naive local time); None: not read."""
    datetime_complete: datetime.datetime | None = None
    """When it ended, the same way."""


def read_attrs(
    storage: optuna.storages.BaseStorage, study_id: int, keys: Collection[str] | None = None,
    *, shared: Collection[str] = (), times: bool = False, grouped: bool = True, since: int = 0,
) -> list[TrialAttrs]:  # fmt: skip
    """Every trial of study ``study_id``, in trial-id order (Optuna's), with the user
    attributes named by ``keys`` (None: every one) and, with ``times``, its start and end.

    ``shared``: attributes of ``keys`` decoded once per distinct stored text, their objects
    shared between trials. ``grouped``: on SQLite, each trial's other attributes as one JSON
    text made by the database (the rows joined here otherwise; False reads so, for the tests
    to compare the two). ``since``: only the trials of that id and above."""
    wanted = None if keys is None else frozenset(keys)
    if not isinstance(storage, optuna.storages.RDBStorage):
        trials = storage.get_all_trials(study_id, deepcopy=False)
        return [_from_frozen(t, wanted, times) for t in trials if t._trial_id >= since]
    shared = sorted(k for k in shared if wanted is None or k in wanted)
    kept = wanted is not None and wanted.difference(shared) <= KEPT  # see row_attrs
    read = _Read(study_id, wanted, tuple(shared), times, kept, since)
    with paused_collection(), storage.engine.connect() as conn:
        if grouped and conn.dialect.name == "sqlite":
            try:
                return read.grouped(conn)
            except sa.exc.OperationalError:  # an SQLite built without its JSON functions
                conn.rollback()
        return read.joined(conn)


@dataclasses.dataclass(frozen=True, slots=True)
class _Read:
    """One read's question: the study, the attributes (None: all), the shared ones, times."""

    study_id: int
    keys: frozenset[str] | None
    shared: tuple[str, ...]
    times: bool
    kept: bool = False
    """Whether the attributes asked (but the shared ones) are all among those a trial keeps
    together (:mod:`tuner.study.row_attrs`): then a trial that kept them is read by that one
    attribute, the others one by one."""
    since: int = 0
    """The lowest trial id read."""
    decoded: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The shared attributes' objects by their stored text."""

    def trial_columns(self) -> list[Any]:
        t = models.TrialModel.__table__
        extra = [t.c.datetime_start, t.c.datetime_complete] if self.times else []
        return [t.c.trial_id, t.c.number, t.c.state, *extra]

    def share(self, attrs: dict[str, Any], key: str, text: str | None) -> None:
        """Attribute ``key`` of stored ``text`` into ``attrs``, decoded once per text."""
        if text is None:
            return
        value = self.decoded.get(text)
        if value is None:
            value = self.decoded[text] = json.loads(text)
        attrs[key] = value

    def wanted(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """The asked ones of a trial's kept attributes."""
        keys = self.keys
        return attrs if keys is None else {k: v for k, v in attrs.items() if k in keys}

    def grouped(self, conn: sa.Connection) -> list[TrialAttrs]:
        t, a = models.TrialModel.__table__, models.TrialUserAttributeModel.__table__
        pair = sa.func.json_quote(a.c.key).concat(":").concat(a.c.value_json)
        own = a.c.trial_id == t.c.trial_id
        if self.keys is not None:
            own = sa.and_(own, a.c.key.in_(sorted(self.keys.difference(self.shared))))
        elif self.shared:
            own = sa.and_(own, a.c.key.not_in(self.shared))
        pairs = sa.select(sa.func.group_concat(pair, ",")).where(own).scalar_subquery()
        first: Any = pairs
        if self.kept:  # the kept object, else (SQLite's coalesce is lazy) the rows joined
            named = sa.and_(a.c.trial_id == t.c.trial_id, a.c.key == ROW_ATTR)
            together = sa.select(a.c.value_json).where(named).scalar_subquery()
            first = sa.func.coalesce(together, sa.literal("{").concat(pairs).concat("}"))
        columns = [first]
        for key in self.shared:  # its text alone, decoded once per distinct text
            named = sa.and_(a.c.trial_id == t.c.trial_id, a.c.key == key)
            columns.append(sa.select(a.c.value_json).where(named).scalar_subquery())
        query = sa.select(*self.trial_columns(), *columns)
        end = len(query.selected_columns) - len(columns)
        out = []
        mine = sa.and_(t.c.study_id == self.study_id, t.c.trial_id >= self.since)
        for row in conn.execute(query.where(mine).order_by(t.c.trial_id)):
            if not row[end]:
                attrs = {}
            elif self.kept:
                attrs = self.wanted(json.loads(row[end]))
            else:
                attrs = json.loads("{" + row[end] + "}")
            for key, text in zip(self.shared, row[end + 1 :], strict=True):
                self.share(attrs, key, text)
            out.append(_trial(row[:end], attrs))
        return out

    def joined(self, conn: sa.Connection) -> list[TrialAttrs]:
        t, a = models.TrialModel.__table__, models.TrialUserAttributeModel.__table__
        mine = sa.and_(t.c.study_id == self.study_id, t.c.trial_id >= self.since)
        trials = conn.execute(sa.select(*self.trial_columns()).where(mine).order_by(t.c.trial_id))
        query = sa.select(a.c.trial_id, a.c.key, a.c.value_json).join(
            t, t.c.trial_id == a.c.trial_id
        )
        query = query.where(mine).order_by(a.c.trial_id, a.c.key)
        if self.keys is not None:
            asked = self.keys | {ROW_ATTR} if self.kept else self.keys
            query = query.where(a.c.key.in_(sorted(asked)))
        rows: dict[int, list[Any]] = defaultdict(list)
        texts: dict[int, list[tuple[str, str]]] = defaultdict(list)
        together: dict[int, str] = {}
        for trial_id, key, value in conn.execute(query):
            if key == ROW_ATTR and self.kept:
                together[trial_id] = value
            else:
                (texts if key in self.shared else rows)[trial_id].append((key, value))
        out = []
        for row in trials.all():
            kept = together.get(row[0])
            attrs = decode_attrs(rows[row[0]]) if kept is None else self.wanted(json.loads(kept))
            for key, text in texts[row[0]]:
                self.share(attrs, key, text)
            out.append(_trial(row, attrs))
        return out


def _trial(row: Any, attrs: dict[str, Any]) -> TrialAttrs:
    """A trial from its row (id, number, state, and its times when read) and attributes."""
    state = TrialState[str(getattr(row[2], "name", row[2]))]
    if len(row) == 3:
        return TrialAttrs(trial_id=row[0], number=row[1], state=state, user_attrs=attrs)
    return TrialAttrs(trial_id=row[0], number=row[1], state=state, user_attrs=attrs,
                      datetime_start=local_time(row[3]),
                      datetime_complete=local_time(row[4]))  # fmt: skip


def _from_frozen(t: FrozenTrial, keys: frozenset[str] | None, times: bool) -> TrialAttrs:
    attrs = t.user_attrs
    if keys is not None:
        attrs = {k: v for k, v in attrs.items() if k in keys}
    return TrialAttrs(
        trial_id=t._trial_id, number=t.number, state=t.state, user_attrs=attrs,
        datetime_start=t.datetime_start if times else None,
        datetime_complete=t.datetime_complete if times else None,
    )  # fmt: skip


def completed_trials(
    storage: optuna.storages.BaseStorage, study_id: int, trials: Sequence[TrialAttrs],
    kind: type[FrozenTrial] = FrozenTrial,
) -> list[FrozenTrial]:  # fmt: skip
    """The completed trials of ``trials`` (study ``study_id``'s, read with their times), in
    their order, as Optuna's trials (of class ``kind``) with their values, parameters and the
    parameters' distributions and no attributes (what Optuna's views of the report read): the
    same trials, less their attributes, as :class:`tuner.study.reader.TrialReader` builds
    them."""
    if not isinstance(storage, optuna.storages.RDBStorage):
        stored = storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE,))
        return [_without_attrs(t, kind) for t in stored]
    t = models.TrialModel.__table__
    p, v = models.TrialParamModel.__table__, models.TrialValueModel.__table__
    mine = sa.and_(t.c.study_id == sa.bindparam("study"), t.c.state == sa.bindparam("state"))
    asked = {"study": study_id, "state": TrialState.COMPLETE.name}
    params: dict[int, list[Any]] = defaultdict(list)
    values: dict[int, list[Any]] = defaultdict(list)
    with paused_collection(), storage.engine.connect() as conn:
        query = sa.select(
            p.c.trial_id, p.c.param_id, p.c.param_name, p.c.param_value, p.c.distribution_json
        ).join(t, t.c.trial_id == p.c.trial_id)
        for row in fetch_plain(conn, compile_statement(conn, query.where(mine)), asked):
            params[row[0]].append(row)  # as the driver gives it: (trial, id, name, value, text)
        query = sa.select(v.c.trial_id, v.c.objective, v.c.value, v.c.value_type)
        query = query.join(t, t.c.trial_id == v.c.trial_id).where(mine)
        for trial_id, *row in fetch_plain(conn, compile_statement(conn, query), asked):
            values[trial_id].append(row)
        known: dict[str, BaseDistribution] = {}
        return [_completed(t, params[t.trial_id], values[t.trial_id], known, kind)
                for t in trials if t.state == TrialState.COMPLETE]  # fmt: skip


def _completed(
    t: TrialAttrs, params: list[Any], values: list[Any], known: dict[str, BaseDistribution],
    kind: type[FrozenTrial],
) -> FrozenTrial:  # fmt: skip
    objectives = [0.0] * len(values)
    for objective, value, stored in values:  # the value's type: finite, or one of its own
        objectives[objective] = SPECIAL_VALUES.get(str(getattr(stored, "name", stored)), value)
    chosen: dict[str, Any] = {}
    dists: dict[str, BaseDistribution] = {}
    params.sort()  # one trial's: by the parameters' ids, Optuna's order
    for _trial, _pid, name, value, text in params:
        dist = known.get(text)
        if dist is None:  # once per distinct text: some 75,000 rows of a few distributions
            dist = known[text] = json_to_distribution(text)
        dists[name] = dist
        chosen[name] = dist.to_external_repr(value)
    return kind(
        number=t.number, state=t.state, value=None, values=objectives or None,
        datetime_start=t.datetime_start, datetime_complete=t.datetime_complete, params=chosen,
        distributions=dists, user_attrs={}, system_attrs={}, intermediate_values={},
        trial_id=t.trial_id,
    )  # fmt: skip


def _without_attrs(t: FrozenTrial, kind: type[FrozenTrial]) -> FrozenTrial:
    return kind(
        number=t.number, state=t.state, value=None, values=t.values,
        datetime_start=t.datetime_start, datetime_complete=t.datetime_complete, params=t.params,
        distributions=t.distributions, user_attrs={}, system_attrs={}, intermediate_values={},
        trial_id=t._trial_id,
    )  # fmt: skip
