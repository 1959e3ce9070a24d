"""The leaderboard and the best-config export, over a real SQLite study written by hand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna
import pandas as pd
import pytest

from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError, StudyError
from tuner.layout import ResultsLayout
from tuner.outcome import Outcome
from tuner.report.export import emit_best
from tuner.report.leaderboard import best_config, leaderboard, megatron_args
from tuner.space.enumerate import expand_axes
from tuner.space.trials import config_params, distributions
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec
from tuner.study.storage import open_storage

# ask/tell by hand, as the study loop does; the loop records heartbeats itself
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")

SPEC = study_from_mapping({
    "name": "board",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "num_nodes": 1, "executor": "local"},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt", "megatron_path": "/opt/megatron"},
    "space": {"tp": [1, 2, 4], "micro_batch_size": [1, 2], "sequence_parallel": [True],
              "distributed_optimizer": [True]},
})  # fmt: skip


def config(tp: int, mbs: int) -> ParallelConfig:
    return ParallelConfig(tp=tp, dp=8 // tp, micro_batch_size=mbs, global_batch_size=64,
                          sequence_parallel=tp > 1, distributed_optimizer=True)  # fmt: skip


def record(study: optuna.Study, spec: StudySpec, c: ParallelConfig, outcome: Outcome | None,
           step: float | None = None, **attrs: object) -> optuna.Trial:  # fmt: skip
    """One trial as the loop leaves it; ``outcome`` None: still running."""
    trial = study.ask(distributions(spec))
    trial.set_user_attr("config", dataclasses.asdict(c))
    trial.set_user_attr("key", c.key())
    if outcome is None:
        return trial
    trial.set_user_attr("outcome", str(outcome))
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    if outcome == Outcome.OK and step is not None:
        tokens = 64 * SPEC.model.seq_length / step
        trial.set_user_attr("step_time_s", step)
        trial.set_user_attr("tokens_per_s", tokens)
        study.tell(trial, step)
    else:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    return trial


@pytest.fixture
def results(tmp_path: Path) -> str:
    layout = ResultsLayout(tmp_path, SPEC.name)
    study = optuna.create_study(study_name=SPEC.name, storage=open_storage(None, layout))
    record(study, SPEC, config(2, 1), Outcome.OK, 3.0)
    record(study, SPEC, config(4, 2), Outcome.OK, 2.0)
    record(study, SPEC, config(1, 2), Outcome.OOM, reason="CUDA out of memory")
    record(study, SPEC, config(2, 2), None)  # still running
    dup = record(study, SPEC, config(4, 2), Outcome.OK, 2.0, duplicate_of=1)
    assert dup.number == 4
    study.enqueue_trial(config_params(config(1, 1), expand_axes(SPEC)))  # queued, never asked
    return str(tmp_path)


def test_leaderboard_is_measured_configs_fastest_first(results: str) -> None:
    board = leaderboard(SPEC, results=results)
    assert list(board.trial) == [1, 0]  # the duplicate of trial 1 is not shown again
    assert list(board.tp) == [4, 2]
    assert board.iloc[0].measured_step_s == pytest.approx(2.0)


def test_all_adds_running_and_failed_but_never_queued_or_duplicate(results: str) -> None:
    board = leaderboard(SPEC, include_all=True, results=results)
    assert list(board.trial) == [1, 0, 2, 3]
    assert list(board.outcome) == ["ok", "ok", "oom", "running"]
    assert "waiting" not in set(board.outcome)
    assert board.iloc[2].reason == "CUDA out of memory"


def test_best_exports(results: str) -> None:
    assert best_config(SPEC, results=results) == config(4, 2)
    args = emit_best(SPEC, "args", results=results)
    assert args.split() == megatron_args(SPEC, config(4, 2))
    exports = ResultsLayout(Path(results), SPEC.name).export(1)
    assert exports.args.read_text() == args
    # a Megatron full run needs the study's own data: never the trials' mock data by default
    with pytest.raises(ConfigError, match="launch.train_args"):
        emit_best(SPEC, "script", results=results)
    spec = dataclasses.replace(SPEC, launch=dataclasses.replace(
        SPEC.launch, train_args=("--data-path", "/data/web_text_document")))  # fmt: skip
    script = emit_best(spec, "script", results=results)
    assert config(4, 2).key() in script and exports.script.read_text() == script
    assert "--tensor-model-parallel-size 4" in script and "/opt/megatron/pretrain_gpt.py" in script
    assert f"--train-iters {SPEC.launch.train_iters}" in script
    assert "/data/web_text_document" in script and "--mock-data" not in script
    emit_best(spec, "script", results=results, train_iters=50_000)
    assert "--train-iters 50000" in exports.script.read_text()
    with pytest.raises(StudyError, match="no results"):
        leaderboard(SPEC, results=str(Path(results) / "elsewhere"))
    assert json.dumps(list(leaderboard(SPEC, results=results).columns))


def test_leaderboard_says_which_figure_the_measured_peak_is(tmp_path: Path) -> None:
    layout = ResultsLayout(tmp_path, SPEC.name)
    study = optuna.create_study(study_name=SPEC.name, storage=open_storage(None, layout))
    attrs = {"peak_memory_gib": 41.0, "peak_reserved_gib": 44.0, "predicted_peak_gib": 47.5,
             "predicted_allocated_gib": 42.0, "predicted_reserved_gib": 45.0,
             "predicted_peak_stage": 0, "predicted_peak_phase": "fwd_bwd"}  # fmt: skip
    record(study, SPEC, config(2, 1), Outcome.OK, 3.0, **attrs)
    record(study, SPEC, config(4, 1), Outcome.OK, 3.5)  # a log without memory figures
    board = leaderboard(SPEC, results=str(tmp_path))
    row = board.iloc[0]
    assert row.measured_peak_gib == 41.0 and row.measured_peak_metric == "allocated"
    assert row.measured_reserved_gib == 44.0 and row.predicted_reserved_gib == 45.0
    assert row.predicted_peak_gib == 47.5 and row.predicted_peak_phase == "fwd_bwd"
    assert pd.isna(board.iloc[1].measured_peak_metric)
