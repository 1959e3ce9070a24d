"""The read commands' light read (:mod:`tuner.study.attrs_read`) against the whole trials'
read: the leaderboard's rows and table without pandas against the DataFrame they were made
from, the report's rows and Optuna's trials against those of the whole read, on a study of
every kind of trial: measured, OOM, timeout, failed launch, a launched trial
failed without an outcome, pruned before launch, running, queued, duplicate, proxy, with no
config, with a NaN figure, with attributes and system attributes no command reads."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest

from tests.test_results import SPEC, config, record
from tuner.cli import board as B
from tuner.errors import ConfigError
from tuner.layout import ResultsLayout
from tuner.outcome import Outcome
from tuner.report import data as D
from tuner.report import export as E
from tuner.report import leaderboard as L
from tuner.space.enumerate import expand_axes
from tuner.space.trials import config_params, is_duplicate
from tuner.study.attrs_read import read_attrs
from tuner.study.storage import open_storage

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")

PROXY: dict[str, Any] = {"proxy": True, "proxy_dp": 2, "proxy_nodes": 1, "proxy_step_s": 1.25}


def _varied(results: Path) -> None:
    """A study holding every kind of trial the loop leaves (see the module's words)."""
    layout = ResultsLayout(results, SPEC.name)
    study = optuna.create_study(study_name=SPEC.name, storage=open_storage(None, layout))
    hosts: dict[str, Any] = {
        "hosts": ["n0", "n1"],
        "launched": True,
        "duration_s": 300,
        "worker": "w:1",
    }
    measured: dict[str, Any] = {**hosts, "predicted_step_s": 2.5, "predicted_peak_gib": 61.019,
                "peak_memory_gib": 55.5, "mfu": 0.41, "tflops_per_gpu": 402.5,
                "objective": "steady", "predicted_peak_stage": 0,
                "predicted_peak_phase": "fwd_bwd", "token": "0" * 32}  # fmt: skip
    record(study, SPEC, config(2, 1), Outcome.OK, 3.0, **measured)
    record(study, SPEC, config(4, 2), Outcome.OK, 2.0, **hosts)
    record(study, SPEC, config(2, 1), Outcome.OK, 3.0, **hosts)  # a tie: by trial number
    record(study, SPEC, config(1, 2), Outcome.OOM, reason="CUDA out of memory", **hosts)
    record(study, SPEC, config(1, 1), Outcome.TIMEOUT, reason="no step in 20 min", **hosts)
    record(study, SPEC, config(4, 1), Outcome.LAUNCH_ERROR, reason="template error")
    record(study, SPEC, config(2, 2), Outcome.PRUNED_MEMORY, reason="predicted 90 GiB")
    record(study, SPEC, config(4, 2), Outcome.OK, 1.5, **PROXY, **hosts)
    record(study, SPEC, config(2, 2), None)  # still running
    record(study, SPEC, config(4, 2), Outcome.OK, 2.0, duplicate_of=1)
    lost = study.ask()  # launched, then its worker died: failed without an outcome
    lost.set_user_attr("launched", True)
    study._storage.set_trial_system_attr(lost._trial_id, "heartbeat", 1.0)
    study.tell(lost, state=optuna.trial.TrialState.FAIL)
    nan = record(study, SPEC, config(1, 1), None)  # measured, but its tokens/s is not a number
    for k, v in {"outcome": "ok", "step_time_s": 4.0, "tokens_per_s": math.nan}.items():
        nan.set_user_attr(k, v)
    nan.report(4.0, step=1)
    study.tell(nan, 4.0)
    study.enqueue_trial(config_params(config(1, 1), expand_axes(SPEC)))  # queued, never asked


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("varied")
    _varied(tmp)
    return str(tmp)


def _reader(results: str) -> Any:
    return L._opened(SPEC, None, results)[1]


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("shared", [(), ("config", "hosts")])
def test_the_light_read_is_the_whole_trials_attributes(
    results: str, grouped: bool, shared: tuple[str, ...]
) -> None:
    """Every trial, in order, with the named attributes as the whole read decodes them (all
    of them when none are named), its times when asked; a shared attribute is one object per
    distinct stored text (the repeated config), a trial's own attribute is not shared."""
    whole = L.stored_trials(SPEC, None, results)
    reader = _reader(results)
    for keys in (L.BOARD_ATTRS, None):
        light = read_attrs(reader.storage, reader.study_id, keys, shared=shared, times=True,
                           grouped=grouped)  # fmt: skip
        assert [(t.number, t.state) for t in light] == [(t.number, t.state) for t in whole]
        for t, w in zip(light, whole, strict=True):
            wanted = {k: v for k, v in w.user_attrs.items() if keys is None or k in keys}
            assert _same(t.user_attrs, wanted), (t.number, t.user_attrs, wanted)
            assert (t.datetime_start, t.datetime_complete) == (
                w.datetime_start,
                w.datetime_complete,
            )
    light = read_attrs(reader.storage, reader.study_id, L.BOARD_ATTRS, shared=shared,
                       grouped=grouped)  # fmt: skip
    stored = [t.user_attrs["config"] for t in light if "config" in t.user_attrs]
    distinct = {repr(c) for c in stored}
    assert len({id(c) for c in stored}) == (len(distinct) if shared else len(stored))
    assert len(distinct) == 6 and len(stored) == 11
    assert light[0].datetime_start is None  # not asked


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b) and type(a) is type(b)


