"""Ending trials once measured (tuner.study.measure) and the node-hour guard (tuner.study.budget),
on real log lines in the Megatron core_v0.15 format."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from tests.test_cost import scenario
from tuner.outcome import Outcome
from tuner.space.cost import MIN_LIMIT_MIN, trial_limit_s
from tuner.space.enumerate import enumerate_space, study_gpu
from tuner.space.proxy import study_proxy
from tuner.space.shorten import shorten, shortened_attrs
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec
from tuner.study.budget import LaunchCosts, node_hour_refusal, pending_node_hours
from tuner.study.measure import LogTail, Watch, measured_anyway, steady_attrs, steady_estimate
from tuner.study.proxy import Proxies, extrapolated, recorded_proxy
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


def _launched(duration_s: float, iterations: int, step_s: float) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(value=step_s, user_attrs={
        "duration_s": duration_s, "iterations": iterations, "step_time_s": step_s})  # fmt: skip


def test_limits_and_the_budget_are_cut_from_the_start_up_launches_measured() -> None:
    """``search.startup_min`` is the user's guess until launches of the setup have run; then a
    trial's limit and its worst case under ``max_node_hours`` are cut from what they took (the
    median launch), for every sampler: a 30-minute guess where launches take 20 s no longer
    holds a hung trial for 45 minutes, nor refuses launches the budget can afford."""
    s = spec(startup_min=30.0, max_node_hours=1.0)
    costs = LaunchCosts(s, sampler=None)  # no model sampler: this study's own launches
    costs.see([])
    assert costs.spec is s and trial_limit_s(costs.spec, 1.0) > 30 * 60
    assert node_hour_refusal(costs.spec, 0.2, {"predicted_step_s": 1.0}, "k") is not None
    costs.see([_launched(20.0 + 30 * 1.0, 30, 1.0), _launched(50.0, 30, 1.0),
               _launched(80.0, 30, 1.0)])  # fmt: skip
    assert costs.spec.search.startup_min == pytest.approx(20.0 / 60)  # the median launch
    assert trial_limit_s(costs.spec, 1.0) == pytest.approx(MIN_LIMIT_MIN * 60)
    assert node_hour_refusal(costs.spec, 0.2, {"predicted_step_s": 1.0}, "k") is None
    # a paced log (iterations longer than the wall time) measures nothing: the guess stays
    assert LaunchCosts(s, sampler=None).spec is s
    paced = LaunchCosts(s, sampler=None)
    paced.see([_launched(1.0, 30, 1.0)])
    assert paced.spec.search.startup_min == 30.0
    # the model sampler adds the saved calibration's launches of the setup: its figure is used
    asked = SimpleNamespace(measured_startup_s=lambda trials: 600.0)
    slow = LaunchCosts(spec(), sampler=asked)
    slow.see([])
    assert slow.spec.search.startup_min == pytest.approx(10.0)  # longer than the 3-min guess


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


def test_the_watchs_tail_read_on_at_the_end_gives_a_fresh_reads_verdict(tmp_path: Path) -> None:
    """``measured_anyway`` reads the watch's tail on from where it stopped: the same records
    as the logs read afresh, whatever the watch's reads cut (a line half written, a UTF-8
    character split between two reads), and only for the logs it reads."""
    logs = [tmp_path / "node-0.log", tmp_path / "node-1.log"]
    times = [3000.0, 1500.0] + [1000.0 * (1 + 0.05 * ((i * 7) % 5 - 2)) for i in range(14)]
    text = "".join(line(i, t).replace("lm loss", "lm lossé") for i, t in enumerate(times, 1))
    data = text.encode()
    watch = Watch(spec())
    timeout = Verdict(Outcome.TIMEOUT, "killed at the trial time limit",
                      {"step_time_s": 1.0, "iterations": 16})  # fmt: skip
    logs[1].write_text("")
    starts = [k for k in range(len(data)) if data[k] == 0xC3]  # each é's first byte
    cuts = [k + 1 for k in starts[1:12:3]]  # in the middle of a character, and of a line
    for k in cuts:
        logs[0].write_bytes(data[:k])
        watch.why_stop(1, logs, None)
    tail = watch.tail(1)
    assert tail is not None and tail.records and len(tail.records) < len(times)
    logs[0].write_bytes(data)
    fresh = measured_anyway(spec(), timeout, logs, None)
    assert measured_anyway(spec(), timeout, logs, None, tail) == fresh
    assert len(tail.records) == len(times)  # read on to the end
    assert fresh.metrics["steady_batches"] >= 4
    other = Watch(spec())
    write_log(tmp_path / "other.log", [3000.0, 1500.0] + [2000.0] * 14)
    other.why_stop(2, [tmp_path / "other.log"], None)  # a tail of other logs: not read
    elsewhere = other.tail(2)
    assert measured_anyway(spec(), timeout, logs, None, elsewhere) == fresh


class _Job:
    """A running job's face to the watch: its logs, and the stops it was asked for."""

    def __init__(self, logs: Path) -> None:
        self.request = SimpleNamespace(hosts=["n0"])
        self.paths = SimpleNamespace(node_log=lambda k: logs / f"node-{k}.log")
        self.stopped: list[str] = []

    def result(self) -> None:
        return None

    def stop(self, why: str) -> None:
        self.stopped.append(why)


