"""The multi-node demo (studies/demo-ssh.yaml) through the real SSH executor: one 2-node trial.

Two loopback sshd nodes on 127.0.0.2 and 127.0.0.3 (tools/loopback_sshd.py, as `make demo-ssh`
starts them) run the shipped study, reduced to one trial of 4 iterations: a static torchrun
rendezvous on the first node, DeepSpeed over gloo, 1 CPU rank per node. The study's
``${TUNER_DEMO_ROOT}`` and ``${TUNER_DEMO_SSH}`` point at this checkout and at the nodes' client
files, as the Makefile sets them. Both nodes are this machine, so its process table is theirs.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEMO_SSH = REPO / "tuner" / "studies" / "demo-ssh.yaml"
if str(REPO) not in sys.path:  # tools/ is not part of the installed package
    sys.path.insert(0, str(REPO))

from tests.procs import live_processes  # noqa: E402
from tools.loopback_sshd import LoopbackCluster, sshd_missing_reason  # noqa: E402


def trial_processes(needle: Path) -> list[str]:
    """Live processes whose command line or working directory is under ``needle``: every
    process of a trial has one or the other (the node script runs in the trial directory,
    torchrun and its workers carry the trial's ds_config path)."""
    return live_processes(lambda p: str(needle) in p.cmdline or p.cwd.startswith(str(needle)))


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.ssh
def test_demo_ssh_runs_a_two_node_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reason = sshd_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("torch", reason="the demo trains for real: needs the train extra")
    pytest.importorskip("deepspeed", reason="the demo runs DeepSpeed: needs the train extra")
    from tuner.cli.main import main
    from tuner.report.leaderboard import leaderboard
    from tuner.spec.file import load_study

    raw = yaml.safe_load(DEMO_SSH.read_text())
    # the interpreter running the tests (the study names the checkout's .venv, as make does)
    raw["launch"].update(train_iters=4, warmup_iters=1, python=sys.executable)
    raw["search"].update(n_trials=1, enqueue_top=1, trial_timeout_min=2)
    study = tmp_path / "demo-ssh.yaml"
    study.write_text(yaml.safe_dump(raw))
    results = tmp_path / "results"

    cluster = LoopbackCluster(tmp_path / "nodes", 2)
    assert cluster.addresses == tuple(raw["cluster"]["nodes"])
    cluster.start()
    try:
        monkeypatch.setenv("TUNER_DEMO_ROOT", str(REPO))
        monkeypatch.setenv("TUNER_DEMO_SSH", str(cluster.base))
        rc = main(["run", "--study", str(study), "--results", str(results), "--quiet"])
        left_on_nodes = trial_processes(results)
        spec = load_study(str(study))
    finally:
        survivors = cluster.stop()
    assert rc == 0
    assert left_on_nodes == [], "trial processes left on the nodes"
    assert survivors == [] and trial_processes(tmp_path) == [], "sshd left running"

    board = leaderboard(spec, results=str(results))
    assert list(board["outcome"]) == ["ok"], board.to_string()
    row = board.iloc[0]
    assert row["nodes"] == 2 and row["dp"] == 2
    assert row["measured_step_s"] > 0 and row["measured_peak_gib"] > 0

    trial = results / "demo-ssh" / "trials" / str(row["trial"])
    result = json.loads((trial / "result.json").read_text())
    assert result["hosts"] == ["127.0.0.2", "127.0.0.3"] and result["exit_codes"] == [0, 0]
    for k in (0, 1):
        script = (trial / f"launch-node-{k}.sh").read_text()
        for flag in ("--nnodes 2", f"--node_rank {k}", "--master_addr 127.0.0.2"):
            assert flag in script
        assert str(REPO / "workloads" / "gpt_deepspeed.py") in script  # ${TUNER_DEMO_ROOT}
        log = (trial / f"node-{k}.log").read_text()
        assert f"tuner-done: iters=4 rank={k}" in log, log[-2000:]
        assert len(re.findall(rf"^tuner-step: iter=\d+ .* rank={k}$", log, re.M)) == 4
    node0 = (trial / "node-0.log").read_text()
    assert re.search(r" world_size \.+ 2$", node0, re.M), "DeepSpeed did not see 2 ranks"
