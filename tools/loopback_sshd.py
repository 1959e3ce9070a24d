"""Loopback SSH "nodes": one real sshd per address 127.0.0.2, 127.0.0.3, ... on this machine.

    python tools/loopback_sshd.py start --dir DIR [--nodes 2] [--port N] [--user NAME]
    python tools/loopback_sshd.py stop --dir DIR

``start`` gives every node its own host key and sshd_config under ``DIR/node-<k>/``, makes one
fresh client key (``DIR/id_ed25519``) authorised on every node, and writes the client side a study
points at: ``DIR/ssh_config`` (``Host node-<k> 127.0.0.<k+2>`` -> address, port, user, key, the
known_hosts) and ``DIR/known_hosts``. The sshd processes run in their own sessions (a Ctrl-C in
the terminal does not take them down while tune still needs them to clean up its trials); their
pids go to ``DIR/nodes.json``. ``--port 0`` (the default) picks a free port per address.

``stop`` ends every recorded sshd and whatever still runs under it (its per-connection session
processes and their children), SIGTERM then SIGKILL, and verifies they are gone: it exits 1 naming
any survivor. A pid is only signalled while its command line still names this DIR's sshd_config,
so a recycled pid is never hit.

The nodes share this machine's filesystem and process table, like the nodes of a cluster with a
shared filesystem. Works as root (``/run/sshd``, sshd's privilege-separation directory, is created)
and as a normal user, who can then only log in as themself. The login user needs a real shell and
an account that is not locked (sshd runs with ``UsePAM no``, and then refuses locked accounts).

The tests and benchmarks import :class:`LoopbackCluster` from here, so this is the one place that
knows how to set up loopback sshd nodes.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
STATE_FILE = "nodes.json"
_NO_LOGIN_SHELLS = {"nologin", "false"}


def sshd_missing_reason() -> str | None:
    """Why loopback sshd nodes cannot run here, or None."""
    if SSHD is None:
        return "sshd is not installed (apt-get install openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen is not installed (apt-get install openssh-client)"
    return None


def login_problem(user: str) -> str | None:
    """Why sshd (with ``UsePAM no``) would refuse ``user`` a command, or None."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return f"no such user {user!r}"
    shell = entry.pw_shell or "/bin/sh"
    if Path(shell).name in _NO_LOGIN_SHELLS or not os.access(shell, os.X_OK):
        return f"user {user!r} has no login shell ({shell}); sshd runs every command through it"
    try:
        shadow = Path("/etc/shadow").read_text().splitlines()
    except OSError:  # not root: sshd cannot read it either, and does not check
        return None
    for line in shadow:
        name, _, rest = line.partition(":")
        if name == user and rest.startswith("!"):
            return (
                f"the account {user!r} is locked ('!' password in /etc/shadow), which sshd "
                f"refuses without PAM; unlock it for key logins with: usermod -p '*' {user}"
            )
    return None


