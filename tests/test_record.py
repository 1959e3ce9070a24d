"""tuner.study.record: a trial's verdict told in one write is what Optuna's own tell stores."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from tuner.outcome import Outcome
from tuner.study.record import Verdict, tell
from tuner.study.row_attrs import ROW_ATTR, ROW_KEYS
from tuner.study.storage import set_user_attrs

VERDICTS = [
    Verdict(Outcome.OK, None, {"step_time_s": 1.25, "mfu": 0.4}),
    Verdict(Outcome.OK, None, {"step_time_s": float("inf")}),
    Verdict(Outcome.OOM, "CUDA out of memory", {"peak_memory_gib": 81.0}),
    Verdict(Outcome.NODE_ERROR, "node lost", {}),  # runs again: FAIL
    Verdict(Outcome.OK, None, {"step_time_s": float("nan")}),  # Optuna's FAIL, with its warning
    Verdict(Outcome.OK, None, {}),  # no step: PRUNED
]


def optunas_tell(study: optuna.Study, trial: optuna.Trial, verdict: Verdict,
                 duration: float) -> None:  # fmt: skip
    """What ``tell`` did before its one write: the attributes, then Optuna's tell."""
    set_user_attrs(trial, {"outcome": str(verdict.outcome), "reason": verdict.reason,
                           "duration_s": round(duration, 3), **verdict.metrics})  # fmt: skip
    step = verdict.metrics.get("step_time_s")
    if verdict.outcome == Outcome.OK and step:
        study.tell(trial, float(step))
    elif verdict.outcome in (Outcome.NODE_ERROR,):
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, state=TrialState.PRUNED)


def stored(url: str) -> list[tuple[Any, ...]]:
    fresh = optuna.storages.RDBStorage(url)
    trials = fresh.get_all_trials(fresh.get_study_id_from_name("s"), deepcopy=False)
    return [(t.number, t.state, t.values, t.params, t.user_attrs, t.system_attrs,
             t.datetime_complete is not None) for t in trials]  # fmt: skip


def counted(real: Any, calls: list[str], name: str) -> Any:
    def tell(*a: Any, **k: Any) -> Any:
        calls.append(name)
        return real(*a, **k)

    return tell


@pytest.mark.filterwarnings("ignore::UserWarning")  # Optuna's warning for the NaN value
@pytest.mark.parametrize("sampler", ["random", "tpe"])  # one write; Optuna's tell (TPE's own)
def test_tell_stores_what_optunas_tell_stores(tmp_path: Path, sampler: str) -> None:
    got, calls = [], []
    for name, told in (("theirs", optunas_tell), ("mine", tell)):
        url = f"sqlite:///{tmp_path / name}.db"
        make = {"random": optuna.samplers.RandomSampler, "tpe": optuna.samplers.TPESampler}
        study = optuna.create_study(study_name="s", storage=url, sampler=make[sampler](seed=1))
        study.tell = counted(study.tell, calls, name)  # type: ignore[method-assign]
        for verdict in VERDICTS:
            trial = study.ask({"tp": CategoricalDistribution([1, 2, 4])})
            trial.set_user_attr("key", f"tp{trial.params['tp']}")
            told(study, trial, verdict, 12.3456)
        study.ask()  # one left running
        got.append(stored(url))
    theirs, mine = got
    # the one write also keeps the shown attributes together (tuner.study.row_attrs): the
    # trial's stored attributes of ROW_KEYS, as they are once written, and nothing else
    kept = [t[4].pop(ROW_ATTR, None) for t in mine]
    assert [k is not None for k in kept] == [  # the NaN is told through Optuna (see below)
        sampler == "random" and t[1].is_finished() and i != 4 for i, t in enumerate(mine)
    ]
    for k, t in zip(kept, mine, strict=True):
        if k is not None:
            shown = sorted((n, v) for n, v in t[4].items() if n in ROW_KEYS)
            assert repr(sorted(k.items())) == repr(shown)  # repr: NaN, inf
            assert {"outcome", "reason", "duration_s"} <= k.keys()
    assert [t[1] for t in theirs] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED,
                                      TrialState.FAIL, TrialState.FAIL, TrialState.PRUNED,
                                      TrialState.RUNNING]  # fmt: skip
    assert mine == theirs
    # the random sampler does nothing at a trial's end: told in the one write but the NaN
    assert calls.count("mine") == (1 if sampler == "random" else len(VERDICTS))


