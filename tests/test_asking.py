"""tuner.study.asking: a trial asked in one write is the trial Optuna's own ask stores."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.study.asking import ask
from tuner.study.storage import write_trial

DISTS = {"tp": CategoricalDistribution([1, 2, 4]), "lr": FloatDistribution(1e-5, 1e-2, log=True),
         "mbs": IntDistribution(1, 8), "sp": CategoricalDistribution([True, False]),
         "one": CategoricalDistribution(["only"])}  # fmt: skip


def attrs(params: dict[str, Any]) -> dict[str, Any]:
    return {"key": f"tp{params['tp']}-mbs{params['mbs']}", "config": dict(params)}


def stored(url: str, name: str) -> list[tuple[Any, ...]]:
    """What a later reader gets through Optuna's API (a fresh, uncached storage), less the
    ids and times a second study cannot share."""
    fresh = optuna.storages.RDBStorage(url)
    trials = fresh.get_all_trials(fresh.get_study_id_from_name(name), deepcopy=False)
    return [fields(t) for t in trials]


def fields(t: FrozenTrial) -> tuple[Any, ...]:
    return (t.number, t.state, t.values, list(t.params.items()), list(t.distributions.items()),
            t.user_attrs, t.system_attrs)  # fmt: skip


def run(url: str, make: Callable[[], optuna.samplers.BaseSampler], fast: bool) -> None:
    study = optuna.create_study(study_name="s", storage=url, sampler=make())
    for n in range(14):
        if fast:
            trial = ask(study, DISTS, attrs)
        else:
            trial = study.ask(DISTS)
            for k, v in attrs(trial.params).items():
                trial.set_user_attr(k, v)
        # the trial's own view, as Optuna keeps it (system attributes are read lazily)
        view = fields(study._storage.get_trial(trial._trial_id))[:-1]
        assert fields(trial._cached_frozen_trial)[:-1] == view
        if n % 5 == 4:
            study.tell(trial, state=TrialState.PRUNED)
        elif n != 13:  # the last one stays running
            study.tell(trial, trial.params["lr"] * trial.params["mbs"] / trial.params["tp"])


@pytest.mark.parametrize(
    "make",
    [
        lambda: optuna.samplers.RandomSampler(seed=3),
        # relative (multivariate) parameters after 5 trials, independent ones before
        lambda: optuna.samplers.TPESampler(seed=3, multivariate=True, n_startup_trials=5),
    ],
    ids=["random", "tpe"],
)
def test_stores_what_optunas_ask_stores(tmp_path: Path, make: Callable[[], Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        theirs, mine = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
        run(theirs, make, fast=False)
        run(mine, make, fast=True)
    got, want = stored(mine, "s"), stored(theirs, "s")
    assert len(want) == 14 and want[-1][1] == TrialState.RUNNING
    assert got == want


def test_a_waiting_trial_is_popped_with_its_fixed_parameters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="s", storage=url)
    study.enqueue_trial({"tp": 4, "mbs": 2})
    first = ask(study, DISTS, attrs)
    assert (first.params["tp"], first.params["mbs"]) == (4, 2)
    assert first.user_attrs["key"] == "tp4-mbs2"
    second = ask(study, DISTS, attrs)  # the queue is empty again: a new trial
    assert second.number == 1
    assert [t.state for t in study.get_trials()] == [TrialState.RUNNING] * 2
    assert stored(url, "s")[1][3] == list(second.params.items())


def test_refuses_what_optuna_refuses(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="s", storage=url)
    study.tell(ask(study, DISTS), 1.0)
    changed = DISTS | {"tp": CategoricalDistribution([1, 2, 8])}  # choices changed
    with pytest.raises(ValueError, match="dynamic value space"):
        ask(study, changed)
    kind = DISTS | {"mbs": FloatDistribution(1, 8)}
    with pytest.raises(ValueError, match="different distribution kind"):
        ask(study, kind)
    done = study.get_trials()[0]
    trial = optuna.Trial(study, done._trial_id)
    backend = study._storage._backend  # type: ignore[attr-defined]
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        write_trial(backend, trial, {}, {"late": 1})
    # nothing of the refused writes was stored
    assert [len(t.params) for t in study.get_trials()] == [5, 0, 0]
    assert "late" not in study.get_trials()[0].user_attrs


def test_other_storages_ask_through_optuna(tmp_path: Path) -> None:
    journal = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "j.log"))
    )
    study = optuna.create_study(study_name="s", storage=journal)
    trial = ask(study, DISTS, attrs)
    assert set(trial.params) == set(DISTS) and trial.user_attrs["key"].startswith("tp")
    assert study.get_trials()[0].params == trial.params


class Recording(optuna.samplers.RandomSampler):
    """A sampler that records its state on the trial in its relative sample (as Optuna's and
    the model sampler do) and reads it back for the independent ones."""

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return {"tp": DISTS["tp"]}

    def sample_relative(self, study: Any, trial: Any, space: dict[str, Any]) -> dict[str, Any]:
        study._storage.set_trial_system_attr(trial._trial_id, "why", ["exploration", trial.number])
        return {"tp": 2}

    def sample_independent(self, study: Any, trial: Any, name: str, dist: Any) -> Any:
        assert study._storage.get_trial_system_attrs(trial._trial_id)["why"][1] == trial.number
        assert study._storage.get_trial(trial._trial_id).system_attrs["why"][0] == "exploration"
        return super().sample_independent(study, trial, name, dist)


def test_the_samplers_own_record_is_stored_with_the_parameters(tmp_path: Path) -> None:
    for name, fast in (("a", False), ("b", True)):
        url = f"sqlite:///{tmp_path / name}.db"
        study = optuna.create_study(study_name="s", storage=url, sampler=Recording(seed=1))
        for _ in range(3):
            trial = ask(study, DISTS, attrs) if fast else study.ask(DISTS)
            if not fast:
                for k, v in attrs(trial.params).items():
                    trial.set_user_attr(k, v)
            study.tell(trial, 1.0)
    got, want = (
        stored(f"sqlite:///{tmp_path / 'b'}.db", "s"),
        stored(f"sqlite:///{tmp_path / 'a'}.db", "s"),
    )
    assert [t[6] for t in want] == [{"why": ["exploration", n]} for n in range(3)]
    assert got == want


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_asks_from_where_a_read_settled_the_trials(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """Given a reader's bound (every trial below an id finished, and how many there are), a new
    trial gets the number Optuna gives and a trial enqueued since the read is popped: over
    rounds in which another study's trials interleave, running trials finish out of order and
    trials are added after the read."""
    import random

    from tuner.study.reader import TrialReader

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    if kind == "postgresql":
        url = request.getfixturevalue("postgres").create_database("settled")
    study = optuna.create_study(study_name="s", storage=url)
    other = optuna.create_study(study_name="o", storage=url)
    storage = optuna.storages.RDBStorage(url)
    reader = TrialReader(storage, storage.get_study_id_from_name("s"))
    rng, running, bounds = random.Random(5), [], set()
    for round_ in range(12):
        for _ in range(rng.randint(1, 4)):  # the oldest first, or any other
            if running:
                at = 0 if rng.random() < 0.5 else rng.randrange(len(running))
                study.tell(running.pop(at), 1.0)
        other.tell(other.ask(), 1.0)
        read = reader.trials()
        settled = reader.settled()
        bounds.add(settled)
        first_open = [t._trial_id for t in read if not t.state.is_finished()]
        assert settled[0] == (first_open or [read[-1]._trial_id + 1 if read else 0])[0]
        assert settled[1] == sum(t._trial_id < settled[0] for t in read)
        running.append(study.ask(DISTS))  # added after the read
        if round_ % 4 == 3:
            study.enqueue_trial({"tp": 4, "mbs": 3})
            popped = ask(study, DISTS, attrs, settled)
            assert (popped.params["tp"], popped.params["mbs"]) == (4, 3)
            running.append(popped)
        running += [ask(study, DISTS, attrs, settled) for _ in range(rng.randint(1, 2))]
    assert len({b for b, _ in bounds}) > 6  # the bound moved with the reads
    read = stored(url, "s")
    assert [t[0] for t in read] == list(range(len(read)))  # Optuna's numbering: 0, 1, 2...
    waiting = [t for t in read if t[1] == TrialState.WAITING]
    assert not waiting
