"""A new trial and its parameters in a few statements: ``Study.ask`` as the study loop calls it.

Optuna's ask re-reads every unfinished trial through its ORM to look for a waiting one (with 64
trials in flight, tens of milliseconds of CPU), then writes each parameter in a transaction of
its own (a select of the trial, a select of the study's first distribution of that name, an
insert, a commit). :func:`ask` looks for a waiting trial with one plain query and, when there is
none, creates the trial (:mod:`tuner.study.newtrial`: Optuna's row, in one transaction of
three statements, not read back), samples its parameters exactly as ``Trial._suggest``
does (the sampler's relative sample, else its independent one) and writes them, with the
attributes the caller derives from them, in one transaction
(:func:`tuner.study.storage.write_trial`). A waiting trial (enqueued: its parameters are
fixed) and a storage without the upsert are left to Optuna's own ask.

What is stored is what Optuna's ask stores: the same rows in the same tables, in the same order,
read back the same through Optuna's API.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, cast

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution, _get_single_value
from optuna.pruners import _filter_study
from optuna.trial import TrialState

from tuner.space.trials import config_from_params
from tuner.spec.study import StudySpec
from tuner.study.newtrial import new_trial
from tuner.study.storage import set_user_attrs, upsert_backend, write_trial

Attrs = Callable[[dict[str, Any]], dict[str, Any]]
"""The user attributes a trial gets with its parameters (external values, by name)."""


def ask(study: optuna.Study, dists: dict[str, BaseDistribution], attrs: Attrs | None = None,
        settled: tuple[int, int] = (0, 0)) -> optuna.Trial:  # fmt: skip
    """``study.ask(dists)``, then ``attrs(trial.params)`` as user attributes; on SQLite and
    PostgreSQL in two transactions (the trial; its parameters with the attributes and the
    sampler's own record) instead of one per parameter and attribute. ``settled``: an id
    below which every trial of the study is finished and how many of its trials are below it
    (:meth:`tuner.study.reader.TrialReader.settled`): the look for a waiting trial and the
    new trial's count of the trials before it start there (with 10,000 stored trials each
    walked every trial of the study: 1.6 and 1.1 ms of SQLite's CPU an ask)."""
    backend = upsert_backend(study._storage)
    if backend is None or _waiting(backend, study._study_id, settled[0]):
        trial = study.ask(dists)  # an enqueued trial: Optuna pops it and fixes its parameters
        if attrs is not None:
            set_user_attrs(trial, attrs(trial.params))
        return trial
    study._thread_local.cached_all_trials = None  # as Study.ask: sync the storage once a trial
    trial = new_trial(study, backend, settled)  # one transaction, not read back (newtrial)
    params: dict[str, tuple[float, BaseDistribution]] = {}
    cached = trial._cached_frozen_trial
    storage = study._storage
    held = _Held(storage, trial._trial_id)  # the sampler's own record: kept for the write
    study._storage = cast("optuna.storages.BaseStorage", held)
    try:
        for name, dist in dists.items():
            value = _sample(study, trial, name, dist)
            internal = dist.to_internal_repr(value)  # refuses an invalid value, as Optuna does
            params[name] = (internal, dist)
            cached.distributions[name] = dist  # what a later parameter's sampler sees, as in
            cached.params[name] = value  # Trial._suggest (written below)
    finally:
        study._storage = storage
    extra = attrs(dict(cached.params)) if attrs is not None else {}
    write_trial(backend, trial, params, extra, held.system)
    return trial


class _Held:
    """The study's storage while a new trial's parameters are sampled: the system attributes
    the sampler records on that trial (Optuna's samplers and the model sampler record their
    state so) are kept for the trial's one write and read back from here meanwhile; everything
    else goes to ``storage``."""

    def __init__(self, storage: optuna.storages.BaseStorage, trial_id: int) -> None:
        self._storage, self._trial_id = storage, trial_id
        self.system: dict[str, Any] = {}

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        if trial_id != self._trial_id:
            return self._storage.set_trial_system_attr(trial_id, key, value)
        self.system[key] = value

    def get_trial_system_attrs(self, trial_id: int) -> dict[str, Any]:
        found = self._storage.get_trial_system_attrs(trial_id)
        return found | self.system if trial_id == self._trial_id else found

    def get_trial(self, trial_id: int) -> optuna.trial.FrozenTrial:
        found = self._storage.get_trial(trial_id)
        if trial_id != self._trial_id or not self.system:
            return found
        held = copy.copy(found)
        held.system_attrs = found.system_attrs | self.system
        return held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)


def config_attrs(spec: StudySpec, params: dict[str, Any]) -> dict[str, Any]:
    """What the loop records with a trial's parameters: the config they spell and its key."""
    config = config_from_params(spec, params)
    return {"config": dataclasses.asdict(config), "key": config.key()}


def _sample(study: optuna.Study, trial: optuna.Trial, name: str,
            dist: BaseDistribution) -> Any:  # fmt: skip
    """Parameter ``name`` of a new trial as ``Trial._suggest`` picks it (a new trial has no
    fixed parameters: only an enqueued one does)."""
    if dist.single():
        return _get_single_value(dist)
    if trial._is_relative_param(name, dist):
        return trial.relative_params[name]
    latest = trial._get_latest_trial()
    return study.sampler.sample_independent(_filter_study(study, latest), latest, name, dist)


def _waiting(backend: optuna.storages.RDBStorage, study_id: int, below: int = 0) -> bool:
    """Whether the study has a waiting (enqueued) trial: one indexed query, where Optuna's ask
    reads every unfinished trial to find one; from trial id ``below`` on (the trials below it
    are finished)."""
    from optuna.storages._rdb import models

    t = models.TrialModel.__table__
    query = sa.select(t.c.trial_id).where(
        t.c.study_id == study_id, t.c.trial_id >= below, t.c.state == TrialState.WAITING
    )
    with backend.engine.connect() as conn:
        return conn.execute(query.limit(1)).first() is not None