def test_a_trial_another_worker_ended_is_not_told_twice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="s", storage=url)
    trial = study.ask()
    optuna.load_study(study_name="s", storage=url).tell(trial.number, state=TrialState.FAIL)
    with caplog.at_level(logging.WARNING):
        tell(study, trial, VERDICTS[0], 1.0)
    assert "ended by another worker" in caplog.text
    (t,) = optuna.storages.RDBStorage(url).get_all_trials(study._study_id)
    assert t.state == TrialState.FAIL and t.values is None and "outcome" not in t.user_attrs


@pytest.mark.parametrize("cut", [0, 17])
def test_a_cut_metrics_file_falls_back_on_the_result_and_logs(tmp_path: Path, cut: int) -> None:
    """A ``metrics.json`` cut short (``tune`` killed, or the disk full, mid-write) hid the
    finished trial's measurement from the next worker, which ran the config again; its
    ``result.json`` and node log still hold it."""
    from tests.test_proxy import _megatron_log, spec
    from tuner.launch import JobResult
    from tuner.layout import ResultsLayout
    from tuner.models.time.breakdown import fastest_step_s
    from tuner.space.enumerate import study_gpu
    from tuner.study.record import recovered_metrics, write_metrics

    s = spec(nodes=1)
    bound = fastest_step_s(s.model, s.training.global_batch_size, s.world_size, study_gpu(s))
    step = 2.0 * (bound or 1.0)  # a step the hardware allows (record.physical)
    paths = ResultsLayout(tmp_path, s.name).trial(0)
    _megatron_log(paths.node_log(0), step)
    result = JobResult(trial=0, hosts=("n0",), exit_codes=(0,), timed_out=False,
                       cancelled=False, node_errors=(), duration_s=60.0,
                       logs=(paths.node_log(0),))  # fmt: skip
    paths.result_json.write_text(json.dumps(result.to_json()))
    write_metrics(paths, Verdict(Outcome.OK, None, {"step_time_s": step}), result)
    whole = paths.metrics_json.read_text()
    assert list(paths.dir.glob(".*.tmp")) == []  # written beside, then renamed over
    paths.metrics_json.write_text(whole[:cut])
    verdict = recovered_metrics(s, study_gpu(s), paths)
    assert verdict is not None and verdict.outcome == Outcome.OK
    assert verdict.metrics["step_time_s"] == pytest.approx(step, rel=0.01)


def test_a_log_its_reader_cannot_read_records_the_trial_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader that fails on a log nobody foresaw (an OverflowError from a figure of 5,000
    digits, before hhost's parser fixes) stopped ``tune run`` with the finished trial neither
    recorded nor run again; it is ``no_metrics`` now, the error its reason, and not retried."""
    from tests.test_proxy import _megatron_log, spec
    from tuner.launch import JobResult
    from tuner.layout import ResultsLayout
    from tuner.space.enumerate import study_gpu
    from tuner.space.trials import RETRYABLE
    from tuner.study import record

    s = spec(nodes=1)
    paths = ResultsLayout(tmp_path, s.name).trial(0)
    _megatron_log(paths.node_log(0), 1.0)
    result = JobResult(trial=0, hosts=("n0",), exit_codes=(0,), timed_out=False,
                       cancelled=False, node_errors=(), duration_s=60.0,
                       logs=(paths.node_log(0),))  # fmt: skip

    def broken(*_: Any) -> Any:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(record, "parse_result", broken)
    with caplog.at_level(logging.WARNING):
        verdict = record.judge(s, study_gpu(s), result)
    assert verdict.outcome == Outcome.NO_METRICS and verdict.outcome not in RETRYABLE
    assert verdict.reason == (
        "its logs could not be read (OverflowError: int too large to convert to float)"
    )
    assert "trial 0: its logs could not be read" in caplog.text
    monkeypatch.undo()  # the same log read by the real reader
    assert "could not be read" not in (record.judge(s, study_gpu(s), result).reason or "")
