"""The demo study end to end: real DeepSpeed runs on 2 CPU ranks, pruning, leaderboard, export.

A reduced copy of studies/demo.yaml (ZeRO 0/3 x pp 1/2 x micro-batch 1/4, 4 iterations) so that
both a ZeRO-3 run and a pipeline run certainly happen: its four viable configs are all enqueued,
and once they have run the study stops, the space exhausted: the two configs the memory model
prunes (micro-batch 4 without pipeline) and the two invalid ones (ZeRO-3 with pp 2) never launch
(the random sampler may still propose, and so record, some of them first).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "tuner" / "studies" / "demo.yaml"


@pytest.mark.slow
@pytest.mark.torch
def test_demo_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch", reason="the demo trains for real: needs the train extra")
    pytest.importorskip("deepspeed", reason="the demo runs DeepSpeed: needs the train extra")
    from tuner.cli.main import main
    from tuner.report.export import emit_best
    from tuner.report.leaderboard import leaderboard
    from tuner.space.enumerate import enumerate_space
    from tuner.spec.file import load_study

    raw = yaml.safe_load(DEMO.read_text())
    # the copy lives in tmp_path, and its paths would be relative to that folder
    script = str(REPO / "workloads" / "gpt_deepspeed.py")
    raw["launch"].update(train_iters=4, warmup_iters=1, python=sys.executable, script=script)
    raw["space"].update(zero_stage=[0, 3], pp=[1, 2], micro_batch_size=[1, 4], recompute=["none"])
    raw["search"].update(sampler="random", n_trials=5, enqueue_top=4)
    study = tmp_path / "demo.yaml"
    study.write_text(yaml.safe_dump(raw))
    results = tmp_path / "results"
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    rc = main(["run", "--study", str(study), "--results", str(results), "--n-trials", "5",
               "--quiet"])  # fmt: skip
    assert rc == 0

    spec = load_study(str(study))
    board = leaderboard(spec, include_all=True, results=str(results))
    ok = board[board["outcome"] == "ok"]
    assert len(ok) == 4, board.to_string()
    assert (ok["measured_step_s"] > 0).all()
    assert (ok["measured_peak_gib"] > 0).all()
    assert (ok["zero_stage"] == 3).any(), "no ZeRO-3 run"
    assert (ok["pp"] == 2).any(), "no pipeline run"
    space = enumerate_space(spec, keep_oom=True)
    assert {(c.config.pp, c.config.micro_batch_size) for c in space.oom} == {(1, 4)}
    assert len(space.oom) == 2 and not space.probes
    assert (1, 4) not in set(zip(ok["pp"], ok["micro_batch"], strict=True))  # never launched
    pruned = board[board["outcome"] == "pruned_memory"]
    assert (pruned["micro_batch"] == 4).all(), board.to_string()
    for reason in pruned["reason"]:  # readable at 0.1 GiB scale: "0.134 GiB > 0.11 GiB"
        peak, limit = map(float, re.findall(r"([0-9.]+) GiB", reason))
        assert peak > limit, reason
    assert not board[board["outcome"] == "invalid"]["zero_stage"].isin([0, 1]).any()

    ds = json.loads(emit_best(spec, "ds-config", results=str(results)))
    assert ds["train_batch_size"] == raw["training"]["global_batch_size"]
    assert ds["zero_optimization"]["stage"] in (0, 3)
