"""tuner.study.reader: the trials as Optuna's own storage gives them, read incrementally."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from tuner.study.reader import TrialReader

DISTS = {"tp": CategoricalDistribution([1, 2, 4]), "lr": FloatDistribution(1e-5, 1e-2, log=True),
         "mbs": IntDistribution(1, 8), "sp": CategoricalDistribution([True, False])}  # fmt: skip


def fields(t: optuna.trial.FrozenTrial) -> tuple[object, ...]:
    return (t.number, t.state, t.values, t.datetime_start, t.datetime_complete, t.params,
            t.distributions, t.user_attrs, t.system_attrs, t.intermediate_values,
            t._trial_id)  # fmt: skip


def same(a: list[optuna.trial.FrozenTrial], b: list[optuna.trial.FrozenTrial]) -> None:
    assert [repr(fields(t)) for t in a] == [repr(fields(t)) for t in b]  # repr: nan == nan


def reader_and_optunas(
    tmp_path: Path,
) -> tuple[
    optuna.storages.RDBStorage,
    optuna.Study,
    TrialReader,
    Callable[[], list[optuna.trial.FrozenTrial]],
]:
    """A new study "s" in SQLite, its reader, and Optuna's own uncached read of its trials (a
    storage of its own, so nothing the study's storage caches is in it)."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    reader = TrialReader(storage, storage.get_study_id_from_name("s"))
    fresh = optuna.storages.RDBStorage(url)
    sid = fresh.get_study_id_from_name("s")
    return storage, study, reader, lambda: fresh.get_all_trials(sid, deepcopy=False)


def test_reads_what_optuna_reads_and_then_only_what_changed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    other = optuna.create_study(study_name="other", storage=storage)  # not read
    other.tell(other.ask(DISTS), 1.0)
    study.enqueue_trial({"tp": 2})  # a system attribute
    kept = []
    for n, end in enumerate(["ok", "inf", "pruned", "fail", "running", "ok"]):
        trial = study.ask(DISTS)
        trial.set_user_attr("config", {"tp": n, "nested": [1, {"a": None}]})
        # keys and values that need escaping or are not plain JSON, decoded as one object
        trial.set_user_attr('we"ird\\ké\n', ['\u00e9"', math.nan, -math.inf, 1e-300])
        trial.set_user_attr("ratio", 0.1 + n)
        trial.report(0.5 * n, step=1)
        if n == 1:
            trial.report(math.nan, step=2)
        if end == "ok":
            study.tell(trial, 1.0 + n)
        elif end == "inf":
            study.tell(trial, math.inf)
        elif end == "pruned":
            study.tell(trial, state=TrialState.PRUNED)
        elif end == "fail":
            study.tell(trial, state=TrialState.FAIL)
        else:
            kept.append(trial)
    reader = TrialReader(storage, storage.get_study_id_from_name("s"))
    fresh = optuna.storages.RDBStorage(url)  # Optuna's own reading, uncached
    sid = fresh.get_study_id_from_name("s")
    same(reader.trials(), fresh.get_all_trials(sid, deepcopy=False))

    # another worker finishes the running trial and adds two: both are seen
    worker = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(url))
    kept[0].set_user_attr("outcome", "ok")
    worker.tell(kept[0].number, 7.0)
    worker.ask(DISTS)
    worker.tell(worker.ask(DISTS), 8.0)
    again = reader.trials()
    same(again, fresh.get_all_trials(sid, deepcopy=False))
    assert [t.state for t in again[-3:]] == [TrialState.COMPLETE, TrialState.RUNNING,
                                             TrialState.COMPLETE]  # fmt: skip
    assert again[4].value == 7.0 and again[1].value == math.inf


