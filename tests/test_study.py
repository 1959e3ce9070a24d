"""End-to-end study loop: local executor, the Megatron stand-in under torchrun, real SQLite."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.procs import live_processes
from tuner.config.parallel import ParallelConfig
from tuner.outcome import Outcome
from tuner.report.export import emit_best
from tuner.report.leaderboard import leaderboard, load_optuna_study
from tuner.space.cost import MIN_LIMIT_MIN
from tuner.space.enumerate import enumerate_space
from tuner.space.probes import MIN_FIT_PROBABILITY, fit_probability
from tuner.space.trials import counts_as_run, oom_dominates
from tuner.spec.file import study_from_mapping
from tuner.study.build import build_loop

REPO = Path(__file__).resolve().parents[1]
STANDINS = REPO / "tests" / "standins"

pytestmark = [pytest.mark.slow]

SURFACE: dict[str, Any] = {
    "kind": "formula",
    "step_s": {"base": 1.0, "factors": {
        "tp": {"1": 1.25, "2": 1.0}, "pp": {"1": 1.0, "2": 1.3},
        "mbs": {"1": 1.5, "2": 1.2, "4": 1.0, "8": 1.1},
        "recompute": {"none": 1.0, "selective": 1.08, "full": 1.3},
        "sp": {"0": 1.05, "1": 1.0}, "distopt": {"0": 1.0, "1": 1.03},
    }},
    "memory_gib": 10.0,
    "noise": 0.0,
    "warmup_factor": 1.0,
}  # fmt: skip
OPTIMUM = "tp=2,pp=1,cp=1,dp=1,vp=1,sp=1,mbs=4,gbs=32,recompute=none,distopt=0,zero=0"


def study_data(tmp: Path, surface: dict[str, Any], **search: Any) -> dict[str, Any]:
    (tmp / "surface.json").write_text(json.dumps(surface))
    return {
        "name": "e2e",
        "model": {"num_layers": 8, "hidden_size": 1024, "ffn_hidden_size": 4096,
                  "num_attention_heads": 16, "vocab_size": 32000, "seq_length": 1024},
        "training": {"global_batch_size": 32},
        "cluster": {"gpu": "a100-80gb", "gpus_per_node": 2, "num_nodes": 2, "executor": "local"},
        "framework": "megatron",
        "launch": {"template": "megatron_gpt", "megatron_path": str(STANDINS),
                   "python": sys.executable, "train_iters": 5, "warmup_iters": 1,
                   "env": {"TUNER_STANDIN_SURFACE": str(tmp / "surface.json"),
                           "TUNER_STANDIN_TIME_SCALE": "0.0001"}},
        "space": {"tp": [1, 2], "pp": [1, 2], "micro_batch_size": [1, 2, 4, 8],
                  "sequence_parallel": [True, False], "recompute": ["none", "selective", "full"],
                  "distributed_optimizer": [True, False]},
        "search": {"n_trials": 16, "nodes_per_trial": 1, "trial_timeout_min": 2, "seed": 3,
                   "early_stop_trials": None, **search},
    }  # fmt: skip


def write_study(tmp: Path, data: dict[str, Any]) -> Path:
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def standin_processes(tmp: Path) -> list[str]:
    """Live stand-in processes launched by the study under ``tmp``: matched on the environment
    the template exports (the surface file is unique to each test)."""
    needle = f"TUNER_STANDIN_SURFACE={tmp / 'surface.json'}"
    return live_processes(lambda p: needle in p.environ and "pretrain_gpt.py" in p.cmdline)


def test_finds_the_known_optimum(tmp_path: Path) -> None:
    # The surface's best micro-batch (4) is one the model ranks 12 % slower than 8, so it is
    # found by exploring. The answer is for a real training run (1,000 node-hours), which makes
    # that exploration worth its cost; the stop rule on chance alone stays on.
    spec = study_from_mapping(study_data(tmp_path, SURFACE, train_node_hours=1000.0))
    assert len(enumerate_space(spec).viable) >= 50
    loop = build_loop(spec, results=str(tmp_path / "results"))
    try:
        summary = loop.run()
    finally:
        loop.executor.close()
    board = leaderboard(spec, results=str(tmp_path / "results"))
    # the budget counts runs; a node error (a rendezvous port taken meanwhile) runs again
    runs = summary.launched - summary.outcomes.get("node_error", 0)
    assert runs <= 16 and not board.empty
    best = board.iloc[0]
    key = ParallelConfig(
        tp=int(best.tp), pp=int(best.pp), dp=int(best.dp), sequence_parallel=bool(best.sp),
        micro_batch_size=int(best.micro_batch), global_batch_size=32,
        recompute=best.recompute, distributed_optimizer=bool(best.distributed_optimizer),
    ).key()  # fmt: skip
    assert key == OPTIMUM, board[
        ["trial", "tp", "pp", "micro_batch", "recompute", "measured_step_s"]
    ]
    assert best.measured_step_s == pytest.approx(1.0, rel=0.02)
    # Every launched config is distinct, and the winner exports as a launch script.
    all_rows = leaderboard(spec, include_all=True, results=str(tmp_path / "results"))
    launched = all_rows[all_rows.outcome == "ok"]
    cols = ["tp", "pp", "micro_batch", "recompute", "sp", "distributed_optimizer"]
    assert len(launched) == len(launched.drop_duplicates(cols))
    full = dataclasses.replace(spec, launch=dataclasses.replace(
        spec.launch, train_args=("--data-path", "/data/text_document")))  # fmt: skip
    script = emit_best(full, "script", results=str(tmp_path / "results"))
    assert "NODE_RANK" in script and "/data/text_document" in script
    assert "--micro-batch-size 4" in emit_best(spec, "args", results=str(tmp_path / "results"))


@pytest.mark.parametrize("sampler", ["model", "random"])
def test_oom_surface_launches_nothing_predicted_to_oom(tmp_path: Path, sampler: str) -> None:
    """The model sampler proposes admitted configs only; Optuna's samplers propose anything and
    the loop's memory screen records the predicted OOMs as pruned, unlaunched."""
    surface = dict(SURFACE, memory_gib={"base": 0.0, "terms": {"mbs": 3.0}}, gpu_memory_gib=20,
                   oom_if_memory_above=20)  # fmt: skip
    data = study_data(tmp_path, surface, n_trials=8, memory_headroom=0.9, sampler=sampler)
    data["cluster"]["gpu_memory_gib"] = 4.0  # the memory model prunes the big micro-batches
    spec = study_from_mapping(data)
    loop = build_loop(spec, results=str(tmp_path / "results"))
    try:
        loop.run()
    finally:
        loop.executor.close()
    rows = leaderboard(spec, include_all=True, results=str(tmp_path / "results"))
    if sampler == "random":
        assert (rows.outcome == str(Outcome.PRUNED_MEMORY)).any()
    launched = rows[~rows.outcome.isin(["pruned_memory", "invalid"])]
    assert not launched.empty
    # Over the headroom only the study's memory probes run (tuner.space.probes): marked, at most
    # search.memory_probes of them, and each with a real chance of fitting the GPU under its
    # breakdown's own stated sd (tuner.models.uncertainty), the sd the probe was chosen on.
    study = load_optuna_study(spec, None, str(tmp_path / "results"))
    probes = {t.number for t in study.trials if t.user_attrs.get("memory_probe")}
    assert len(probes) <= spec.search.memory_probes
    over = launched[launched.predicted_peak_gib > 0.9 * 4.0]
    assert set(over.trial) <= probes, over[["trial", "predicted_peak_gib"]]
    stated = {c.config.key(): c.memory.sigma for c in enumerate_space(spec, keep_oom=True).oom}
    for key, peak in zip(over.key, over.predicted_peak_gib, strict=True):
        assert fit_probability(peak, 4.0, stated[key]) >= MIN_FIT_PROBABILITY, (key, peak)


