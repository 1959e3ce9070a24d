"""A recorded trial keeps its shown attributes together (:mod:`tuner.study.row_attrs`), and the
read commands' light read reads a trial that kept them by that one attribute: the same
attributes as the whole read, for a study that mixes trials that kept them with trials that
did not (ended through Optuna, or stored by an older tuner)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
from optuna.storages._rdb import models

from tests.test_results import SPEC, config
from tuner.layout import ResultsLayout
from tuner.outcome import Outcome
from tuner.report import data as D
from tuner.report import leaderboard as L
from tuner.space.trials import distributions
from tuner.study.attrs_read import read_attrs
from tuner.study.record import Verdict, tell
from tuner.study.row_attrs import ROW_ATTR, ROW_KEYS
from tuner.study.storage import open_storage

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")

SCREENED: dict[str, Any] = {"predicted_step_s": 2.5, "predicted_peak_gib": 61.0,
                            "predicted_peak_stage": 0, "predicted_peak_phase": "fwd_bwd",
                            "predicted_step_sd": 0.1, "worker": "w:1"}  # fmt: skip


def _recorded(study: optuna.Study, tp: int, verdict: Verdict, **attrs: Any) -> optuna.Trial:
    """A trial screened, launched and recorded as the loop records it (:func:`tell`)."""
    trial = study.ask(distributions(SPEC))
    c = config(tp, 1)
    screened = {"config": dataclasses.asdict(c), "key": c.key(), **SCREENED}
    for k, v in {**screened, "hosts": ["n0", "n1"], "launched": True, **attrs}.items():
        trial.set_user_attr(k, v)
    tell(study, trial, verdict, 300.0)
    return trial


def _study(results: Path) -> optuna.Study:
    """Trials that kept their attributes (measured, a NaN figure, OOM, a proxy, a timeout)
    and trials that did not (ended through Optuna's tell, running, a duplicate)."""
    layout = ResultsLayout(results, SPEC.name)
    study = optuna.create_study(study_name=SPEC.name, storage=open_storage(None, layout),
                                sampler=optuna.samplers.RandomSampler(seed=0))  # fmt: skip
    ok = {"step_time_s": 2.0, "tokens_per_s": 65536.0, "peak_memory_gib": 55.5, "mfu": 0.41,
          "objective": "steady"}  # fmt: skip
    _recorded(study, 2, Verdict(Outcome.OK, None, ok))
    _recorded(study, 4, Verdict(Outcome.OK, None, {**ok, "tokens_per_s": math.nan}))
    _recorded(study, 1, Verdict(Outcome.OOM, "CUDA out of memory", {}))
    _recorded(study, 4, Verdict(Outcome.OK, None, {**ok, "step_time_s": 1.5}), proxy=True,
              proxy_dp=2, proxy_nodes=1, proxy_step_s=1.25)  # fmt: skip
    _recorded(study, 8, Verdict(Outcome.TIMEOUT, "no step in 20 min", {}))
    plain = study.ask(distributions(SPEC))  # ended through Optuna: nothing kept
    for k, v in {"config": dataclasses.asdict(config(2, 1)), "outcome": "ok",
                 "step_time_s": 3.0, "launched": True, "hosts": ["n2"]}.items():  # fmt: skip
        plain.set_user_attr(k, v)
    study.tell(plain, 3.0)
    running = study.ask(distributions(SPEC))
    running.set_user_attr("config", dataclasses.asdict(config(8, 1)))
    dup = study.ask(distributions(SPEC))
    dup.set_user_attr("duplicate_of", 0)
    dup.set_user_attr("outcome", "ok")
    study.tell(dup, 2.0)
    return study


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("kept")
    _study(tmp)
    return str(tmp)


def test_a_recorded_trial_keeps_its_shown_attributes_together(results: str) -> None:
    """The kept object is the trial's stored attributes of :data:`ROW_KEYS` (its screen's,
    its launch's and its record's), nothing else; a trial ended otherwise keeps none."""
    whole = L.stored_trials(SPEC, None, results)
    kept = [t for t in whole if ROW_ATTR in t.user_attrs]
    assert [t.number for t in kept] == [0, 1, 2, 3, 4]
    for t in kept:
        shown = {k: v for k, v in t.user_attrs.items() if k in ROW_KEYS}
        assert _same(t.user_attrs[ROW_ATTR], shown), t.number
        assert {"outcome", "duration_s", "predicted_step_s", "launched"} <= shown.keys()
    assert math.isnan(kept[1].user_attrs[ROW_ATTR]["tokens_per_s"])
    assert kept[2].user_attrs[ROW_ATTR]["reason"] == "CUDA out of memory"


def test_the_kept_attributes_are_those_the_read_commands_show() -> None:
    """Every attribute the leaderboard and the report read is kept, but the shared config
    and hosts (a reader's attribute missing from the list reads every trial row by row)."""
    shown = set(L.BOARD_ATTRS) | set(D.REPORT_ATTRS)
    assert shown - {"config", "hosts"} == set(ROW_KEYS) and len(ROW_KEYS) == len(set(ROW_KEYS))


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("shared", [(), ("config", "hosts")])
def test_the_light_read_of_kept_and_unkept_trials_is_the_whole_read(
    results: str, grouped: bool, shared: tuple[str, ...]
) -> None:
    """The leaderboard's and the report's attributes (and a list with one not kept) as the
    whole read decodes them, whichever way each trial stored them."""
    whole = L.stored_trials(SPEC, None, results)
    reader = L._opened(SPEC, None, results)[1]
    for keys in (L.BOARD_ATTRS, D.REPORT_ATTRS, ("outcome", "worker"), ("reason",)):
        light = read_attrs(reader.storage, reader.study_id, keys, shared=shared, times=True,
                           grouped=grouped)  # fmt: skip
        assert [t.number for t in light] == [t.number for t in whole]
        for t, w in zip(light, whole, strict=True):
            wanted = {k: v for k, v in w.user_attrs.items() if k in keys}
            assert _same(t.user_attrs, wanted), (keys, t.number, t.user_attrs, wanted)


@pytest.mark.parametrize("grouped", [True, False])
def test_a_kept_trial_is_read_by_its_one_attribute(tmp_path: Path, grouped: bool) -> None:
    """A trial that kept its attributes is read from the kept object, not from its rows (a
    row changed behind the tuner's back shows only where a list asks an attribute not kept,
    which reads rows, and where the config or the hosts are not read shared: then they are
    asked with the others); a trial that kept none is read from its rows."""
    study = _study(tmp_path)
    storage: Any = getattr(study._storage, "_backend", study._storage)  # under Optuna's cache
    table = models.TrialUserAttributeModel.__table__
    with storage.engine.begin() as conn:  # both trials' reason rows, not the kept object
        conn.execute(table.update().where(table.c.key == "reason")
                     .values(value_json='"changed"'))  # fmt: skip
    shared = ("config", "hosts")  # as the read commands read them
    light = read_attrs(storage, study._study_id, D.REPORT_ATTRS, shared=shared, grouped=grouped)
    assert light[2].user_attrs["reason"] == "CUDA out of memory"  # kept
    assert light[0].user_attrs["reason"] is None
    rows = read_attrs(storage, study._study_id, ("reason", "worker"), shared=shared,
                      grouped=grouped)  # fmt: skip
    assert rows[2].user_attrs["reason"] == "changed"  # 'worker' is not kept: rows
    unshared = read_attrs(storage, study._study_id, D.REPORT_ATTRS, grouped=grouped)
    assert unshared[2].user_attrs["reason"] == "changed"
    with storage.engine.begin() as conn:
        conn.execute(table.update().where(table.c.key == "outcome")
                     .where(table.c.trial_id == sa.select(models.TrialModel.trial_id)
                            .where(models.TrialModel.number == 5).scalar_subquery())
                     .values(value_json='"oom"'))  # fmt: skip
    light = read_attrs(storage, study._study_id, D.REPORT_ATTRS, shared=shared, grouped=grouped)
    assert light[5].user_attrs["outcome"] == "oom"  # ended through Optuna: its rows


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b) and type(a) is type(b)


