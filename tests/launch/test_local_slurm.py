"""tools/local_slurm.py: the throw-away Slurm starts, runs a 2-node job, and stop leaves nothing
of it, but nothing else either (a process that only names its directory is not its process)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from .conftest import live_processes, wait_for
from .slurm import LocalSlurm, slurm_missing_reason

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def test_start_run_stop_leaves_nothing_but_bystanders(tmp_path: Path) -> None:
    reason = slurm_missing_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)
    cluster = LocalSlurm(tmp_path / "slurm", 2)
    marker = f"tuner-marker-{uuid.uuid4().hex[:8]}"
    bystander = subprocess.Popen(["bash", "-c", f"exec -a '{marker} {cluster.dir}' sleep 300"])
    try:
        cluster.start()
        done = subprocess.run(
            ["sbatch", "--parsable", "-N2", "--output=/dev/null", "--wrap",
             f"srun bash -c 'exec -a {marker}-job sleep 300'"],
            env=cluster.env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert done.stdout.strip().isdigit()
        wait_for(
            lambda: len(live_processes(f"{marker}-job 300")) == 2, what="the job on both nodes"
        )
        started = time.monotonic()
        survivors = cluster.stop()
        assert survivors == [] and time.monotonic() - started < 30
        assert live_processes(f"{marker}-job") == []
        assert bystander.poll() is None, "stop killed a process that only names the directory"
    finally:
        cluster.stop()
        bystander.kill()
        bystander.wait()
    assert all(str(cluster.dir) not in line for line in live_processes("slurm"))


def test_stop_without_a_cluster_is_a_no_op(tmp_path: Path) -> None:
    from tools.local_slurm import main

    assert main(["stop", "--dir", str(tmp_path)]) == 0


def test_ports_lie_below_the_ephemeral_range_and_differ(tmp_path: Path) -> None:
    from tools.local_slurm import _ephemeral_low

    conf = LocalSlurm(tmp_path / "slurm", 4)._slurm_conf()
    ports = [
        int(w.split("=")[1]) for w in conf.split() if w.startswith(("Port=", "SlurmctldPort="))
    ]
    assert len(ports) == 5 and len(set(ports)) == 5
    assert all(10000 <= p < _ephemeral_low() for p in ports)


def test_a_slurmd_that_cannot_bind_its_port_fails_the_start_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = slurm_missing_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)
    cluster = LocalSlurm(tmp_path / "slurm", 2)
    held = socket.socket()
    write_conf = cluster._slurm_conf

    def conf_with_n2_port_taken() -> str:
        # What a port taken between writing slurm.conf and slurmd's bind looks like.
        text = write_conf()
        n2 = next(line for line in text.splitlines() if line.startswith("NodeName=n2 "))
        port = int(n2.split("Port=")[1].split()[0])
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("0.0.0.0", port))
        held.listen()
        return text

    monkeypatch.setattr(cluster, "_slurm_conf", conf_with_n2_port_taken)
    try:
        with pytest.raises(RuntimeError, match=r"slurmd-n2's pid file; slurmd-n2\.log ends: .*"):
            cluster.start(timeout_s=10.0)
    finally:
        held.close()
    assert cluster.stop() == []  # start() stopped what it had started
    assert all(str(cluster.dir) not in line for line in live_processes("slurm"))
