"""Loopback SSH "nodes" for tests and benchmarks: one real sshd per address 127.0.0.x.

Each node has its own host key and config; one client key is authorised everywhere. The cluster
gets an ssh config (node-k -> 127.0.0.x:port) and a known_hosts file, so the executor is exercised
exactly as it would be on a real cluster.
"""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)


def sshd_missing_reason() -> str | None:
    """Why loopback sshd nodes cannot run here, or None."""
    if SSHD is None:
        return "sshd is not installed (apt-get install openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen is not installed (apt-get install openssh-client)"
    return None


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tuner-test", "-f", str(path)],
        check=True,
    )


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Node:
    """One sshd."""

    name: str
    address: str
    port: int
    dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def host_key(self) -> Path:
        return self.dir / "host_ed25519"

    @property
    def config(self) -> Path:
        return self.dir / "sshd_config"

    def known_hosts_line(self) -> str:
        key = (self.dir / "host_ed25519.pub").read_text().split()[:2]
        return f"[{self.address}]:{self.port} {key[0]} {key[1]}\n"


@dataclass
class LoopbackCluster:
    """sshd on 127.0.0.2, 127.0.0.3, ... under ``base``. Use as a context manager."""

    base: Path
    size: int
    user: str = ""
    """Login user on the nodes (default: the current user)."""
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.user = self.user or getpass.getuser()
        self.client_key = self.base / "id_ed25519"
        self.ssh_config = self.base / "ssh_config"
        self.known_hosts = self.base / "known_hosts"
        for i in range(self.size):
            address = f"127.0.0.{i + 2}"
            node_dir = self.base / f"node-{i}"
            node_dir.mkdir(exist_ok=True)
            self.nodes.append(Node(f"node-{i}", address, _free_port(address), node_dir))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def __enter__(self) -> LoopbackCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
        if not self.client_key.exists():
            _keygen(self.client_key)
        authorized = self.base / "authorized_keys"
        authorized.write_text((self.base / "id_ed25519.pub").read_text())
        for node in self.nodes:
            if not node.host_key.exists():
                _keygen(node.host_key)
            node.config.write_text(self._sshd_config(node, authorized))
        self.write_client_files()
        for node in self.nodes:
            self.start_node(node.name, wait=False)
        for node in self.nodes:
            self._wait_listening(node)

    def _sshd_config(self, node: Node, authorized: Path) -> str:
        return "\n".join(
            [
                f"ListenAddress {node.address}:{node.port}",
                f"HostKey {node.host_key}",
                f"PidFile {node.dir / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "Subsystem sftp internal-sftp",
                "MaxStartups 200:30:400",
                "MaxSessions 200",
                "LogLevel ERROR",
                "",
            ]
        )

    def write_client_files(self) -> None:
        """ssh_config (node-k -> address, port, user, key) and known_hosts."""
        blocks = [
            f"Host {n.name}\n  HostName {n.address}\n  Port {n.port}\n  User {self.user}\n"
            f"  IdentityFile {self.client_key}\n"
            for n in self.nodes
        ]
        self.ssh_config.write_text("".join(blocks))
        self.known_hosts.write_text("".join(n.known_hosts_line() for n in self.nodes))

    def start_node(self, name: str, *, wait: bool = True) -> None:
        node = self.node(name)
        node.process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(node.config)],
            stdout=subprocess.DEVNULL,
            stderr=(node.dir / "sshd.log").open("ab"),
        )
        if wait:
            self._wait_listening(node)

    def stop_node(self, name: str) -> None:
        node = self.node(name)
        if node.process is not None and node.process.poll() is None:
            node.process.terminate()
            node.process.wait(timeout=10)
        node.process = None

    def _wait_listening(self, node: Node, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.process is not None and node.process.poll() is not None:
                log = (node.dir / "sshd.log").read_text()
                raise RuntimeError(f"sshd for {node.name} exited: {log[-2000:]}")
            try:
                with socket.create_connection((node.address, node.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"sshd for {node.name} not listening on {node.address}:{node.port}")

    def stop(self) -> None:
        for node in self.nodes:
            self.stop_node(node.name)