def keygen(path: Path, comment: str = "tuner-loopback") -> None:
    """A new passwordless ed25519 key pair at ``path`` and ``path.pub``."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )


def free_port(address: str) -> int:
    """A TCP port nothing listens on at ``address`` right now."""
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
    pid: int | None = None
    """The listener's pid (also known when another process started it: from nodes.json)."""

    @property
    def host_key(self) -> Path:
        return self.dir / "host_ed25519"

    @property
    def config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"

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
    port: int = 0
    """The port every node listens on (each on its own address); 0: a free port per node."""
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.size <= 250:
            raise ValueError(f"between 1 and 250 nodes (127.0.0.2-251), not {self.size}")
        self.base = self.base.absolute()  # written into configs that other processes read
        self.base.mkdir(parents=True, exist_ok=True)
        self.user = self.user or getpass.getuser()
        self.client_key = self.base / "id_ed25519"
        self.ssh_config = self.base / "ssh_config"
        self.known_hosts = self.base / "known_hosts"
        self.state_file = self.base / STATE_FILE
        for i in range(self.size):
            address = f"127.0.0.{i + 2}"
            node_dir = self.base / f"node-{i}"
            node_dir.mkdir(exist_ok=True)
            self.nodes.append(Node(f"node-{i}", address, self.port, node_dir))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(n.address for n in self.nodes)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if name in (n.name, n.address))

    def __enter__(self) -> LoopbackCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Keys, configs, client files; start every sshd and wait until each one listens."""
        problem = login_problem(self.user)
        if problem is not None:
            raise RuntimeError(problem)
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation
        for node in self.nodes:
            node.port = node.port or free_port(node.address)
        # A fresh client key each start; host keys stay, like a real node's identity.
        for old in (self.client_key, self.client_key.with_suffix(".pub")):
            old.unlink(missing_ok=True)
        keygen(self.client_key)
        authorized = self.base / "authorized_keys"
        authorized.write_text((self.base / "id_ed25519.pub").read_text())
        for node in self.nodes:
            if not node.host_key.exists():
                keygen(node.host_key, f"tuner-loopback-{node.name}")
            node.config.write_text(self._sshd_config(node, authorized))
        self.write_client_files()
        try:
            for node in self.nodes:
                self.start_node(node.name, wait=False)
            for node in self.nodes:
                self._wait_listening(node)
        except BaseException:
            self.stop()
            raise
        self.save_state()

    def _sshd_config(self, node: Node, authorized: Path) -> str:
        return "\n".join(
            [
                f"ListenAddress {node.address}:{node.port}",
                f"HostKey {node.host_key}",
                f"PidFile {node.dir / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                f"AllowUsers {self.user}",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "Subsystem sftp internal-sftp",
                "MaxStartups 200:30:400",
                "MaxSessions 200",
                # The nodes log in as a real user with their dotfiles. A shell start-up that runs
                # `pyenv rehash` and is killed mid-way (a cancel test ending a session) leaves
                # pyenv's lock behind, and every later login would wait 60 s on it
                # (PYENV_REHASH_TIMEOUT, libexec/pyenv-rehash). 0: one try, given up within the
                # second (2 cost every login 2-3 s once the lock was stale, half the SSH tests'
                # time); a login that skips the rehash still finds the shims there.
                "SetEnv PYENV_REHASH_TIMEOUT=0",
                "LogLevel ERROR",
                "",
            ]
        )

    def write_client_files(self) -> None:
        """ssh_config (node-k and its address -> address, port, user, key, host keys) and
        known_hosts. The config names the known_hosts too, so that the ``ssh -F DIR/ssh_config
        127.0.0.2 hostname`` ``start`` suggests finds the nodes' keys (OpenSSH's own
        ``~/.ssh/known_hosts`` has none of them: it answered "Host key verification failed")."""
        blocks = [
            f"Host {n.name} {n.address}\n  HostName {n.address}\n  Port {n.port}\n"
            f"  User {self.user}\n  IdentityFile {self.client_key}\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
            for n in self.nodes
        ]
        self.ssh_config.write_text("".join(blocks))
        self.known_hosts.write_text("".join(n.known_hosts_line() for n in self.nodes))

    def save_state(self) -> None:
        """Record the nodes and their sshd pids in ``nodes.json`` (what ``stop`` reads)."""
        state = {
            "user": self.user,
            "nodes": [
                {"name": n.name, "address": n.address, "port": n.port, "pid": n.pid}
                for n in self.nodes
            ],
        }
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def from_state(cls, base: Path) -> LoopbackCluster:
        """The cluster ``start`` recorded under ``base`` (to stop it from another process)."""
        state = json.loads((base / STATE_FILE).read_text())
        cluster = cls(base, len(state["nodes"]), user=state["user"])
        for node, saved in zip(cluster.nodes, state["nodes"], strict=True):
            node.port, node.pid = int(saved["port"]), saved["pid"]
        return cluster

    def running(self) -> list[str]:
        """The names of the nodes whose recorded sshd is still alive."""
        return [
            n.name
            for n in self.nodes
            if n.pid is not None and _alive([n.pid]) and str(n.config) in _cmdline(n.pid)
        ]

    def start_node(self, name: str, *, wait: bool = True) -> None:
        node = self.node(name)
        with node.log.open("ab") as log:
            node.process = subprocess.Popen(
                [str(SSHD), "-D", "-e", "-f", str(node.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        node.pid = node.process.pid
        if wait:
            self._wait_listening(node)

    def stop_node(self, name: str) -> list[str]:
        """End node ``name``'s sshd and everything under it; the survivors (empty when clean)."""
        node = self.node(name)
        survivors: list[str] = []
        if node.pid is not None:
            survivors = end_tree(node.pid, str(node.config), reap=node.process)
        node.process, node.pid = None, None
        return survivors

    def _wait_listening(self, node: Node, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.process is not None and node.process.poll() is not None:
                raise RuntimeError(f"sshd for {node.name} exited: {node.log.read_text()[-2000:]}")
            try:
                with socket.create_connection((node.address, node.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"sshd for {node.name} not listening on {node.address}:{node.port}")

    def stop(self) -> list[str]:
        """End every node's sshd (and what runs under it); the survivors (empty when clean)."""
        survivors = [s for node in self.nodes for s in self.stop_node(node.name)]
        if self.state_file.exists():
            self.state_file.unlink()
        return survivors


# ----------------------------------------------------------------------------- processes


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process, from /proc."""
    table: dict[int, tuple[int, str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
        table[int(stat.parent.name)] = (int(fields[1]), fields[0])
    return table


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (an sshd's per-connection sessions and their children)."""
    table = _proc_table()
    return [p for p in _descendants(pid, table) if table[p][1] != "Z"]


def _descendants(pid: int, table: dict[int, tuple[int, str]]) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, (pp, _) in table.items() if pp == parent]
        found += children
        frontier += children
    return found


def _alive(pids: list[int]) -> list[int]:
    table = _proc_table()
    return [p for p in pids if p in table and table[p][1] != "Z"]


def end_tree(
    pid: int, marker: str, *, grace_s: float = 5.0, reap: subprocess.Popen[bytes] | None = None
) -> list[str]:
    """SIGTERM ``pid`` and its descendants, SIGKILL after ``grace_s``; returns the survivors.

    ``pid`` is only touched while its command line contains ``marker`` (its sshd_config path):
    a pid recorded earlier may belong to another process by now. ``reap`` is the Popen of ``pid``
    when this process is its parent (the exit status is collected, so no zombie is left).
    """
    if marker not in _cmdline(pid):
        if reap is not None:
            reap.poll()
        return []
    pids = [pid, *_descendants(pid, _proc_table())]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for p in _alive(pids):
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if reap is not None:
                reap.poll()
            if not _alive(pids):
                return []
            time.sleep(0.05)
    return [f"{p} {_cmdline(p)}" for p in _alive(pids)]


# ----------------------------------------------------------------------------- command line


def _start(args: argparse.Namespace) -> int:
    reason = sshd_missing_reason()
    if reason is not None:
        print(f"loopback_sshd: {reason}", file=sys.stderr)
        return 2
    base = Path(args.dir)
    if (base / STATE_FILE).exists() and LoopbackCluster.from_state(base).running():
        print(f"loopback_sshd: nodes in {base} are running; stop them first", file=sys.stderr)
        return 1
    cluster = LoopbackCluster(base, args.nodes, user=args.user, port=args.port)
    try:
        cluster.start()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        print(f"loopback_sshd: {exc}", file=sys.stderr)
        return 1
    for node in cluster.nodes:
        print(f"{node.name}: sshd on {node.address}:{node.port} (pid {node.pid})")
    print(f"try: ssh -F {cluster.ssh_config} {cluster.nodes[0].address} hostname")
    return 0


def _stop(args: argparse.Namespace) -> int:
    base = Path(args.dir)
    if not (base / STATE_FILE).exists():
        print(f"loopback_sshd: nothing recorded in {base / STATE_FILE}; nothing to stop")
        return 0
    cluster = LoopbackCluster.from_state(base)
    survivors = cluster.stop()
    if survivors:
        print("loopback_sshd: still running after SIGKILL:", file=sys.stderr)
        for line in survivors:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"stopped {len(cluster.nodes)} sshd (none left)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``start`` or ``stop`` loopback sshd nodes; the exit status says whether it worked."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start sshd nodes and write the client files")
    start.add_argument("--dir", required=True, help="where keys, configs and pids go")
    start.add_argument("--nodes", type=int, default=2, help="how many (127.0.0.2, .3, ...)")
    start.add_argument("--port", type=int, default=0, help="one port for all; 0: free ports")
    start.add_argument("--user", default="", help="login user (default: you)")
    stop = sub.add_parser("stop", help="stop the nodes started in --dir and verify they are gone")
    stop.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    return _start(args) if args.command == "start" else _stop(args)


if __name__ == "__main__":
    raise SystemExit(main())
