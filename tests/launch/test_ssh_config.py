"""SSH as users configure it: Host aliases, port precedence, ProxyJump, ProxyCommand, the agent,
UserKnownHostsFile, and one quiet line for a host that does not speak SSH.

The resolver tests need no sshd; the others use the session's loopback sshd nodes (127.0.0.2-4)
through an ssh config written per test, the way a user's ``~/.ssh/config`` would name them.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tuner.errors import ConfigError, NodeError
from tuner.launch.ssh import SSHExecutor
from tuner.launch.sshconfig import SSHResolver, parse_hop
from tuner.spec.study import SSHSpec

from .conftest import live_processes
from .sshd import LoopbackCluster, descendants

# ----------------------------------------------------------------------------- no sshd needed


def resolver(tmp_path: Path, config: str, **spec: Any) -> SSHResolver:
    path = tmp_path / "ssh_config"
    path.write_text(config)
    return SSHResolver(SSHSpec(config_file=str(path), **spec))


PRECEDENCE_CONFIG = """\
Host gpu-a
  HostName 10.0.0.1
  Port 2201
  User bob
  IdentityFile ~/.ssh/gpu_key
Host gpu-b
  HostName 10.0.0.2
Host bastion
  HostName 10.0.0.254
  Port 2022
  User jumper
"""


def test_a_bracketed_ipv6_node_is_reached_at_its_address(tmp_path: Path) -> None:
    """``cluster.nodes: ["[::1]"]`` loads (the docs' own example is ``[fe80::1]``), but the
    brackets went into the connection and the rendezvous: "cannot connect to root@[::1]:22:
    Name or service not known" at every preflight."""
    nodes = resolver(tmp_path, "Host v6\n  HostName [fd00::7]\n")
    assert nodes.node("[::1]").hostname == "::1"
    assert nodes.node("v6").hostname == "fd00::7"
    assert nodes.node("::1").hostname == "::1" and nodes.node("gpu-a").hostname == "gpu-a"


def test_a_hosts_own_port_wins_over_the_study_port_which_wins_over_22(tmp_path: Path) -> None:
    with_default = resolver(tmp_path, PRECEDENCE_CONFIG, port=2222)
    assert with_default.node("gpu-a").port == 2201  # the host's Port
    assert with_default.node("gpu-b").port == 2222  # no Port for it: the study's default
    assert with_default.node("elsewhere").port == 2222
    assert resolver(tmp_path, PRECEDENCE_CONFIG).node("gpu-b").port == 22


def test_the_study_user_and_key_win_over_the_config(tmp_path: Path) -> None:
    plain = resolver(tmp_path, PRECEDENCE_CONFIG)
    a = plain.node("gpu-a")
    assert (a.hostname, a.user) == ("10.0.0.1", "bob")
    assert a.key_files == (os.path.expanduser("~/.ssh/gpu_key"),) and not a.look_for_keys
    ours = resolver(tmp_path, PRECEDENCE_CONFIG, user="alice", key_file="/keys/k").node("gpu-a")
    assert (ours.user, ours.key_files, ours.port) == ("alice", ("/keys/k",), 2201)


def test_jump_hops_take_their_own_config_and_what_the_hop_says(tmp_path: Path) -> None:
    r = resolver(tmp_path, PRECEDENCE_CONFIG, user="alice", port=2222)
    hop = r.hop("bastion")
    assert (hop.hostname, hop.port, hop.user) == ("10.0.0.254", 2022, "jumper")
    written = r.hop("carol@bastion:2300", via=("first",))
    assert (written.user, written.port, written.jump) == ("carol", 2300, ("first",))
    assert r.hop("gpu-b").user == "alice"  # no User for it: the study's user is the fallback


def test_proxyjump_and_proxycommand_first_one_given_counts(tmp_path: Path) -> None:
    config = """\
Host two-hops
  ProxyJump a, b:2022
  ProxyCommand never used
Host by-command
  ProxyCommand ssh -W %h:%p gate
  ProxyJump never-used
Host no-jump
  ProxyJump none
Host *
  ProxyJump default-gate
"""
    r = resolver(tmp_path, config)
    assert r.node("two-hops").jump == ("a", "b:2022") and r.node("two-hops").proxy_command is None
    t = r.node("by-command")
    assert t.jump == () and t.proxy_command == "ssh -W by-command:22 gate"
    assert r.node("no-jump").jump == ()
    assert r.node("other").jump == ("default-gate",)


def test_parse_hop() -> None:
    assert parse_hop("bastion") == (None, "bastion", None)
    assert parse_hop("me@bastion:2022") == ("me", "bastion", 2022)
    assert parse_hop("ssh://me@[fe80::1]:22") == ("me", "fe80::1", 22)
    assert parse_hop("fe80::1") == (None, "fe80::1", None)
    with pytest.raises(ConfigError, match="bad ProxyJump hop"):
        parse_hop("me@host:port")


def test_identities_only_turns_the_agent_off(tmp_path: Path) -> None:
    config = "Host strict\n  IdentitiesOnly yes\nHost noagent\n  IdentityAgent none\n"
    r = resolver(tmp_path, config)
    assert not r.node("strict").agent and not r.node("noagent").agent and r.node("x").agent


def test_a_named_config_file_must_exist_the_default_may_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="cluster.ssh.config_file.*no such ssh config"):
        SSHResolver(SSHSpec(config_file=str(tmp_path / "typo")))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert SSHResolver(SSHSpec()).config is None  # no ~/.ssh/config: nothing to honour