def test_board_trials_read_again_reads_from_the_first_unfinished_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second read (``leaderboard()`` called again by a long-lived caller) reads only the
    trials from the first one unfinished at the first read; what it returns is a fresh
    read's, after that trial ended and new ones were added."""
    study = _study(tmp_path)
    results = str(tmp_path)
    reader = L._opened(SPEC, None, results)[1]

    def fresh() -> list[Any]:
        return read_attrs(reader.storage, reader.study_id, L.BOARD_ATTRS, times=True)

    def same(got: list[Any], want: list[Any]) -> bool:
        return [(t.trial_id, t.number, t.state, t.datetime_complete) for t in got] == [
            (t.trial_id, t.number, t.state, t.datetime_complete) for t in want
        ] and all(_same(g.user_attrs, w.user_attrs) for g, w in zip(got, want, strict=True))

    assert same(L.board_trials(SPEC, None, results, times=True), fresh())
    running = next(t for t in fresh() if t.state == optuna.trial.TrialState.RUNNING)
    asked: list[int] = []
    real = L.read_attrs

    def spied(*args: Any, since: int = 0, **kwargs: Any) -> Any:
        asked.append(since)
        return real(*args, since=since, **kwargs)

    monkeypatch.setattr(L, "read_attrs", spied)
    trial = optuna.Trial(study, running.trial_id)
    tell(study, trial, Verdict(Outcome.OOM, "CUDA out of memory", {}), 10.0)
    _recorded(study, 2, Verdict(Outcome.OK, None, {"step_time_s": 2.5}))
    again = L.board_trials(SPEC, None, results, times=True)
    assert asked == [running.trial_id] and same(again, fresh()) and len(again) == 9
    assert again[running.number].user_attrs["outcome"] == "oom"
    assert same(L.board_trials(SPEC, None, results, times=True), fresh())
    assert asked[1] == again[-1].trial_id + 1  # nothing unfinished: only new trials
    frame = L.leaderboard(SPEC, results=results, include_all=True)
    assert list(frame["trial"]) == [r["trial"] for r in L.board_rows(SPEC, fresh(), True).rows]