def _old_frame(trials: list[Any], include_all: bool) -> pd.DataFrame:
    """The leaderboard as it was made before its rows did without pandas: a DataFrame of every
    shown trial's row, its empty columns set, sorted by pandas."""
    rows = []
    for t in trials:
        if "duplicate_of" in t.user_attrs or t.state == optuna.trial.TrialState.WAITING:
            continue
        if t.state == optuna.trial.TrialState.RUNNING and not include_all:
            continue
        ok = t.user_attrs.get("outcome") == Outcome.OK
        if (ok and t.state == optuna.trial.TrialState.COMPLETE) or include_all:
            rows.append(L.leaderboard_row(t, SPEC.world_size))
    frame = pd.DataFrame(rows, columns=L.COLUMNS)
    frame["precision"] = SPEC.training.precision
    frame[["ep", "etp", "dispatcher"]] = None
    frame[L.TORCHTITAN_COLUMNS] = None
    if not (frame["scale"] == "proxy").any():
        frame[L.PROXY_COLUMNS] = None
    if frame.empty:
        return frame
    frame["_ok"] = frame["outcome"] == str(Outcome.OK)
    frame = frame.sort_values(["_ok", "tokens_per_s", "trial"], ascending=[False, False, True])
    return frame.drop(columns="_ok").reset_index(drop=True)


@pytest.mark.parametrize("include_all", [False, True])
def test_the_boards_rows_are_the_old_dataframes(results: str, include_all: bool) -> None:
    """The rows from the light read, and from the whole one, make the DataFrame the
    leaderboard was (same rows, order, columns, types), its CSV and JSON the same text."""
    old = _old_frame(L.stored_trials(SPEC, None, results), include_all)
    assert len(old) == (11 if include_all else 5) and "proxy" in set(old["scale"])
    for trials in (L.board_trials(SPEC, None, results), L.stored_trials(SPEC, None, results)):
        board = L.board_rows(SPEC, trials, include_all)
        frame = board.frame()
        pd.testing.assert_frame_equal(frame, old)
        assert frame.to_csv(index=False) == old.to_csv(index=False)
        assert frame.to_json(orient="records", indent=2) == old.to_json(orient="records", indent=2)
        assert [c.key() if c else None for c in board.configs] == [r["key"] for r in board.rows]
    frame = L.leaderboard(SPEC, include_all=include_all, results=results)
    pd.testing.assert_frame_equal(frame, old)