def test_without_probes_nothing_predicted_over_the_headroom_is_launched(tmp_path: Path) -> None:
    surface = dict(SURFACE, memory_gib={"base": 0.0, "terms": {"mbs": 3.0}}, gpu_memory_gib=20,
                   oom_if_memory_above=20)  # fmt: skip
    data = study_data(tmp_path, surface, n_trials=8, memory_headroom=0.9, memory_probes=0)
    data["cluster"]["gpu_memory_gib"] = 4.0
    spec = study_from_mapping(data)
    loop = build_loop(spec, results=str(tmp_path / "results"))
    try:
        loop.run()
    finally:
        loop.executor.close()
    rows = leaderboard(spec, include_all=True, results=str(tmp_path / "results"))
    launched = rows[~rows.outcome.isin(["pruned_memory", "invalid"])]
    assert not launched.empty
    assert (launched.predicted_peak_gib <= 0.9 * 4.0).all()


def test_grid_sampler_runs_the_whole_grid_then_stops(tmp_path: Path) -> None:
    """Optuna's GridSampler stops the study when the grid is visited, which raises under
    ask/tell; the loop must instead finish the grid and report the space exhausted."""
    data = study_data(tmp_path, SURFACE, n_trials=10, sampler="grid")
    data["space"].update(tp=[1, 2], pp=[1], micro_batch_size=[4], recompute=["none"],
                         distributed_optimizer=[False])  # fmt: skip
    spec = study_from_mapping(data)
    loop = build_loop(spec, results=str(tmp_path / "results"))
    try:
        summary = loop.run()
    finally:
        loop.executor.close()
    assert "space exhausted" in summary.stop_reason
    rows = leaderboard(spec, results=str(tmp_path / "results"))
    # tp=1 (SP off), tp=2 with SP, tp=2 without: each measured once
    assert sorted(zip(rows.tp, rows.sp, strict=True)) == [(1, False), (2, False), (2, True)]