def _best(step: float) -> list[Any]:
    """A best measured full-step figure known to +-1 %."""
    attrs = {"outcome": "ok", "steady_step_s": step, "steady_halfwidth_s": 0.01 * step}
    return [optuna.trial.create_trial(value=step, user_attrs=attrs)]


@pytest.mark.parametrize("proxy", [False, True])
def test_a_trial_at_fewer_microbatches_is_raced_on_its_full_step(
    tmp_path: Path, proxy: bool
) -> None:
    """Issue 33's 70B config under a 20-minute limit runs at m of M micro-batches per step (and
    with ``search.proxy`` as its proxy at as many): its measured interval, under half a full
    step, is raced through the extrapolation its recorded figure goes through, so the figure
    that ends it and the figure recorded are one quantity."""
    study = study_from_mapping(scenario(trial_timeout_min=20, proxy=proxy))
    gpu = study_gpu(study)
    config = enumerate_space(study).ranked()[0].config
    shorter = shorten(study, config, gpu)
    assert shorter is not None
    attrs: dict[str, Any] = dict(shortened_attrs(shorter))
    if proxy:
        found = study_proxy(study, config, gpu)
        assert found is not None
        attrs.update(proxy=True, proxy_dp=found.config.dp, proxy_nodes=found.nodes)
    ms = shorter.step_s * 1000 * (0.7 if proxy else 1.0)  # a proxy's step, near enough
    write_log(tmp_path / "node-0.log", [3 * ms] * 5
              + [ms * (1 + 0.1 * ((i * 7) % 5 - 2)) for i in range(16)])  # fmt: skip
    runs = recorded_proxy(study, attrs, config)
    assert runs is not None and runs.config.num_microbatches == shorter.microbatches
    proxies = Proxies(study, gpu, None)
    trial = SimpleNamespace(number=1, user_attrs=attrs)
    to_full = proxies.full_step(trial, config)
    assert to_full is not None
    steady = steady_estimate(study, LogTail([tmp_path / "node-0.log"]).read())
    mean, low, high = steady.mean_s, steady.low_s, steady.high_s
    assert mean and low and high and steady.enough and not steady.precise
    # the figure recorded for it and its interval's upper end: through the same map
    ok = Verdict(Outcome.OK, None, {"step_time_s": mean, **steady_attrs(steady)})
    recorded = extrapolated(study, gpu, None, runs, config, ok).metrics
    assert recorded["step_time_s"] == recorded["steady_step_s"] == pytest.approx(to_full(mean))
    upper = recorded["steady_step_s"] + recorded["steady_halfwidth_s"]
    assert upper == pytest.approx(to_full(high))
    assert to_full(low) > 2 * high  # a full step is more than twice the one measured
    faster = 0.95 * to_full(low) / 1.01  # the best's upper end under its interval's lower end
    for best, ends in ((faster, ["raced"]), (to_full(low), [])):  # ... and not under it
        job = _Job(tmp_path)
        run = SimpleNamespace(trial=trial, config=config, job=job)
        Watch(study, proxies.full_step).end_complete({1: run}, lambda b=best: _best(b))
        assert job.stopped == ends
    # its measured interval, shorter than any full step, is never above the best's
    assert Watch(study).why_stop(1, [tmp_path / "node-0.log"], 1.01 * faster) is None


