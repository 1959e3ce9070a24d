"""Ending trials once measured (tuner.study.measure) and the node-hour guard (tuner.study.budget),
on real log lines in the Megatron core_v0.15 format."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tuner.outcome import Outcome
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec
from tuner.study.budget import node_hour_refusal, pending_node_hours
from tuner.study.measure import LogTail, Watch, measured_anyway
from tuner.study.record import Verdict


def spec(**search: Any) -> StudySpec:
    return study_from_mapping({
        "name": "m",
        "model": {"num_layers": 8, "hidden_size": 1024, "ffn_hidden_size": 4096,
                  "num_attention_heads": 16, "vocab_size": 32000, "seq_length": 1024},
        "training": {"global_batch_size": 32},
        "cluster": {"gpu": "a100-80gb", "gpus_per_node": 2, "num_nodes": 4, "executor": "local"},
        "framework": "megatron",
        "launch": {"template": "megatron_gpt", "megatron_path": "/opt/m", "train_iters": 30,
                   "warmup_iters": 2},
        "search": {"nodes_per_trial": 2, **search},
    })  # fmt: skip


def line(i: int, ms: float) -> str:
    return (
        f" [2026-01-05 10:00:00] iteration {i:8d}/      30 | consumed samples: {32 * i:12d} | "
        f"elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.0E-04 | global batch "
        "size:    32 | lm loss: 1.0E+01 | loss scale: 1.0 | grad norm: 1.0 | number of skipped "
        "iterations:   0 | number of nan iterations:   0 |\n"
    )


def write_log(path: Path, times_ms: list[float]) -> None:
    path.write_text("".join(line(i, t) for i, t in enumerate(times_ms, start=1)))


def test_the_tail_reads_what_the_log_gained_and_waits_for_a_whole_line(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    tail = LogTail([log, tmp_path / "node-1.log"])  # node 1 has no log (yet)
    assert tail.read() == []
    text = line(1, 3000.0) + line(2, 1000.0)
    log.write_text(text[:-40])  # the second line is half written
    assert [r.iteration for r in tail.read()] == [1]
    log.write_text(text)
    assert [(r.iteration, r.step_s) for r in tail.read()] == [(1, 3.0), (2, 1.0)]


def test_a_precise_trial_is_ended_and_a_noisy_one_is_not(tmp_path: Path) -> None:
    watch = Watch(spec())
    write_log(tmp_path / "clean.log", [3000.0, 1500.0] + [1000.0 + 3 * (i % 2) for i in range(12)])
    assert watch.why_stop(1, [tmp_path / "clean.log"], None) == "precise"
    noisy = [3000.0, 1500.0] + [1000.0 * (1 + 0.3 * ((i * 7) % 5 - 2)) for i in range(12)]
    write_log(tmp_path / "noisy.log", noisy)
    assert watch.why_stop(2, [tmp_path / "noisy.log"], None) is None


def test_a_trial_whose_interval_lies_above_the_best_is_raced(tmp_path: Path) -> None:
    noisy = [3000.0, 1500.0] + [2000.0 * (1 + 0.1 * ((i * 7) % 5 - 2)) for i in range(14)]
    write_log(tmp_path / "slow.log", noisy)
    assert Watch(spec()).why_stop(1, [tmp_path / "slow.log"], 1.05) == "raced"
    assert Watch(spec()).why_stop(1, [tmp_path / "slow.log"], 1.95) is None  # may still win
    assert Watch(spec(race=False)).why_stop(1, [tmp_path / "slow.log"], 1.05) is None


def test_a_trial_cut_at_its_limit_records_its_figure_when_it_has_enough_batches(
    tmp_path: Path,
) -> None:
    timeout = Verdict(Outcome.TIMEOUT, "killed at the trial time limit",
                      {"step_time_s": 1.0, "iterations": 14})  # fmt: skip
    write_log(tmp_path / "long.log", [3000.0, 1500.0] + [1000.0] * 12)
    found = measured_anyway(spec(), timeout, [tmp_path / "long.log"], None)
    assert found.outcome == Outcome.OK and found.metrics["ended"] == "limit"
    assert found.metrics["steady_step_s"] == pytest.approx(1.0)
    write_log(tmp_path / "short.log", [3000.0, 1500.0, 1000.0, 1000.0])
    found = measured_anyway(spec(), timeout, [tmp_path / "short.log"], None)
    assert found.outcome == Outcome.TIMEOUT and found.metrics["steady_batches"] < 4


def test_a_launch_that_could_pass_the_node_hour_budget_is_refused() -> None:
    s = spec(max_node_hours=1.0, trial_timeout_min=10)  # a trial may hold 2 nodes x 10 min
    attrs = {"predicted_step_s": 60.0}  # its 30 iterations would take longer than 10 min
    assert node_hour_refusal(s, 0.5, attrs, "k") is None  # 0.5 + 0.33 <= 1
    why = node_hour_refusal(s, 0.7, attrs, "k")
    assert why is not None and "node-hour budget of 1" in why and "0.33" in why
    assert node_hour_refusal(spec(), 100.0, attrs, "k") is None  # no budget set
    job = SimpleNamespace(request=SimpleNamespace(timeout_s=600.0))
    running = {3: SimpleNamespace(job=job, started=100.0, group=SimpleNamespace(hosts=("a", "b")))}
    assert pending_node_hours(running, now=400.0) == pytest.approx(300 * 2 / 3600)
    assert pending_node_hours(running, now=900.0) == 0.0  # past its limit: being killed


def _job(log: Path) -> Any:
    from tuner.launch import JobResult

    return JobResult(trial=0, hosts=("a", "b"), exit_codes=(0, 0), timed_out=False,
                     cancelled=False, node_errors=(), duration_s=60.0, logs=(log,))  # fmt: skip


def test_the_objective_is_the_steady_state_mean_the_stopping_rule_measured(tmp_path: Path) -> None:
    # A garbage-collection spike every 4th iteration: the median leaves it out, a long run
    # pays for it. The study ranks, races and reports the steady-state mean (what the stopping
    # rule measured to its precision); the median stays beside it.
    from tuner.space.enumerate import study_gpu
    from tuner.study.record import judge

    s = spec()
    times = [3000.0, 1500.0] + [1600.0 if i % 4 == 3 else 1000.0 for i in range(24)]
    write_log(tmp_path / "gc.log", times)
    m = judge(s, study_gpu(s), _job(tmp_path / "gc.log")).metrics
    assert m["objective"] == "steady" and m["steady_batches"] >= s.search.min_batches
    assert m["step_time_s"] == m["steady_step_s"] == pytest.approx(1.15, rel=0.02)
    assert m["median_step_s"] == pytest.approx(1.0)
    assert m["tokens_per_s"] == pytest.approx(32 * 1024 / m["step_time_s"])
    # too few records for the estimator: the median stays the figure
    write_log(tmp_path / "short.log", [3000.0, 1500.0, 1000.0, 1000.0, 1100.0])
    m = judge(s, study_gpu(s), _job(tmp_path / "short.log")).metrics
    assert m["objective"] == "median" and m["step_time_s"] == m["median_step_s"]
    assert m["steady_batches"] < s.search.min_batches


def test_the_leaderboard_says_which_figure_a_step_is_and_old_trials_read_as_medians() -> None:
    from tuner.report.leaderboard import step_measure

    assert step_measure({"step_time_s": 1.1, "objective": "steady"}) == "steady"
    assert step_measure({"step_time_s": 1.0, "steady_step_s": 1.1}) == "median"  # recorded before
    assert step_measure({"outcome": "oom"}) is None