def test_a_held_back_launch_goes_on_and_limits_follow_the_measured_start_up(
    tmp_path: Path,
) -> None:
    """A stop rule that holds launches back while a trial runs may let them go on once it
    finishes: the loop then shows no stale reason (one kept ended the loop on the first pass
    that launched nothing). Each trial records the limit it was launched with: the first one's
    cut from the user's 20-minute start-up guess, the next ones' from the seconds the first
    launch took."""
    # 100 ms steps, slept: the model's FLOPs at the two A100s' peak take 45 ms (a faster step
    # is a corrupt measurement, recorded no_metrics: tuner.models.time.breakdown.fastest_step_s)
    surface = dict(SURFACE, step_s=dict(SURFACE["step_s"], base=0.1))
    data = study_data(tmp_path, surface, n_trials=3, trial_timeout_min=None, startup_min=20.0)
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = "1"  # a launch is all start-up
    data["cluster"]["num_nodes"] = 1  # one trial at a time
    spec = study_from_mapping(data)
    loop = build_loop(spec, results=str(tmp_path / "results"))

    def held(trials: Any) -> str | None:  # held back while the first trial runs
        ran = any(t.state.is_finished() and t.user_attrs.get("launched") for t in trials)
        return None if ran or not loop.running else "held back"

    shown: list[tuple[int, str]] = []
    loop.stopper = held  # type: ignore[assignment]
    loop.on_update = lambda lp: shown.append((lp.summary.launched, lp.summary.stop_reason))
    try:
        summary = loop.run()
    finally:
        loop.executor.close()
    assert summary.launched == 3 and summary.stop_reason.startswith("ran 3 trials"), summary
    assert (1, "held back") in shown  # the rule did hold the second launch back
    assert all(reason != "held back" for launched, reason in shown if launched > 1)
    trials = sorted(loop.study.get_trials(), key=lambda t: t.number)
    limits = [t.user_attrs["limit_s"] for t in trials if t.user_attrs.get("launched")]
    assert limits[0] >= 1.5 * 20 * 60  # the guess: 20 min of start-up, with the margin
    assert limits[1:] == [MIN_LIMIT_MIN * 60] * 2  # a launch of seconds: the shortest limit