def test_known_hosts_from_the_study_then_the_config(tmp_path: Path) -> None:
    config = "Host *\n  UserKnownHostsFile /cfg/known_hosts /cfg/other\n"
    assert resolver(tmp_path, config).node("x").known_hosts == Path("/cfg/known_hosts")
    mine = resolver(tmp_path, config, known_hosts="/mine").node("x")
    assert mine.known_hosts == Path("/mine")


# ----------------------------------------------------------------------------- real sshd


def write_config(cluster: LoopbackCluster, path: Path, extra: str = "") -> Path:
    """Aliases a user would write: node-k by name only, reached at its address and port."""
    blocks = [f"Host {n.name}\n  HostName {n.address}\n  Port {n.port}\n" for n in cluster.nodes]
    common = (
        f"Host *\n  User {cluster.user}\n  IdentityFile {cluster.client_key}\n"
        f"  UserKnownHostsFile {cluster.known_hosts}\n"
    )
    path.write_text(extra + "".join(blocks) + common)
    return path


def ssh_connection(ex: SSHExecutor, host: str) -> list[str]:
    """``$SSH_CONNECTION`` on ``host``: client address and port, server address and port."""
    code, out, err = ex.run(host, "echo $SSH_CONNECTION")
    assert code == 0, err
    return out.split()


def _hex_ip(address: str) -> str:
    return "".join(f"{int(part):02X}" for part in reversed(address.split(".")))


def socket_owners(local: tuple[str, int], remote: tuple[str, int]) -> set[int]:
    """The pids holding the established TCP connection ``local`` -> ``remote``."""
    want = (f"{_hex_ip(local[0])}:{local[1]:04X}", f"{_hex_ip(remote[0])}:{remote[1]:04X}")
    inodes = {
        f[9]
        for f in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
        if (f[1], f[2]) == want and f[3] == "01"
    }
    owners: set[int] = set()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            owners.add(int(fd.parts[2]))
    return owners


def came_through(
    cluster: LoopbackCluster, ex: SSHExecutor, host: str, jump: str
) -> tuple[set[int], list[int]]:
    """(owners of the socket ``host``'s sshd sees as its client, the jump host sshd's pids)."""
    client, client_port, server, server_port = ssh_connection(ex, host)
    owners = socket_owners((client, int(client_port)), (server, int(server_port)))
    listener = cluster.node(jump).pid
    assert listener is not None
    return owners, descendants(listener)


@pytest.mark.ssh
def test_a_host_alias_leads_to_its_address_and_port(
    sshd_cluster: LoopbackCluster, tmp_path: Path
) -> None:
    config = write_config(sshd_cluster, tmp_path / "config", "Host gpu-a\n  HostName 127.0.0.2\n")
    node = sshd_cluster.node("node-0")
    config.write_text(config.read_text().replace("Host node-0\n", "Host node-0 gpu-a\n", 1))
    # known_hosts is left at its default: the config's UserKnownHostsFile is the one used
    with SSHExecutor(SSHSpec(config_file=str(config))) as ex:
        assert ssh_connection(ex, "gpu-a")[2:] == ["127.0.0.2", str(node.port)]
        assert ex.master_addr(["gpu-a"]) == "127.0.0.2"


