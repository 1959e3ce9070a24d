"""The MoE demo end to end: real DeepSpeed-MoE runs on 2 CPU ranks at ep 1 and ep 2, leaderboard.

A reduced copy of studies/demo-moe.yaml (micro-batch 1 only, 3 iterations): its two configs,
experts replicated (ep 1) and split over both ranks (ep 2), both train, and the measured tensor
peak of each is within 25% of the memory model's (the same bound as the dense demo's runs).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEMO_MOE = REPO / "tuner" / "studies" / "demo-moe.yaml"


@pytest.mark.slow
@pytest.mark.torch
def test_demo_moe_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch", reason="the demo trains for real: needs the train extra")
    pytest.importorskip("deepspeed", reason="the demo runs DeepSpeed: needs the train extra")
    from tuner.cli.main import main
    from tuner.report.export import emit_best
    from tuner.report.leaderboard import leaderboard
    from tuner.spec.file import load_study

    raw = yaml.safe_load(DEMO_MOE.read_text())
    script = str(REPO / "workloads" / "gpt_deepspeed.py")
    raw["launch"].update(train_iters=3, warmup_iters=1, python=sys.executable, script=script)
    raw["space"].update(micro_batch_size=[1])
    raw["search"].update(n_trials=2)
    study = tmp_path / "demo-moe.yaml"
    study.write_text(yaml.safe_dump(raw))
    results = tmp_path / "results"
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    rc = main(["run", "--study", str(study), "--results", str(results), "--quiet"])
    assert rc == 0

    spec = load_study(str(study))
    board = leaderboard(spec, include_all=True, results=str(results))
    ok = board[board["outcome"] == "ok"]
    assert sorted(ok["ep"]) == [1, 2], board.to_string()
    assert (ok["measured_step_s"] > 0).all()
    ratio = ok["measured_peak_gib"] / ok["predicted_peak_gib"]
    assert ((ratio > 0.75) & (ratio < 1.25)).all(), board.to_string()
    for trial in (results / "demo-moe" / "trials").iterdir():
        script_text = (trial / "launch-node-0.sh").read_text()
        assert "--num-experts 4" in script_text and "--ep-size" in script_text
        assert " aux_loss=" in (trial / "node-0.log").read_text()

    ds = json.loads(emit_best(spec, "ds-config", results=str(results)))
    assert ds["zero_optimization"]["stage"] == 1
    assert "--ep-size" in emit_best(spec, "args", results=str(results))