def test_user_attributes_written_at_once_read_as_one_by_one(tmp_path: Path) -> None:
    """``set_user_attrs``: one transaction on SQLite, what ``set_user_attr`` per key leaves
    (values replaced, the trial's own view updated), and refused once finished."""
    from tuner.study.storage import set_user_attrs

    attrs = {"config": {"tp": 2, "nested": [1, None]}, "key": "tp=2", "launched": True}
    stores = {"rdb": optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'db.sqlite'}"),
              "memory": optuna.storages.InMemoryStorage()}  # fmt: skip
    seen = {}
    for name, storage in stores.items():
        study = optuna.create_study(study_name="s", storage=storage)
        trial = study.ask(DISTS)
        trial.set_user_attr("key", "old")
        set_user_attrs(trial, attrs)
        set_user_attrs(trial, {"reason": None, "launched": False})
        assert trial.user_attrs == attrs | {"reason": None, "launched": False}
        seen[name] = study.get_trials()[0].user_attrs
        study.tell(trial, 1.0)
        with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
            set_user_attrs(trial, {"late": 1})
    assert seen["rdb"] == seen["memory"] == attrs | {"reason": None, "launched": False}


def test_many_unfinished_trials_are_read_without_naming_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``MAX_IN`` unfinished trials the reader reads from the first of them (a database
    bounds one statement's variables) and sees the same trials as Optuna."""
    from tuner.study import reader as module

    monkeypatch.setattr(module, "MAX_IN", 1)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    study.tell(study.ask(DISTS), 1.0)
    open_ = [study.ask(DISTS) for _ in range(4)]
    study.tell(study.ask(DISTS), 2.0)  # finished after the first unfinished one
    reader = TrialReader(storage, storage.get_study_id_from_name("s"))
    fresh = optuna.storages.RDBStorage(url)
    sid = fresh.get_study_id_from_name("s")
    same(reader.trials(), fresh.get_all_trials(sid, deepcopy=False))
    assert len(reader._open) == 4
    open_[1].set_user_attr("outcome", "ok")
    study.tell(open_[1], 3.0)
    study.tell(open_[3], state=TrialState.FAIL)
    study.tell(study.ask(DISTS), 4.0)
    same(reader.trials(), fresh.get_all_trials(sid, deepcopy=False))
    assert len(reader._open) == 2


def test_a_database_made_anew_is_told_from_the_one_read(tmp_path: Path) -> None:
    """The report's per-process cache of readers asks :meth:`TrialReader.unchanged`: a
    database removed and made again (perhaps on the same inode) is another one."""
    path = tmp_path / "db.sqlite"
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    study = optuna.create_study(study_name="s", storage=storage)
    study.tell(study.ask(DISTS), 1.0)
    reader = TrialReader(storage, storage.get_study_id_from_name("s"))
    assert reader.unchanged()  # nothing read yet: nothing to be wrong about
    assert [t.value for t in reader.trials()] == [1.0]
    study.tell(study.ask(DISTS), 2.0)  # more trials: the same database
    assert reader.unchanged() and [t.value for t in reader.trials()] == [1.0, 2.0]
    storage.engine.dispose()
    path.unlink()
    again = optuna.create_study(study_name="s", storage=f"sqlite:///{path}")
    for v in (5.0, 6.0):
        again.tell(again.ask(DISTS), v)
    assert not reader.unchanged()


def test_a_read_leaves_the_garbage_collector_as_it_found_it(tmp_path: Path) -> None:
    import gc

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    study = optuna.create_study(study_name="s", storage=storage)
    study.tell(study.ask(DISTS), 1.0)
    reader = TrialReader(storage, storage.get_study_id_from_name("s"))
    assert gc.isenabled()
    assert len(reader.trials()) == 1
    assert gc.isenabled()
    gc.disable()
    try:
        study.tell(study.ask(DISTS), 2.0)
        assert len(reader.trials()) == 2
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_trials_finishing_out_of_order_read_as_optuna_reads_them(tmp_path: Path) -> None:
    """The kept finished trials (in id order, the unfinished ones merged in by id) give the
    list a fresh read gives after every round, with trials finishing in any order."""
    import random

    _, study, reader, optunas = reader_and_optunas(tmp_path)
    rng = random.Random(7)
    running: list[optuna.Trial] = []
    ended = 0
    for _ in range(12):
        running += [study.ask(DISTS) for _ in range(rng.randint(0, 4))]
        for trial in rng.sample(running, k=min(len(running), rng.randint(0, 3))):
            running.remove(trial)  # not the oldest first: ids finish out of order
            study.tell(trial, 1.0 + trial.number)
            ended += 1
        same(reader.trials(), optunas())
    assert ended > 10 and running  # out of order, with some still running at the end
    for trial in running:
        study.tell(trial, state=TrialState.FAIL)
    same(reader.trials(), optunas())
    assert reader.trials() is not reader.trials()  # a list of each read's own


@pytest.mark.parametrize("max_in", [500, 1])
def test_running_trials_changed_in_place_are_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_in: int
) -> None:
    """An unfinished trial read unchanged is the last read's object; any change to it (a
    value written over under its key, a new attribute, a reported step, a system attribute,
    its end) gives what a fresh read gives, round after round."""
    import random

    from tuner.study import reader as module

    monkeypatch.setattr(module, "MAX_IN", max_in)
    storage, study, reader, optunas = reader_and_optunas(tmp_path)
    rng = random.Random(3)
    running = [study.ask(DISTS) for _ in range(6)]
    for trial in running:
        trial.set_user_attr("ratio", 0.5)
    last = {t.number: t for t in reader.trials()}
    kept = changed = 0
    for round_ in range(16):
        touched = set()
        for trial in rng.sample(running, k=min(len(running), 3)):
            touched.add(trial.number)
            how = rng.randrange(5)
            if how == 0:  # the same key, a new value: the row keeps its id
                trial.set_user_attr("ratio", round_ + rng.random())
            elif how == 1:
                trial.set_user_attr(f"new{round_}", [round_, None])
            elif how == 2:
                trial.report(rng.random(), step=round_)
            elif how == 3:
                storage.set_trial_system_attr(trial._trial_id, "state", {"r": round_})
            else:
                running.remove(trial)
                study.tell(trial, 1.0 + round_)
        running += [study.ask(DISTS) for _ in range(rng.randint(0, 2))]
        read = reader.trials()
        same(read, optunas())
        for t in read:
            if not t.state.is_finished() and t.number in last and t.number not in touched:
                assert t is last[t.number]  # unchanged: not built again
                kept += 1
            elif t.number in touched:
                assert t is not last[t.number]
                changed += 1
        last = {t.number: t for t in read}
    assert kept > 20 and changed > 20