@pytest.mark.ssh
def test_a_study_port_does_not_override_the_hosts_port(
    sshd_cluster: LoopbackCluster, tmp_path: Path
) -> None:
    """The defect: cluster.ssh.port replaced every host's Port, so no node could be reached."""
    config = write_config(sshd_cluster, tmp_path / "config")
    with SSHExecutor(SSHSpec(config_file=str(config), port=1, connect_timeout_s=5)) as ex:
        for node in sshd_cluster.nodes[:2]:
            assert ssh_connection(ex, node.name)[2:] == [node.address, str(node.port)]
        # A name the config has no Port for gets the study's port (1: nothing listens there).
        with pytest.raises(NodeError, match=r"cannot connect to .*@127\.0\.0\.2:1:"):
            ex.run("127.0.0.2", "true")


@pytest.mark.ssh
def test_proxyjump_goes_through_the_jump_hosts_sshd(
    sshd_cluster: LoopbackCluster, tmp_path: Path
) -> None:
    target = sshd_cluster.node("node-2")
    extra = (
        f"Host behind\n  HostName {target.address}\n  Port {target.port}\n  ProxyJump node-1\n"
        f"Host behind-two\n  HostName {target.address}\n  Port {target.port}\n"
        "  ProxyJump node-0,node-1\n"
    )
    config = write_config(sshd_cluster, tmp_path / "config", extra)
    with SSHExecutor(SSHSpec(config_file=str(config))) as ex:
        direct, _ = came_through(sshd_cluster, ex, "node-2", "node-1")
        assert direct == {os.getpid()}  # the control: a direct session's client socket is ours
        for name in ("behind", "behind-two"):
            owners, jump_sshd = came_through(sshd_cluster, ex, name, "node-1")
            # The target's client is a socket of node-1's sshd (its direct-tcpip forward), not
            # of this process: the session really went through the jump host.
            assert owners and owners <= set(jump_sshd), (owners, jump_sshd)
            assert os.getpid() not in owners
        # Two hops: node-1 itself was reached through node-0's sshd.
        hop = sshd_cluster.node("node-1")
        jump_conn = ex._conns[("jump", "node-1", "node-0")]
        code, out, _ = _run_on(jump_conn.transport, "echo $SSH_CONNECTION")
        assert code == 0
        c, cp, s, sp = out.split()
        assert (s, int(sp)) == (hop.address, hop.port)
        node0 = sshd_cluster.node("node-0").pid
        assert node0 is not None
        assert socket_owners((c, int(cp)), (s, int(sp))) <= set(descendants(node0))


def _run_on(transport: Any, command: str) -> tuple[int, str, str]:
    chan = transport.open_session()
    chan.exec_command(command)
    out = chan.makefile("rb").read().decode()
    err = chan.makefile_stderr("rb").read().decode()
    return chan.recv_exit_status(), out, err


@pytest.mark.ssh
def test_proxycommand_carries_the_session(sshd_cluster: LoopbackCluster, tmp_path: Path) -> None:
    target = sshd_cluster.node("node-2")
    config_path = tmp_path / "config"
    extra = (
        f"Host by-command\n  HostName {target.address}\n  Port {target.port}\n"
        f"  ProxyCommand ssh -F {config_path} -o BatchMode=yes -W %h:%p node-1\n"
    )
    config = write_config(sshd_cluster, config_path, extra)
    with SSHExecutor(SSHSpec(config_file=str(config))) as ex:
        owners, jump_sshd = came_through(sshd_cluster, ex, "by-command", "node-1")
        assert owners and owners <= set(jump_sshd)
        assert len(live_processes(f"-W {target.address}")) == 1
    assert live_processes(f"-W {target.address}") == []  # closing ends the proxy command


@pytest.mark.ssh
def test_a_jump_host_that_is_down_names_the_node_and_the_jump(
    sshd_cluster: LoopbackCluster, tmp_path: Path
) -> None:
    extra = "Host behind\n  HostName 127.0.0.4\n  ProxyJump nobody@127.0.0.9:1\n"
    config = write_config(sshd_cluster, tmp_path / "config", extra)
    with (
        SSHExecutor(SSHSpec(config_file=str(config), connect_timeout_s=5)) as ex,
        pytest.raises(NodeError) as caught,
    ):
        ex.run("behind", "true")
    assert caught.value.host == "behind"
    assert "through jump host nobody@127.0.0.9:1: cannot connect" in caught.value.reason


