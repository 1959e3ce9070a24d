"""The demo's exported full run, run as it is: ``tune best``'s launch script trains the demo's
small GPT for 2 iterations with DeepSpeed on 2 CPU ranks, and names the DeepSpeed version the
run logs."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

import pytest

from tests.procs import run_in_group
from tests.report.test_exports import free_port
from tuner.logs.versions import versions_in_text

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "tuner" / "studies" / "demo.yaml"

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


@pytest.mark.slow
@pytest.mark.torch
def test_the_demos_best_script_trains(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed", reason="the demo runs DeepSpeed: needs the train extra")
    from tests.report.test_exports import record_measured
    from tuner.report.export import trial_record
    from tuner.space.enumerate import enumerate_space
    from tuner.spec.file import load_study

    spec = load_study(str(DEMO))
    launch = dataclasses.replace(spec.launch, python=sys.executable, master_port=free_port())
    spec = dataclasses.replace(spec, launch=launch)
    best = enumerate_space(spec).ranked()[0].config
    record_measured(spec, tmp_path / "results", [(best, 0.5)])
    export = trial_record(spec, results=str(tmp_path / "results")).export("script", train_iters=2)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "NODE_RANK")}
    done = run_in_group(["bash", str(export.path)], timeout=540, env=env, cwd=tmp_path)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "tuner: node 0 of 1, master 127.0.0.1" in log
    for rank in (0, 1):
        assert f"tuner-done: iters=2 rank={rank}" in log, log[-4000:]
    assert len(re.findall(r"^tuner-step: iter=\d+ .* rank=0$", log, re.M)) == 2, log[-4000:]
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", versions_in_text(log)["deepspeed"])
