"""The SSH executor against the executor contract, on real sshd "nodes" at 127.0.0.2-4."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from tuner.launch import Executor, LaunchRequest
from tuner.launch.ssh import SSHExecutor
from tuner.layout import ResultsLayout
from tuner.spec.study import SSHSpec

from .conftest import live_processes, read, wait_for
from .contract import ExecutorContract
from .sshd import LoopbackCluster, _keygen

pytestmark = pytest.mark.ssh


def spec(cluster: LoopbackCluster, **kw: Any) -> SSHSpec:
    base = {"config_file": str(cluster.ssh_config), "known_hosts": str(cluster.known_hosts)}
    return SSHSpec(**{**base, **kw})


class TestSSHExecutor(ExecutorContract):
    @pytest.fixture(autouse=True)
    def _cluster(self, sshd_cluster: LoopbackCluster) -> None:
        self.cluster = sshd_cluster
        self.hosts = sshd_cluster.names[:2]

    def make_executor(self, **kwargs: Any) -> Executor:
        return SSHExecutor(spec(self.cluster), **kwargs)

    def test_master_addr_follows_ssh_config(self) -> None:
        assert SSHExecutor(spec(self.cluster)).master_addr(self.hosts) == "127.0.0.2"


def _one_node_request(layout: ResultsLayout, host: str, n: int = 0) -> LaunchRequest:
    return LaunchRequest(trial=n, hosts=(host,), scripts=("echo hello",), paths=layout.trial(n))


@pytest.fixture
def layout(tmp_path: Path) -> ResultsLayout:
    return ResultsLayout(tmp_path / "results", "ssh")


def test_ssh_config_user_port_and_identity_are_used(sshd_cluster: LoopbackCluster) -> None:
    ex = SSHExecutor(spec(sshd_cluster))
    t = ex.target("node-1")
    assert (t.hostname, t.port, t.user) == (
        "127.0.0.3",
        sshd_cluster.nodes[1].port,
        sshd_cluster.user,
    )
    assert t.key_files == (str(sshd_cluster.client_key),)
    assert (
        SSHExecutor(spec(sshd_cluster, user="alice", port=2222)).target("node-1").user == "alice"
    )


def test_connection_is_reused_across_trials(
    sshd_cluster: LoopbackCluster, layout: ResultsLayout
) -> None:
    with SSHExecutor(spec(sshd_cluster)) as ex:
        assert ex.submit(_one_node_request(layout, "node-0", 0)).wait(30).ok
        first = ex.connection("node-0").transport
        assert ex.submit(_one_node_request(layout, "node-0", 1)).wait(30).ok
        assert ex.connection("node-0").transport is first


def test_node_with_sshd_down_is_a_node_error_and_the_others_do_not_run(
    sshd_cluster: LoopbackCluster, layout: ResultsLayout
) -> None:
    marker = f"tuner-marker-{uuid.uuid4().hex[:8]}"
    script = f"(exec -a {marker} sleep 3005)"
    sshd_cluster.stop_node("node-2")
    try:
        with SSHExecutor(spec(sshd_cluster, connect_timeout_s=5)) as ex:
            request = LaunchRequest(
                trial=0,
                hosts=("node-0", "node-2"),
                scripts=(script, script),
                paths=layout.trial(0),
            )
            result = ex.submit(request).wait(30)
    finally:
        sshd_cluster.start_node("node-2")
    assert [h for h, _ in result.node_errors] == ["node-2"]
    assert "cannot connect" in result.node_errors[0][1]
    assert not result.ok
    assert live_processes(marker) == []


def test_refused_authentication_is_a_node_error(
    sshd_cluster: LoopbackCluster, layout: ResultsLayout, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger_key"
    _keygen(stranger)
    with SSHExecutor(spec(sshd_cluster, key_file=str(stranger))) as ex:
        result = ex.submit(_one_node_request(layout, "node-0")).wait(30)
    assert result.node_errors and "authentication refused" in result.node_errors[0][1]


def test_changed_host_key_is_refused_with_a_clear_reason(
    sshd_cluster: LoopbackCluster, layout: ResultsLayout, tmp_path: Path
) -> None:
    other = tmp_path / "other_host_key"
    _keygen(other)
    node = sshd_cluster.node("node-0")
    key = (tmp_path / "other_host_key.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[{node.address}]:{node.port} {key[0]} {key[1]}\n")
    for accept_new in (False, True):  # accept-new never accepts a *changed* key
        opts = spec(sshd_cluster, known_hosts=str(known), accept_new_host_keys=accept_new)
        with SSHExecutor(opts) as ex:
            result = ex.submit(_one_node_request(layout, "node-0", int(accept_new))).wait(30)
        assert result.node_errors, result
        assert "host key mismatch" in result.node_errors[0][1]
        assert str(known) in result.node_errors[0][1]


def test_unknown_host_key_is_refused_unless_accept_new(
    sshd_cluster: LoopbackCluster, layout: ResultsLayout, tmp_path: Path
) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    with SSHExecutor(spec(sshd_cluster, known_hosts=str(known))) as ex:
        result = ex.submit(_one_node_request(layout, "node-1", 0)).wait(30)
    assert result.node_errors and "unknown host key" in result.node_errors[0][1]
    assert not known.exists()

    opts = spec(sshd_cluster, known_hosts=str(known), accept_new_host_keys=True)
    with SSHExecutor(opts) as ex:
        request = LaunchRequest(
            trial=1, hosts=sshd_cluster.names, scripts=("true",) * 3, paths=layout.trial(1)
        )
        assert ex.submit(request).wait(30).ok
    saved = known.read_text()
    assert all(n.known_hosts_line().split()[2] in saved for n in sshd_cluster.nodes)
    # ... and the saved keys are then trusted without accept-new.
    with SSHExecutor(spec(sshd_cluster, known_hosts=str(known))) as ex:
        assert ex.submit(_one_node_request(layout, "node-1", 2)).wait(30).ok


def _session_processes(listener_pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    return [
        int(p) for p, pp in (line.split() for line in out.splitlines()) if int(pp) == listener_pid
    ]


def test_dropped_connection_is_a_node_error_and_the_trial_is_cleaned_up(
    sshd_cluster: LoopbackCluster, layout: ResultsLayout
) -> None:
    marker = f"tuner-marker-{uuid.uuid4().hex[:8]}"
    script = f"echo up; (exec -a {marker} sleep 3006)"
    with SSHExecutor(spec(sshd_cluster), grace_s=2) as ex:
        request = LaunchRequest(
            trial=0, hosts=("node-0", "node-1"), scripts=(script, script), paths=layout.trial(0)
        )
        job = ex.submit(request)
        wait_for(lambda: len(live_processes(marker)) == 2, what="both sleeps")
        listener = sshd_cluster.node("node-1").process
        assert listener is not None
        for pid in _session_processes(listener.pid):  # the sshd serving our connection
            os.kill(pid, signal.SIGKILL)
        result = job.wait(30)
    assert [h for h, _ in result.node_errors] == ["node-1"]
    assert "connection lost" in result.node_errors[0][1]
    assert "up" in read(result.logs[0])
    # The orphan on the lost node is found and killed when the executor reconnects to sweep.
    wait_for(lambda: live_processes(marker) == [], timeout=10, what="no survivors")


def test_a_trial_folder_the_node_cannot_write_is_a_node_error_naming_it(
    sshd_cluster: LoopbackCluster, layout: ResultsLayout, caplog: pytest.LogCaptureFixture
) -> None:
    """A node whose trial folder cannot be made (not mounted there, read-only, a file in its
    way) was recorded as "RemoteCommandError: node-0: command exited with None: [Errno 2] No
    such file", naming neither the folder nor a command, with an error log line per node."""
    blocker = layout.root / "a-file"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("")
    request = LaunchRequest(trial=0, hosts=("node-0",), scripts=("echo hi",),
                            paths=layout.trial(0), node_dir=str(blocker / "t0"))  # fmt: skip
    with SSHExecutor(spec(sshd_cluster)) as ex:
        result = ex.submit(request).wait(30)
    assert result.node_errors == (
        ("node-0", f"cannot write files into {blocker / 't0'}: No such file"),
    )
    assert result.exit_codes == (None,) and not caplog.records


def test_a_copy_that_cannot_be_renamed_into_place_leaves_no_temporary_file(
    sshd_cluster: LoopbackCluster, tmp_path: Path
) -> None:
    """A failed upload (here: the target is a folder, so the rename fails) removes its ``.tmp``
    copy; the loopback node shares this filesystem, so the folder is read directly."""
    from tuner.launch.ssh import _put_atomic

    target = tmp_path / "launch.sh"
    (target / "inside").mkdir(parents=True)  # a non-empty folder where the file should go
    with SSHExecutor(spec(sshd_cluster)) as ex:
        conn = ex.connection("node-0")
        with conn.lock:
            with pytest.raises(OSError):
                _put_atomic(conn.sftp(), PurePosixPath(target), "echo hi\n", 0o755)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch.sh"]
