"""A new running trial in one transaction of three statements, and its ``optuna.Trial``.

Optuna's ``RDBStorage.create_new_trial`` goes through its ORM (a session, the study's row
locked, an insert flushed, the trial's number counted, a commit), and ``optuna.Trial(study,
trial_id)`` then reads the new trial back (``storage.get_trial``: an unfinished trial is never
served from the cache, so a select of the trial and its parameters, attributes, values and
intermediate values): together most of the CPU of creating a trial in the study loop's ask
(:mod:`tuner.study.asking`). :func:`new_trial` writes the same row as Optuna does (the study's row
locked, the trial inserted running with its start time, its number the count of the study's
trials before it: Optuna's ``count_past_trials``), adds it to Optuna's cache as
``_CachedStorage.create_new_trial`` does, and builds the ``Trial`` from what it wrote, as
``Trial.__init__`` does from what it reads (``tests/test_asking.py``: the same rows and the same
view of the trial as Optuna's ask).
"""

from __future__ import annotations

import copy
import datetime

import optuna
import sqlalchemy as sa
from optuna.pruners import _filter_study
from optuna.storages._cached_storage import _CachedStorage, _StudyInfo
from optuna.trial import FrozenTrial, TrialState

OPTUNA_INTERNALS = hasattr(_CachedStorage, "_add_trials_to_cache")
"""The private parts of Optuna this module writes to are where it expects them (the project
allows ``optuna>=4.0``); otherwise every trial is created through Optuna itself."""


def new_trial(study: optuna.Study, backend: optuna.storages.RDBStorage,
              settled: tuple[int, int] = (0, 0)) -> optuna.Trial:  # fmt: skip
    """A new running trial of ``study`` (whose storage is Optuna's cache over ``backend``, an
    RDB storage), created and built as ``optuna.Trial(study, storage.create_new_trial(...))``
    creates and builds it; through Optuna itself for any other storage, or an Optuna whose
    cache has another shape (:data:`OPTUNA_INTERNALS`). ``settled``: a trial id and how many
    of the study's trials are below it (:meth:`tuner.study.reader.TrialReader.settled`): the
    trials before the new one are counted from that id on."""
    storage = study._storage
    if (
        not OPTUNA_INTERNALS
        or not isinstance(storage, _CachedStorage)
        or (storage._backend is not backend)
    ):
        return optuna.Trial(study, storage.create_new_trial(study._study_id))
    frozen = _insert(backend, study._study_id, settled)
    with storage._lock:  # as _CachedStorage.create_new_trial
        if study._study_id not in storage._studies:
            storage._studies[study._study_id] = _StudyInfo()
        storage._add_trials_to_cache(study._study_id, [frozen])
    trial = optuna.Trial.__new__(optuna.Trial)  # Trial.__init__, with the trial as written
    trial.study, trial._trial_id, trial.storage = study, frozen._trial_id, storage
    trial._cached_frozen_trial = copy.deepcopy(frozen)  # what get_trial returns: a fresh copy
    study.sampler.before_trial(_filter_study(study, trial._cached_frozen_trial),
                               trial._cached_frozen_trial)  # fmt: skip
    trial.relative_search_space = None
    trial._relative_params = None
    trial._fixed_params = {}
    return trial


def _insert(backend: optuna.storages.RDBStorage, study_id: int,
            settled: tuple[int, int] = (0, 0)) -> FrozenTrial:  # fmt: skip
    """Optuna's ``_create_new_trial`` without a template: the row and its frozen view. Its
    number, the count of the study's trials before it, is ``settled``'s count below its id
    and the trials from that id on (no trial is added below an id there is: a new trial's id
    is above every id in the table, and the study's row is locked while one is added)."""
    from optuna.storages._rdb import models

    trials, studies = models.TrialModel.__table__, models.StudyModel.__table__
    start = datetime.datetime.now()
    stored = start  # the column holds naive UTC where the model converts (Optuna 5), else local
    if hasattr(models.TrialModel, "_datetime_start_utc"):
        stored = start.astimezone(datetime.UTC).replace(tzinfo=None)
    lock = sa.select(studies.c.study_id).where(studies.c.study_id == study_id)
    with backend.engine.begin() as conn:
        if conn.execute(lock.with_for_update()).first() is None:  # as find_or_raise_by_id
            raise KeyError(f"No study with study_id {study_id} exists.")
        row = {"study_id": study_id, "number": None, "state": TrialState.RUNNING,
               "datetime_start": stored}  # fmt: skip
        key = conn.execute(trials.insert().values(**row)).inserted_primary_key
        assert key is not None
        trial_id = key[0]
        below, before = settled
        count = sa.select(sa.func.count(trials.c.trial_id)).where(
            trials.c.study_id == study_id, trials.c.trial_id >= below, trials.c.trial_id < trial_id
        )
        number = before + int(conn.execute(count).scalar_one())
        conn.execute(trials.update().where(trials.c.trial_id == trial_id).values(number=number))
    return FrozenTrial(number=number, state=TrialState.RUNNING, value=None, values=None,
                       datetime_start=start, datetime_complete=None, params={},
                       distributions={}, user_attrs={}, system_attrs={},
                       intermediate_values={}, trial_id=int(trial_id))  # fmt: skip