@pytest.mark.parametrize("include_all", [False, True])
def test_the_table_is_the_old_dataframes_cells(results: str, include_all: bool) -> None:
    """The table's columns and cells from the rows are those the table made from the DataFrame's
    values (a count pandas held as a float beside a NaN, a NaN, a proxy's marked step)."""
    old = _old_frame(L.stored_trials(SPEC, None, results), include_all)
    board = L.board_rows(SPEC, L.board_trials(SPEC, None, results), include_all)
    grid = B.board_grid("t", board, include_all, framework=SPEC.framework)
    shown = [c.name for c in grid.columns]
    filled = [c.name for c in B.BOARD_COLUMNS if c.name in ("rank", "config") or (
        c.name in old.columns and old[c.name].notna().any()
        and (c.name != "outcome" or include_all))]  # fmt: skip
    assert sorted(shown) == sorted(filled) and "nodes" in shown and "scale" in shown
    assert old["nodes"].dtype == float  # pandas' float beside the NaN of a trial without hosts
    at = {name: i for i, name in enumerate(old.columns)}
    for rank, (values, row) in enumerate(zip(old.values, grid.rows, strict=True), 1):
        cells = dict(zip(shown, row, strict=True))
        for name in shown:
            if name == "rank":
                assert cells[name] == str(rank)
            elif name == "measured_step_s" and values[at["scale"]] == "proxy":
                assert cells[name] == "~" + B._cell(name, values[at[name]])
            elif name != "config":
                assert cells[name] == B._cell(name, values[at[name]]), (rank, name)
    every = B.board_grid("t", board, include_all, names=["trial", "nodes", "tp", "precision"])
    names = [c.name for c in every.columns]  # every column (--columns picks among them)
    assert set(old.columns) <= set(names)
    for values, row in zip(old.values, every.rows, strict=True):
        for name, cell in zip(names, row, strict=True):
            proxy = name == "measured_step_s" and values[at["scale"]] == "proxy"
            if name in at and not proxy:
                assert cell == B._cell(name, values[at[name]]), name


class _Watched(dict[str, Any]):
    """A trial's attributes that note every key looked up in them in ``read`` (one set for
    every trial of a test)."""

    def __init__(self, attrs: dict[str, Any], read: set[str]) -> None:
        super().__init__(attrs)
        self.read = read

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def test_the_board_reads_only_the_attributes_it_names(results: str) -> None:
    """What the board's rows read of a trial's attributes is in :data:`BOARD_ATTRS` (what the
    light read fetches), and what says a trial is on the board in :data:`SHOWN_ATTRS`: an
    attribute read but not named would be empty on the board and in the report."""

    read: set[str] = set()
    trials = L.stored_trials(SPEC, None, results)
    watched = [_Watching(t, _Watched(t.user_attrs, read)) for t in trials]
    for t in watched:
        L.on_board(t)
    assert read and read <= set(L.SHOWN_ATTRS)
    L.board_rows(SPEC, watched, include_all=True)
    L.why_empty(SPEC, watched)
    assert read <= set(L.BOARD_ATTRS), read - set(L.BOARD_ATTRS)
    assert {"proxy_step_s", "objective", "launched", "hosts"} <= read


def test_the_report_reads_only_the_attributes_it_names(results: str) -> None:
    """The same for the report's rows (:data:`tuner.report.data.REPORT_ATTRS`), which also
    say whether the leaderboard is empty (``tune report``'s last line)."""

    read: set[str] = set()
    for t in L.stored_trials(SPEC, None, results):
        watched = _Watching(t, _Watched(t.user_attrs, read))
        is_duplicate(watched)
        D.trial_row(t.__class__(**_fields(t, watched.user_attrs)), SPEC)
    assert read <= set(D.REPORT_ATTRS), read - set(D.REPORT_ATTRS)
    assert {"proxy_step_s", "predicted_peak_phase", "launched", "hosts"} <= read
    assert set(L.SHOWN_ATTRS) <= set(D.REPORT_ATTRS)


def _fields(t: optuna.trial.FrozenTrial, attrs: dict[str, Any]) -> dict[str, Any]:
    """``t``'s arguments to :class:`~optuna.trial.FrozenTrial`, its attributes ``attrs``."""
    return dict(
        number=t.number, state=t.state, value=None, values=t.values,
        datetime_start=t.datetime_start, datetime_complete=t.datetime_complete,
        params=t.params, distributions=t.distributions, user_attrs=attrs,
        system_attrs=t.system_attrs, intermediate_values=t.intermediate_values,
        trial_id=t._trial_id,
    )  # fmt: skip


