"""A torchtitan study end to end: the real loop launches the torchtitan stand-in under torchrun,
parses its metric lines, ranks the leaderboard and exports the winner for the pinned release."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.standins import torchtitan_train as standin
from tuner.report.export import emit_best
from tuner.report.leaderboard import leaderboard
from tuner.spec.file import study_from_mapping
from tuner.study.build import build_loop

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "standins" / "torchtitan_train.py"

pytestmark = [pytest.mark.slow]


def study_data() -> dict[str, Any]:
    return {
        "name": "titan-e2e",
        "model": {"num_layers": 6, "hidden_size": 256, "ffn_hidden_size": 768,
                  "num_attention_heads": 16, "num_query_groups": 4, "vocab_size": 2048,
                  "seq_length": 2048, "tied_embeddings": False},
        "training": {"global_batch_size": 8, "precision": "bf16"},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 2, "num_nodes": 1,
                    "executor": "local"},
        "framework": "torchtitan",
        "launch": {"template": "torchtitan_llama", "script": str(STANDIN),
                   "script_args": ["--module", "llama3", "--config", "llama3_debugmodel"],
                   "python": sys.executable, "train_iters": 4, "warmup_iters": 1,
                   "env": {"TUNER_STANDIN_TIME_SCALE": "0.01"}},
        "space": {"tp": [1, 2], "pp": [1, 2], "micro_batch_size": [1, 2],
                  "sequence_parallel": [True], "recompute": ["none", "full"],
                  "reshard_after_forward": ["default", "never"]},
        "search": {"n_trials": 4, "nodes_per_trial": 1, "trial_timeout_min": 2, "seed": 3,
                   "early_stop_trials": None, "stop_chance": None},
    }  # fmt: skip


def test_a_torchtitan_study_runs_ranks_and_exports(tmp_path: Path) -> None:
    spec = study_from_mapping(study_data())
    results = str(tmp_path / "results")
    loop = build_loop(spec, results=results)
    try:
        loop.run()
    finally:
        loop.executor.close()
    rows = leaderboard(spec, include_all=True, results=results)
    ok = rows[rows.outcome == "ok"]
    assert len(ok) >= 3, rows[["trial", "outcome", "reason"]]
    for row in ok.itertuples():
        # the step time the parser derived from tps is the stand-in's own step time
        trial_dir = tmp_path / "results" / "titan-e2e" / "trials" / str(row.trial)
        script = next(trial_dir.glob("launch-node-*.sh")).read_text()
        args = shlex.split(script.split("args=(")[1].split("\n)")[0])
        values, _, config, ac = standin.parse(args)
        step_s, reserved = standin.surface(values, standin.check(values, 2), ac, config)
        assert row.measured_step_s == pytest.approx(step_s, rel=0.03)
        assert row.measured_reserved_gib == pytest.approx(reserved, abs=0.01)
    best = emit_best(spec, "torchtitan", results=results)
    assert best.startswith(
        "--module llama3 --config llama3_debugmodel --training.local-batch-size"
    )
    assert best.rstrip().split()[-1].startswith("activation-checkpoint:")
    if importlib.util.find_spec("torchtitan") is not None:  # the pinned release's own parser
        from torchtitan.config.manager import ConfigManager

        parsed = ConfigManager().parse_args(shlex.split(best))
        assert parsed.training.global_batch_size == 8
    # --emit args: torchrun running torchtitan's trainer with the launch script's own arguments
    # (no DeepSpeed config), and it runs
    words = shlex.split(emit_best(spec, "args", results=results, train_iters=3))
    assert words[:6] == ["torchrun", "--nnodes", "1", "--nproc_per_node", "2", str(STANDIN)]
    assert not any("deepspeed" in w for w in words)
    trial_dir = tmp_path / "results" / "titan-e2e" / "trials" / str(ok.trial.iloc[0])
    script = next(trial_dir.glob("launch-node-*.sh")).read_text()
    launched = shlex.split(script.split("args=(")[1].split("\n)")[0])
    steps = words.index("--training.steps")
    assert words[6:steps] + words[steps + 2 :] == [
        w for i, w in enumerate(launched) if i not in (launched.index("--training.steps"),
                                                       launched.index("--training.steps") + 1)
    ]  # fmt: skip
    env = {**os.environ, "TUNER_STANDIN_TIME_SCALE": "0.01"}
    torchrun = Path(sys.executable).with_name("torchrun")
    run = subprocess.run([str(torchrun), *words[1:]], env=env, capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
