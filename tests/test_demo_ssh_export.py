"""The SSH demo's exported full run, started as a user would: ``tune best``'s launch script run
over SSH on two loopback sshd nodes (127.0.0.2 and 127.0.0.3), each with its NODE_RANK; the
script finds the master address itself (the study's first SSH node) and DeepSpeed trains the
demo's GPT for 2 iterations over gloo, 1 CPU rank per node."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.report.test_exports import free_port, record_measured

REPO = Path(__file__).resolve().parents[1]
DEMO_SSH = REPO / "tuner" / "studies" / "demo-ssh.yaml"
if str(REPO) not in sys.path:  # tools/ is not part of the installed package
    sys.path.insert(0, str(REPO))

from tools.loopback_sshd import LoopbackCluster, sshd_missing_reason  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.ssh
def test_the_ssh_demos_best_script_runs_on_both_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = sshd_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("deepspeed", reason="the demo runs DeepSpeed: needs the train extra")
    from tuner.report.export import trial_record
    from tuner.space.enumerate import enumerate_space
    from tuner.spec.file import load_study

    cluster = LoopbackCluster(tmp_path / "nodes", 2)
    monkeypatch.setenv("TUNER_DEMO_ROOT", str(REPO))
    monkeypatch.setenv("TUNER_DEMO_SSH", str(cluster.base))
    raw = yaml.safe_load(DEMO_SSH.read_text())
    raw["launch"].update(python=sys.executable, master_port=free_port())
    study = tmp_path / "demo-ssh.yaml"
    study.write_text(yaml.safe_dump(raw))
    spec = load_study(str(study))
    best = enumerate_space(spec).ranked()[0].config
    record_measured(spec, tmp_path / "results", [(best, 0.5)])
    record = trial_record(spec, results=str(tmp_path / "results"))
    assert record.hosts == ("127.0.0.2", "127.0.0.3")
    script = record.export("script", train_iters=2).path
    text = script.read_text()
    assert '--master_addr "${MASTER_ADDR}"' in text and "--master_addr 127.0.0.2" not in text

    # the nodes build DeepSpeed's CPU ops where this process would (ssh passes no environment)
    cache = os.environ.get("TORCH_EXTENSIONS_DIR")
    prefix = f"TORCH_EXTENSIONS_DIR={shlex.quote(cache)} " if cache else ""
    cluster.start()
    try:
        nodes = [
            subprocess.Popen(
                [
                    "ssh",
                    "-F",
                    str(cluster.ssh_config),
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    f"UserKnownHostsFile={cluster.known_hosts}",
                    address,
                    f"cd {shlex.quote(str(tmp_path))} && {prefix}NODE_RANK={k} bash "
                    f"{shlex.quote(str(script))}",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
            for k, address in enumerate(cluster.addresses)
        ]
        logs = [node.communicate(timeout=540)[0] for node in nodes]
    finally:
        survivors = cluster.stop()
    assert survivors == [], "sshd left running"
    for k, (node, log) in enumerate(zip(nodes, logs, strict=True)):
        assert node.returncode == 0, log[-4000:]
        assert f"tuner: node {k} of 2, master 127.0.0.2" in log, log[-4000:]
        assert f"tuner-done: iters=2 rank={k}" in log, log[-4000:]
    assert re.search(r" world_size \.+ 2$", logs[0], re.M), "DeepSpeed did not see 2 ranks"
