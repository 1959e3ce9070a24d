"""tools/loopback_sshd.py as `make demo-ssh` runs it: start and stop from separate processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from .sshd import REPO, sshd_missing_reason

pytestmark = pytest.mark.ssh

TOOL = REPO / "tools" / "loopback_sshd.py"


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=60
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # an exited sshd whose parent (init here) has not reaped it is gone


@pytest.fixture
def nodes_dir(tmp_path: Path) -> Path:
    reason = sshd_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    return tmp_path / "nodes"


def test_start_writes_client_files_and_stop_leaves_nothing(nodes_dir: Path) -> None:
    started = tool("start", "--dir", str(nodes_dir), "--nodes", "2")
    assert started.returncode == 0, started.stderr
    try:
        state = json.loads((nodes_dir / "nodes.json").read_text())
        pids = [n["pid"] for n in state["nodes"]]
        assert [n["address"] for n in state["nodes"]] == ["127.0.0.2", "127.0.0.3"]
        assert all(alive(p) for p in pids)
        # A second start over live nodes is refused rather than doubling them.
        assert tool("start", "--dir", str(nodes_dir)).returncode == 1
        # The client files are all a study needs: the address resolves through ssh_config.
        config = paramiko.SSHConfig.from_path(str(nodes_dir / "ssh_config")).lookup("127.0.0.3")
        client = paramiko.SSHClient()
        client.load_host_keys(str(nodes_dir / "known_hosts"))
        client.connect(
            config["hostname"],
            port=int(config["port"]),
            username=config["user"],
            key_filename=config["identityfile"],
            look_for_keys=False,
            allow_agent=False,
        )
        _, out, _ = client.exec_command("echo $SSH_CONNECTION")
        assert out.read().decode().split()[2:] == ["127.0.0.3", config["port"]]
        client.close()
        # OpenSSH's client as `start` prints it (`try: ssh -F DIR/ssh_config 127.0.0.2 ...`):
        # the config names the nodes' known_hosts ("Host key verification failed" without it)
        ssh = ["ssh", "-F", str(nodes_dir / "ssh_config"), "-o", "BatchMode=yes", "127.0.0.2"]
        done = subprocess.run([*ssh, "echo", "up"], capture_output=True, text=True, timeout=30)
        assert (done.returncode, done.stdout) == (0, "up\n"), done.stderr
    finally:
        stopped = tool("stop", "--dir", str(nodes_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert "none left" in stopped.stdout
    assert not any(alive(p) for p in pids)
    assert not (nodes_dir / "nodes.json").exists()


def test_stop_never_signals_a_recycled_pid(nodes_dir: Path) -> None:
    nodes_dir.mkdir(parents=True)
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        state = {
            "user": "nobody-checks",
            "nodes": [{"name": "node-0", "address": "127.0.0.2", "port": 1, "pid": stranger.pid}],
        }
        (nodes_dir / "nodes.json").write_text(json.dumps(state))
        stopped = tool("stop", "--dir", str(nodes_dir))
        assert stopped.returncode == 0, stopped.stderr
        assert stranger.poll() is None, "stop killed a process that is not its sshd"
        # ... and a stale record does not block the next start either.
        (nodes_dir / "nodes.json").write_text(json.dumps(state))
        started = tool("start", "--dir", str(nodes_dir), "--nodes", "1")
        assert started.returncode == 0, started.stderr
        assert tool("stop", "--dir", str(nodes_dir)).returncode == 0
    finally:
        stranger.kill()
        stranger.wait()