def test_the_reports_rows_and_optuna_trials_are_the_whole_reads(results: str) -> None:
    """The report's rows from the light read are those of the whole trials (every field, the
    times of the launched ones), and its trials for Optuna's views are the whole read's
    completed ones less their attributes (values, parameters, distributions, times)."""
    data = D.gather(SPEC, results=results)
    whole = L.stored_trials(SPEC, None, results)
    rows = [D.trial_row(t, SPEC) for t in whole
            if not is_duplicate(t) and t.state != optuna.trial.TrialState.WAITING]  # fmt: skip
    assert data.rows == rows and len(rows) == 11
    assert any(r.start is not None for r in rows) and any(r.proxy for r in rows)
    assert [r.key for r in data.rows] == [r.key for r in rows]
    complete = [t for t in whole if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(data.trials) == len(complete) == 6  # the duplicate too, as before
    for kept, t in zip(data.trials, complete, strict=True):
        assert isinstance(kept, D.ReadOnlyTrial)
        assert (kept.number, kept.state, kept.values, kept.params, kept.distributions,
                kept.datetime_start, kept.datetime_complete, kept._trial_id) == (
            t.number, t.state, t.values, t.params, t.distributions, t.datetime_start,
            t.datetime_complete, t._trial_id)  # fmt: skip
        assert list(kept.params) == list(t.params)  # Optuna's order, the order of its rows
        assert kept.user_attrs == kept.system_attrs == {} and not kept.intermediate_values
    assert [t.number for t in data.stored] == [t.number for t in whole]


def test_tune_best_reads_only_its_trial_whole(
    results: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The best trial (the fastest full-scale row: not the faster proxy) and a ``--trial``
    are found on the light read and read whole alone: the same trial, every field, as the
    whole read of every trial holds it (at 10,000 trials that read was most of ``tune
    best``'s 2.5 s); the refusals of ``--trial`` are those of before."""
    whole = {t.number: t for t in L.stored_trials(SPEC, None, results)}
    rows = L.board_rows(SPEC, list(whole.values())).rows
    assert rows[0]["scale"] == "proxy"  # the study's fastest row is a proxy's
    best = next(row["trial"] for row in rows if row["scale"] == "full")

    def refused(self: Any) -> None:
        raise AssertionError("every trial read whole")

    monkeypatch.setattr(L.TrialReader, "trials", refused)
    got = L.best_trial(SPEC, None, results)
    assert got == whole[best] and got.params and got.system_attrs is not None
    assert E.trial_record(SPEC, results=results).trial == best
    chosen = E.trial_record(SPEC, 0, results=results)  # a measured trial, not the best
    assert (chosen.trial, chosen.best, chosen.config.key()) == (
        0, False, D.trial_row(whole[0], SPEC).key)  # fmt: skip
    duplicate = next(n for n, t in whole.items() if "duplicate_of" in t.user_attrs)
    oom = next(n for n, t in whole.items() if t.user_attrs.get("outcome") == Outcome.OOM)
    for number, words in ((99, "has no trial 99"), (duplicate, "repeats trial 1"),
                          (oom, "measured nothing (outcome oom)")):  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(words)):
            E.trial_record(SPEC, number, results=results)


class _Watching:
    """A stored trial whose attributes are the given mapping."""

    def __init__(self, t: optuna.trial.FrozenTrial, attrs: dict[str, Any]) -> None:
        self.number, self.state, self.user_attrs = t.number, t.state, attrs


def test_tune_leaderboard_imports_no_pandas(results: str) -> None:
    """The table is made without pandas; ``--format csv`` still imports it (pandas' writer)."""
    code = ("import sys; from tuner.cli.main import main; rc = main(sys.argv[1:]); "
            "print('pandas' in sys.modules, rc)")  # fmt: skip
    spec_file = Path(results) / "board.yaml"
    spec_file.write_text(_SPEC_YAML)
    for extra, pandas in (([], False), (["--all"], False), (["--format", "csv"], True)):
        out = subprocess.run(
            [sys.executable, "-c", code, "leaderboard", "--study", str(spec_file), "--results",
             results, *extra], capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert out.splitlines()[-1] == f"{pandas} 0", (extra, out[-300:])


_SPEC_YAML = """\
name: board
model: {preset: llama2-7b}
training: {global_batch_size: 64}
cluster: {gpu: a100-80gb, gpus_per_node: 8, num_nodes: 1, executor: local}
framework: megatron
launch: {template: megatron_gpt, megatron_path: /opt/megatron}
space: {tp: [1, 2, 4], micro_batch_size: [1, 2], sequence_parallel: [true],
        distributed_optimizer: [true]}
"""