@pytest.mark.parametrize("sampler", ["model", "random"])
def test_a_space_smaller_than_the_budget_stops_once_every_config_ran(
    tmp_path: Path, sampler: str
) -> None:
    """Three configs, a budget of ten: once all three are measured the loop stops and says the
    space is exhausted, without asking the sampler hundreds of times (each refusal a trial)."""
    data = study_data(tmp_path, SURFACE, n_trials=10, sampler=sampler)
    data["space"].update(tp=[1, 2], pp=[1], micro_batch_size=[4], recompute=["none"],
                         distributed_optimizer=[False])  # fmt: skip
    spec = study_from_mapping(data)
    assert len(enumerate_space(spec).viable) == 3
    loop = build_loop(spec, results=str(tmp_path / "results"))
    try:
        summary = loop.run()
    finally:
        loop.executor.close()
    assert "space exhausted" in summary.stop_reason
    rows = leaderboard(spec, include_all=True, results=str(tmp_path / "results"))
    assert (rows.outcome == "ok").sum() == 3
    # the model sampler never proposes a taken config; random may, a few times, not 300
    assert len(loop.study.trials) < 30


def test_three_launch_errors_stop_the_study_and_exit_1(tmp_path: Path) -> None:
    data = study_data(tmp_path, SURFACE, n_trials=6)
    del data["launch"]["megatron_path"]  # the template requires it: every launch fails
    path = write_study(tmp_path, data)
    # past the checks before launching (which refuse this study in one line, exit 2: tests/
    # test_hostile_inputs.py), as a launch that fails only on the nodes would get
    run = tune("run", "--study", str(path), "--results", str(tmp_path / "results"), "--quiet",
               "--skip-preflight", cwd=tmp_path)  # fmt: skip
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 1, out
    assert "3 launch errors in a row" in out
    rows = leaderboard(study_from_mapping(data), include_all=True,
                       results=str(tmp_path / "results"))  # fmt: skip
    assert list(rows.outcome) == ["launch_error"] * 3
    assert rows.reason.str.contains("megatron_path").all()


