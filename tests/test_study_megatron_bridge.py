"""End to end: a ``framework: megatron-bridge`` study on the stand-in recipe script under
torchrun, through the ``tune`` commands (run, leaderboard, report, best --emit bridge-overrides),
on the local executor and through the throw-away local Slurm. The stand-in accepts only
Megatron-Bridge v0.6.0's real override keys, so every trial that ran is a rendering Bridge would
have parsed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.launch.slurm import LocalSlurm, local_slurm
from tests.test_study import SURFACE, study_data, write_study

REPO = Path(__file__).resolve().parents[1]
BRIDGE = REPO / "tests" / "standins" / "megatron_bridge"

pytestmark = [pytest.mark.slow]
__all__ = ["local_slurm"]  # the fixture, imported for this module


def bridge_data(tmp: Path, n_trials: int) -> dict[str, Any]:
    """The Megatron study of tests/test_study.py as a Megatron-Bridge study of the same model."""
    # every enqueued config runs (what is checked is what each renders and measures, not when
    # the search would stop by itself)
    data = study_data(tmp, SURFACE, n_trials=n_trials, enqueue_top=n_trials, stop_chance=None)
    data["name"] = "e2e-bridge"
    data["framework"] = "megatron-bridge"
    launch = data["launch"]
    del launch["megatron_path"]
    launch.update(template="megatron_bridge", bridge_path=str(BRIDGE),
                  recipe="llama3_8b_pretrain_config")  # fmt: skip
    return data


def tune(tmp: Path, *args: str) -> str:
    """Run one ``tune`` command to its end; its output (fails the test on a non-zero exit)."""
    done = subprocess.run(
        [sys.executable, "-m", "tuner.cli.main", *args], cwd=tmp, text=True,
        capture_output=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def run_and_export(tmp: Path, data: dict[str, Any], *run_args: str) -> dict[str, Any]:
    """tune run, leaderboard, report and best --emit bridge-overrides on one study."""
    path = str(write_study(tmp, data))
    results = str(tmp / "results")
    tune(tmp, "run", "--study", path, "--results", results, "--quiet", *run_args)
    board = json.loads(tune(tmp, "leaderboard", "--study", path, "--results", results,
                            "--format", "json", "--all"))  # fmt: skip
    tune(tmp, "report", "--study", path, "--results", results, "--out", str(tmp / "r.html"))
    assert (tmp / "r.html").stat().st_size > 0
    best = json.loads(tune(tmp, "best", "--study", path, "--results", results,
                           "--emit", "bridge-overrides", "--format", "json"))  # fmt: skip
    recipe = tune(tmp, "best", "--study", path, "--results", results, "--emit", "bridge-recipe")
    args = tune(tmp, "best", "--study", path, "--results", results, "--emit", "args")
    return {"board": board, "best": best, "recipe": recipe, "args": args.split()}


def _check(out: dict[str, Any], runs: int) -> None:
    ok = [row for row in out["board"] if row["outcome"] == "ok"]
    assert len(ok) >= runs, out["board"]
    assert {row["outcome"] for row in out["board"]} <= {"ok", "node_error", "invalid"}
    words, config = out["best"]["overrides"], out["best"]["config"]
    distopt = "true" if config["distributed_optimizer"] else "false"
    for word in (
        f"model.tensor_model_parallel_size={config['tp']}",
        f"model.pipeline_model_parallel_size={config['pp']}",
        f"train.micro_batch_size={config['micro_batch_size']}",
        "train.global_batch_size=32",
        f"ddp.use_distributed_optimizer={distopt}",
        f"optimizer.use_distributed_optimizer={distopt}",
    ):
        assert word in words, words  # fmt: skip
    assert f"cfg.model.tensor_model_parallel_size = {config['tp']}" in out["recipe"]
    # the reverse direction: the Bridge study's answer in Megatron-LM's flags
    assert out["args"][:2] == ["--tensor-model-parallel-size", str(config["tp"])]
    assert ("--use-distributed-optimizer" in out["args"]) == config["distributed_optimizer"]


def surface_step_s(row: dict[str, Any]) -> float:
    """SURFACE's step time for a leaderboard row: each searched knob moves it, so a measured
    time equal to it says every knob reached the stand-in through its Bridge override."""
    f = SURFACE["step_s"]["factors"]
    knobs = {"tp": row["tp"], "pp": row["pp"], "mbs": row["micro_batch"],
             "recompute": row["recompute"].split(":")[0], "sp": int(row["sp"]),
             "distopt": int(row["distributed_optimizer"])}  # fmt: skip
    step = float(SURFACE["step_s"]["base"])
    for name, value in knobs.items():
        step *= f[name][str(value)]
    return step


def test_bridge_study_local_measures_what_it_rendered(tmp_path: Path) -> None:
    out = run_and_export(tmp_path, bridge_data(tmp_path, n_trials=10))
    _check(out, runs=8)
    ok = [r for r in out["board"] if r["outcome"] == "ok"]
    for row in ok:
        assert row["measured_step_s"] == pytest.approx(surface_step_s(row), rel=0.01), row
        assert row["measured_peak_gib"] == pytest.approx(10.0, rel=0.01)  # GB read as 1e9 B
    fastest = min(ok, key=lambda r: r["measured_step_s"])
    assert out["best"]["config"]["tp"] == fastest["tp"]
    assert out["best"]["config"]["micro_batch_size"] == fastest["micro_batch"]


def test_bridge_study_through_local_slurm(local_slurm: LocalSlurm, tmp_path: Path) -> None:
    data = bridge_data(tmp_path, n_trials=3)
    data["cluster"] = {
        "gpu": "a100-80gb",
        "gpus_per_node": 2,
        "num_nodes": 1,
        "executor": "slurm",
        "slurm": {"max_jobs": 2, "poll_interval_s": 0.3},
    }
    # the stand-in plays GPUs; the Slurm nodes have no nvidia-smi
    out = run_and_export(tmp_path, data, "--skip-preflight")
    _check(out, runs=3)
    results = tmp_path / "results" / "e2e-bridge" / "trials"
    jobs = [json.loads(p.read_text()) for p in results.glob("*/result.json")]
    assert jobs and all(j["job_id"] and j["hosts"][0] in ("n1", "n2") for j in jobs), jobs
    assert os.environ.get("SLURM_CONF") == str(local_slurm.conf)