@pytest.fixture
def agent(sshd_cluster: LoopbackCluster, tmp_path: Path) -> Iterator[Path]:
    """A real ssh-agent holding the cluster's client key; its socket is SSH_AUTH_SOCK."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(sshd_cluster.client_key)], env=env, check=True)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.ssh
def test_agent_keys_are_used_unless_identities_only(
    sshd_cluster: LoopbackCluster, agent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent))
    node = sshd_cluster.node("node-0")
    block = (
        f"  HostName {node.address}\n  Port {node.port}\n  User {sshd_cluster.user}\n"
        f"  UserKnownHostsFile {sshd_cluster.known_hosts}\n"
    )
    config = tmp_path / "config"  # no IdentityFile: only the agent holds the key
    config.write_text(f"Host by-agent\n{block}Host strict\n  IdentitiesOnly yes\n{block}")
    with SSHExecutor(SSHSpec(config_file=str(config))) as ex:
        assert ex.run("by-agent", "echo agent")[1].strip() == "agent"
        with pytest.raises(NodeError, match="authentication refused"):
            ex.run("strict", "true")


# ----------------------------------------------------------------------------- quiet failures


@pytest.fixture
def not_ssh() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts TCP, writes something that is not SSH, and hangs up."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    server.close()


def test_a_port_that_does_not_speak_ssh_is_one_quiet_line(
    not_ssh: int, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The defect: paramiko's transport thread logged a 30-line traceback for such a host."""
    logging.getLogger("paramiko").setLevel(logging.NOTSET)  # as in a fresh `tune` process
    caplog.set_level(logging.DEBUG)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    errors: list[NodeError] = []
    for port in (not_ssh, closed.getsockname()[1]):
        with SSHExecutor(SSHSpec(config_file="", port=port, connect_timeout_s=2)) as ex:
            with pytest.raises(NodeError) as caught:
                ex.run("127.0.0.1", "true")
            errors.append(caught.value)
    closed.close()
    time.sleep(0.3)  # the transport thread logs as it dies, after connect() has returned
    assert "no SSH server there" in errors[0].reason
    assert errors[1].reason.endswith(": Connection refused")
    assert all(e.host == "127.0.0.1" and "\n" not in str(e) for e in errors)
    assert not [r for r in caplog.records if r.name.startswith("paramiko")]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "paramiko" not in err


def test_a_failing_proxycommand_is_explained_and_leaves_nothing_running(tmp_path: Path) -> None:
    marker = "sleep 3008"
    config = tmp_path / "config"
    config.write_text(
        "Host says-why\n  ProxyCommand sh -c 'echo \"bastion: No route to host\" >&2; exit 255'\n"
        f"Host hangs\n  ProxyCommand sh -c '{marker}; echo never'\n"
    )
    with SSHExecutor(SSHSpec(config_file=str(config), connect_timeout_s=1)) as ex:
        with pytest.raises(NodeError) as said:
            ex.run("says-why", "true")
        with pytest.raises(NodeError) as hung:
            ex.run("hangs", "true")
    assert said.value.reason.endswith(
        "ProxyCommand exited with status 255: bastion: No route to host"
    )
    assert "no SSH server there" in hung.value.reason
    assert live_processes(marker) == []  # the shell's child went with the shell's session


def test_a_proxyjump_loop_is_refused_not_waited_on(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host a\n  ProxyJump b\nHost b\n  ProxyJump a\nHost c\n  ProxyJump c\n")
    errors: dict[str, str] = {}

    def connect(host: str) -> None:
        with SSHExecutor(SSHSpec(config_file=str(config), connect_timeout_s=1)) as ex:
            try:
                ex.run(host, "true")
            except NodeError as exc:
                errors[host] = exc.reason

    threads = [threading.Thread(target=connect, args=(h,), daemon=True) for h in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads), "deadlocked on a ProxyJump loop"
    assert errors == {
        "a": "ProxyJump loop: a -> b -> a -> b",
        "b": "ProxyJump loop: b -> a -> b -> a",
        "c": "ProxyJump loop: c -> c -> c",
    }