def test_a_dead_workers_trials_are_cleaned_up_and_run_again(tmp_path: Path) -> None:
    """A worker that dies mid-trial leaves its trials RUNNING and their processes running. Once
    its heartbeats are stale the next worker fails those trials, ends their processes on their
    nodes, counts them interrupted (not against the budget) and runs their configs again."""
    data = study_data(tmp_path, SURFACE, n_trials=2, heartbeat_s=1)  # grace period: 4 s
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = "10"  # a minute per trial
    spec = study_from_mapping(data)
    results = str(tmp_path / "results")
    dead = build_loop(spec, results=results)
    dead.seed()
    dead.step()  # launches one trial per node
    lost = {n: run.config for n, run in dead.running.items()}
    assert len(lost) == 2
    dead.beat()  # its last sign of life; then it "dies" without cleaning up
    deadline = time.monotonic() + 60
    while len(standin_processes(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert standin_processes(tmp_path), "the dead worker's trials never started"
    time.sleep(6.5)  # > the 4 s grace period, on SQLite timestamps of 1 s resolution
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = "0.0001"
    live = build_loop(study_from_mapping(data), results=results, force=True)
    try:
        live.seed()
        assert standin_processes(tmp_path) == []  # cleaned up before anything else runs
        summary = live.run()
    finally:
        live.executor.close()
        for run in dead.running.values():
            run.job.cancel()
        dead.executor.close()
    assert summary.launched == 2
    rows = leaderboard(spec, include_all=True, results=results)
    assert list(rows[rows.trial.isin(list(lost))].outcome) == ["interrupted", "interrupted"]
    ok = rows[rows.outcome == "ok"]
    measured = {(r.tp, r.pp, r.micro_batch, r.recompute) for r in ok.itertuples()}
    assert {(c.tp, c.pp, c.micro_batch_size, c.recompute) for c in lost.values()} == measured


def test_oom_dominance() -> None:
    oom = ParallelConfig(tp=2, micro_batch_size=2, recompute="selective", global_batch_size=32)
    bigger = ParallelConfig(tp=2, micro_batch_size=4, recompute="none", global_batch_size=32)
    smaller = ParallelConfig(tp=2, micro_batch_size=1, recompute="selective", global_batch_size=32)
    more_rc = ParallelConfig(
        tp=2, micro_batch_size=2, recompute="full", recompute_method="uniform",
        recompute_num_layers=1, global_batch_size=32,
    )  # fmt: skip
    other_split = ParallelConfig(tp=1, dp=2, micro_batch_size=4, global_batch_size=32)
    assert oom_dominates(oom, bigger) and oom_dominates(oom, oom)
    assert not oom_dominates(oom, smaller) and not oom_dominates(oom, more_rc)
    assert not oom_dominates(oom, other_split)


def tune(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tuner.cli.main", *args], cwd=cwd, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def test_sigint_then_resume_loses_nothing(tmp_path: Path) -> None:
    surface = dict(SURFACE)
    data = study_data(tmp_path, surface, n_trials=6, enqueue_top=2)
    scale = tmp_path / "time_scale"
    scale.write_text("1.5")  # ~1.5 s per iteration, read by the stand-in at every sleep
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = str(scale)
    path = write_study(tmp_path, data)
    results = str(tmp_path / "results")
    first = tune("run", "--study", str(path), "--results", results, "--quiet", cwd=tmp_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until a trial finished and others are running
        metrics = list((tmp_path / "results" / "e2e" / "trials").glob("*/metrics.json"))
        if metrics and standin_processes(tmp_path):
            break
        if first.poll() is not None:
            out = first.communicate()[0]
            pytest.fail(f"the study ended before it could be interrupted: {out}")
        time.sleep(0.5)
    else:
        first.kill()
        out = first.communicate()[0]
        pytest.fail(f"no moment with a finished trial and a running stand-in: {out}")
    first.send_signal(signal.SIGINT)
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 130, out
    assert standin_processes(tmp_path) == []
    spec = study_from_mapping(data)
    before = leaderboard(spec, include_all=True, results=results)
    finished = set(before[before.outcome == "ok"].trial)
    interrupted = before[before.outcome == "interrupted"]
    assert finished and not interrupted.empty
    scale.write_text("0.0001")  # the same study file resumes; its trials need no pace now
    second = tune("run", "--study", str(path), "--results", results, "--quiet", cwd=tmp_path)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    space = enumerate_space(spec).counts()
    assert f"space: {space['total']} configs; {space['invalid']} break a framework rule" in out
    probes = space["memory_probes"]  # "but for 1 memory probes" read wrong: counted, singular
    assert (f"(never launched but {probes} memory probe" if probes else "(never launched)") in out
    assert "measured / predicted step time: median" in out
    after = leaderboard(spec, include_all=True, results=results)
    assert finished <= set(after[after.outcome == "ok"].trial)
    rerun_keys = {tuple(r) for r in interrupted[["tp", "pp", "micro_batch", "recompute"]].values}
    ok = after[after.outcome == "ok"]
    ok_keys = {tuple(r) for r in ok[["tp", "pp", "micro_batch", "recompute"]].values}
    assert rerun_keys <= ok_keys
    assert standin_processes(tmp_path) == []


@pytest.mark.parametrize("storage", ["sqlite", "journal", "postgresql"])
def test_two_workers_never_run_one_config_twice(
    tmp_path: Path, storage: str, request: pytest.FixtureRequest
) -> None:
    data = study_data(tmp_path, SURFACE, n_trials=8, enqueue_top=4)
    path = write_study(tmp_path, data)
    results = str(tmp_path / "results")
    flags = ["--results", results, "--quiet"]
    if storage == "journal":
        flags += ["--storage", str(tmp_path / "study.journal")]
    elif storage == "postgresql":
        server = request.getfixturevalue("postgres")
        flags += ["--storage", server.create_database(f"e2e_{os.getpid()}")]
    # Started at the same moment: creating the storage and the study must survive the race.
    first = tune("run", "--study", str(path), *flags, cwd=tmp_path)
    second = tune("run", "--study", str(path), *flags, cwd=tmp_path)
    for proc in (first, second):
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
    store = flags[flags.index("--storage") + 1] if "--storage" in flags else None
    rows = leaderboard(study_from_mapping(data), include_all=True, storage=store,
                       results=results)  # fmt: skip
    ran = rows[rows.outcome == "ok"]
    cols = ["tp", "pp", "micro_batch", "recompute", "sp", "distributed_optimizer"]
    assert len(ran) >= 4
    assert not ran.duplicated(cols).any(), ran[cols]
    # Both workers count the runs under one budget lease: together they launch n_trials, no more.
    study = load_optuna_study(study_from_mapping(data), store, results)
    assert sum(counts_as_run(t) for t in study.get_trials(deepcopy=False)) <= 8


def test_changed_study_is_refused_without_force(tmp_path: Path) -> None:
    data = study_data(tmp_path, SURFACE, n_trials=1, enqueue_top=1)
    path = write_study(tmp_path, data)
    results = str(tmp_path / "results")
    proc = tune("run", "--study", str(path), "--results", results, "--quiet", cwd=tmp_path)
    assert proc.wait(timeout=120) == 0
    data["space"]["tp"] = [1]
    write_study(tmp_path, data)
    proc = tune("run", "--study", str(path), "--results", results, "--quiet", cwd=tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--force" in out
    proc = tune("run", "--study", str(path), "--results", results, "--quiet", "--force",
                cwd=tmp_path)  # fmt: skip
    assert proc.wait(timeout=120) == 0


def test_bad_study_file_exits_2(tmp_path: Path) -> None:
    data = study_data(tmp_path, SURFACE)
    data["search"]["sampler"] = "annealing"
    path = write_study(tmp_path, data)
    proc = subprocess.run([sys.executable, "-m", "tuner.cli.main", "run", "--study", str(path)],
                          capture_output=True, text=True, cwd=tmp_path, env=os.environ.copy(),
                          check=False)  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "search.sampler" in lines[0]


def test_a_fast_config_predicted_just_over_the_gpu_is_probed_and_measured(tmp_path: Path) -> None:
    """The model's fastest config is predicted 3% over the GPU; the stand-in shows it fits. It is
    the first memory probe, launched after the first measured peak, and measured as the best.
    Nothing predicted over the headroom is launched except as a memory probe the judge allowed
    (with its reason), at most ``memory_probes`` of them: whether the second near-limit config
    (the same with selective recompute) is also worth a launch is the sampler's call, and it
    depends on which trials have finished when it asks."""
    factors = {"tp": {"1": 1.0, "2": 1.3}, "pp": {"1": 1.0, "2": 1.3},
               "mbs": {"1": 1.5, "2": 1.2, "4": 1.0, "8": 0.9},
               "recompute": {"none": 1.0, "selective": 1.08, "full": 1.3},
               "distopt": {"0": 1.03, "1": 1.0}}  # fmt: skip
    data = study_data(tmp_path, SURFACE, n_trials=8)
    roomy = enumerate_space(study_from_mapping(data)).ranked()[0]
    assert roomy.time is not None
    # Measured times near the model's (a 10x gap would be a sampler test, not a probe test).
    step = {"base": roomy.time.step / 0.9, "factors": factors}
    data = study_data(tmp_path, dict(SURFACE, memory_gib=1.0, step_s=step), n_trials=8)
    data["cluster"]["gpu_memory_gib"] = roomy.memory.peak / 2**30 / 1.03
    spec = study_from_mapping(data)
    probes = [c.config.key() for c in enumerate_space(spec).probes]
    assert probes and probes[0] == roomy.config.key()
    loop = build_loop(spec, results=str(tmp_path / "results"))
    try:
        loop.run()
    finally:
        loop.executor.close()
    study = load_optuna_study(spec, None, str(tmp_path / "results"))
    launched = [t for t in study.trials if t.user_attrs.get("launched")]
    probed = [t for t in launched if t.user_attrs.get("memory_probe")]
    assert probed and probed[0].user_attrs["key"] == roomy.config.key()
    assert len(probed) <= spec.search.memory_probes
    assert {t.user_attrs["key"] for t in probed} <= set(probes)  # only the enumerated probes
    assert probed[0].user_attrs["outcome"] == "ok" and probed[0].number > launched[0].number
    assert all("likely within the GPU" in t.user_attrs["probe_reason"] for t in probed)
    # each screened trial keeps the stated sds its predictions carry (the report's bars)
    assert probed[0].user_attrs["predicted_step_sd"] == round(roomy.time.sigma, 4) > 0
    assert probed[0].user_attrs["predicted_peak_sd"] == round(roomy.memory.sigma, 4) > 0
    limit = spec.search.memory_headroom * (spec.cluster.gpu_memory_gib or 0)
    others = [t for t in launched if not t.user_attrs.get("memory_probe")]
    assert all(t.user_attrs["predicted_peak_gib"] <= limit for t in others)
    board = leaderboard(spec, results=str(tmp_path / "results"))
    assert int(board.iloc[0].trial) == probed[0].number  # the probe was the hidden best


def test_a_moe_study_searches_expert_parallelism_end_to_end(tmp_path: Path) -> None:
    """An MoE model on the stand-in: EP is a searched knob, its flags reach Megatron's argv (the
    stand-in applies Megatron's expert-parallel checks), the leaderboard shows ep."""
    surface = {**SURFACE, "step_s": {"base": 1.0, "factors": {
        "ep": {"1": 1.4, "2": 1.0}, "mbs": {"1": 1.3, "2": 1.0}}}}  # fmt: skip
    data = study_data(tmp_path, surface, n_trials=6)
    data["model"] = {
        "num_layers": 4,
        "hidden_size": 256,
        "ffn_hidden_size": 512,
        "num_attention_heads": 4,
        "vocab_size": 1000,
        "seq_length": 256,
        "swiglu": True,
        "add_bias_linear": False,
        "moe": {"num_experts": 4, "router_topk": 2, "aux_loss_coeff": 0.01},
    }
    data["space"] = {"tp": [1], "pp": [1], "ep": "auto", "micro_batch_size": [1, 2],
                     "distributed_optimizer": [True]}  # fmt: skip
    spec = study_from_mapping(data)
    assert {c.config.ep for c in enumerate_space(spec).viable} == {1, 2}
    loop = build_loop(spec, results=str(tmp_path / "results"))
    try:
        loop.run()
    finally:
        loop.executor.close()
    board = leaderboard(spec, results=str(tmp_path / "results"))
    assert set(board.outcome) == {"ok"} and len(board) == 4
    best = board.iloc[0]
    assert (int(best.ep), int(best.micro_batch), best.dispatcher) == (2, 2, "alltoall")
    assert best.measured_step_s == pytest.approx(1.0, rel=0.02)
    args = emit_best(spec, "args", results=str(tmp_path / "results"))
    assert "--num-experts 4" in args and "--expert-model-parallel-size 2" in args


def test_a_moe_study_searches_selective_recompute_modules_end_to_end(tmp_path: Path) -> None:
    """Selective recompute's modules are one searched knob: each config's
    --recompute-modules reach the stand-in (Megatron's checks run on them), the leaderboard and
    the exported arguments spell the winner as the study does."""
    surface = {**SURFACE, "step_s": {"base": 1.0, "factors": {"recompute_modules": {
        "core_attn": 1.0, "core_attn+moe_act": 0.9, "core_attn+moe": 1.2}}}}  # fmt: skip
    data = study_data(tmp_path, surface, n_trials=3)
    data["model"] = {
        "num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 512, "num_attention_heads": 4,
        "vocab_size": 1000, "seq_length": 256, "swiglu": True, "add_bias_linear": False,
        "moe": {"num_experts": 4, "router_topk": 2, "aux_loss_coeff": 0.01},
    }  # fmt: skip
    data["space"] = {"tp": [1], "pp": [1], "ep": [2], "micro_batch_size": [2],
                     "recompute": ["selective", "selective:core_attn+moe_act",
                                   "selective:moe+core_attn"]}  # fmt: skip
    spec = study_from_mapping(data)
    loop = build_loop(spec, results=str(tmp_path / "results"))
    try:
        loop.run()
    finally:
        loop.executor.close()
    board = leaderboard(spec, results=str(tmp_path / "results"))
    assert set(board.outcome) == {"ok"}
    assert set(board.recompute) == {"selective", "selective:core_attn+moe_act",
                                    "selective:core_attn+moe"}  # fmt: skip
    best = board.iloc[0]
    assert best.recompute == "selective:core_attn+moe_act"
    assert best.measured_step_s == pytest.approx(0.9, rel=0.02)
    args = emit_best(spec, "args", results=str(tmp_path / "results"))
    assert "--recompute-granularity selective --recompute-modules core_attn moe_act" in args
