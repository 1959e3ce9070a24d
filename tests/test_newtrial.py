"""tuner.study.newtrial: a trial created in one transaction is the trial Optuna creates."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.study.newtrial import new_trial
from tuner.study.storage import upsert_backend


def test_the_row_and_the_view_are_optunas(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="s", storage=url)
    other = optuna.create_study(study_name="o", storage=url)  # numbers count per study
    backend = upsert_backend(study._storage)
    assert backend is not None
    made = []
    for n in range(5):
        if n == 2:
            other.tell(other.ask(), 1.0)
        mine = new_trial(study, backend)
        theirs = optuna.Trial(study, study._storage.create_new_trial(study._study_id))
        made += [mine, theirs]
        assert (mine.number, theirs.number) == (2 * n, 2 * n + 1)
        view = study._storage.get_trial(mine._trial_id)  # read back from the database
        assert mine._cached_frozen_trial == view and view.state == TrialState.RUNNING
        assert (
            mine._cached_frozen_trial
            is not study._storage._studies[study._study_id].trials[mine.number]
        )  # a copy: the trial's own view is not the cache's entry
    study.tell(made[0], 2.0)
    fresh = optuna.storages.RDBStorage(url)  # a later reader
    read = fresh.get_all_trials(fresh.get_study_id_from_name("s"))
    assert [t.number for t in read] == list(range(10))
    assert read[0].value == 2.0 and read[0].datetime_start == made[0].datetime_start
    assert all(t.state == TrialState.RUNNING for t in read[1:])
    assert [t.number for t in study.get_trials()] == list(range(10))


def test_an_optuna_of_another_shape_gets_its_trials_through_optuna(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The project allows any Optuna from 4.0: where its cache lacks what this module writes to,
    the trial is created by Optuna itself (the same numbering, a row read back)."""
    from tuner.study import newtrial

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="s", storage=url)
    backend = upsert_backend(study._storage)
    assert backend is not None
    monkeypatch.setattr(newtrial, "OPTUNA_INTERNALS", False)
    monkeypatch.setattr(newtrial, "_insert", lambda *a: pytest.fail("wrote Optuna's rows"))
    trial = new_trial(study, backend)
    assert (
        trial.number == 0
        and study._storage.get_trial(trial._trial_id).state.is_finished() is False
    )