def test_a_figure_that_is_no_measurement_is_never_the_incumbent() -> None:
    """The racing incumbent was the lowest stored ``ok`` value, whatever it was: a stored step of
    1e-320 s (tokens/s infinite, never ranked by the leaderboard) became the best every other
    trial's interval was raced against, so all of them were ended as ``raced``. Only a trial
    that may rank (:func:`tuner.outcome.rankable`) is the incumbent; an interval that is no
    figure falls back to the step plus the precision."""
    from tuner.study.measure import incumbent_high

    def trial(step: float, **attrs: Any) -> Any:
        return optuna.trial.create_trial(value=step, user_attrs={"outcome": "ok", **attrs})

    sound = trial(2.0, tokens_per_s=1e5, steady_step_s=2.0, steady_halfwidth_s=0.02)
    absurd = trial(1e-320, tokens_per_s=float("inf"))
    assert incumbent_high([sound, absurd], 0.05) == pytest.approx(2.02)
    assert incumbent_high([absurd], 0.05) is None
    nan_interval = trial(1.0, steady_step_s=float("nan"), steady_halfwidth_s=0.01)
    assert incumbent_high([sound, nan_interval], 0.05) == pytest.approx(1.05)
    no_half = trial(1.0, steady_step_s=1.0, steady_halfwidth_s=float("inf"))
    assert incumbent_high([no_half], 0.05) == pytest.approx(1.05)


def test_a_step_faster_than_the_hardware_allows_is_no_measurement(tmp_path: Path) -> None:
    """A finite absurd step (1e-300 s, or just under what the GPUs' peak allows) was recorded
    ``ok`` and won the study. Below :func:`fastest_step_s` (the FLOPs every step executes at the
    GPUs' peak) it is ``no_metrics`` with the reason, its figures kept; just above it, ``ok``."""
    from tuner.catalog import get_gpu
    from tuner.models.time.breakdown import fastest_step_s, model_flops_per_step
    from tuner.study.record import judge

    s = spec()
    gpu = study_gpu(s)
    bound = fastest_step_s(s.model, 32, s.world_size, gpu)
    scores = 3 * 32 * 8 * 4.0 * 1024 * 1024 * 1024  # the full score matrices' FLOPs
    peak = max(gpu.peak_tflops, gpu.fp8_peak_tflops) * 1e12
    assert bound == pytest.approx((model_flops_per_step(s.model, 32) - scores / 2) / (4 * peak))
    for ms, ok in (("1e-300", False), (f"{900 * bound:.6g}", False),
                   (f"{1100 * bound:.6g}", True)):  # fmt: skip
        log = tmp_path / f"{ms}.log"
        log.write_text("".join(line(i, 1000.0).replace("1000.0", ms) for i in range(1, 27)))
        got = judge(s, gpu, _job(log))
        assert got.metrics["step_time_s"] == pytest.approx(float(ms) / 1000)
        if ok:
            assert got.outcome == Outcome.OK and got.reason is None
        else:
            assert got.outcome == Outcome.NO_METRICS
            assert "faster than the hardware allows" in str(got.reason)
    assert fastest_step_s(s.model, 32, 4, get_gpu("cpu")) is None  # one core's guess: no bound