def test_statements_run_through_sqlalchemy_read_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the driver's own connection or the parameters' order is not at hand, the same
    named statements run through SQLAlchemy and read the same trials."""
    from tuner.study import reader as module

    monkeypatch.setattr(
        module, "compile_statement", lambda conn, query: module._Statement(query, None, None)
    )
    _, study, reader, optunas = reader_and_optunas(tmp_path)
    running = [study.ask(DISTS) for _ in range(3)]
    running[0].set_user_attr("config", {"tp": 2})
    same(reader.trials(), optunas())
    study.tell(running[1], 2.0)
    running[2].set_user_attr("ratio", 0.25)
    study.ask(DISTS)
    same(reader.trials(), optunas())


def test_unfinished_trials_named_in_a_few_padded_lists(tmp_path: Path) -> None:
    """Each count of unfinished trials from 1 to 19 and back reads as Optuna reads; the ids are
    named in lists padded to a power of two (the last id repeated), so the statements
    compiled are one per such size and table, not one per count."""
    from tuner.study import reader as module

    assert [module.in_size(n) for n in (0, 1, 2, 3, 5, 64, 65, 300, 500)] == [
        0, 1, 2, 4, 8, 64, 128, 500, 500]  # fmt: skip
    _, study, reader, optunas = reader_and_optunas(tmp_path)
    running: list[optuna.Trial] = []
    for n in range(1, 20):
        running.append(study.ask(DISTS))
        running[-1].set_user_attr("n", n)
        same(reader.trials(), optunas())
    while running:
        study.tell(running.pop(0), 1.0)
        same(reader.trials(), optunas())
    sizes = {shape[2] for shape in reader._statements if shape[1] == "in"}
    assert sizes == {0, 1, 2, 4, 8, 16, 32}  # 0: no trial in flight
