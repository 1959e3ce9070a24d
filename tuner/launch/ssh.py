"""Run each node's script over SSH (paramiko), one cached connection per node.

On a node, a trial's script runs as::

    cd <trial dir> && setsid -w env TUNER_TRIAL_TOKEN=<token> ... bash -c 'echo $$ >pidfile; ...'

so it leads its own process group (recorded in the pid file) and every process it starts carries
the token. Cancelling opens a second channel and runs :data:`~tuner.launch.base.PROCESS_SCRIPT`
there, one command per node: SIGTERM to every process of the trial, SIGKILL after the grace
period, then a scan that must come back empty. Files travel over SFTP and are renamed into place,
so a loopback "node" sharing this machine's filesystem never sees a half-written file.

Node names go through the OpenSSH client config (aliases, ``ProxyJump``, ``ProxyCommand``; see
:mod:`tuner.launch.sshconfig` for which setting wins; :mod:`tuner.launch.sshtransport` makes the
connection). Host keys are checked against
``known_hosts`` (unknown keys are refused unless ``accept_new_host_keys``, which records them; a
changed key is always refused). Anything that goes wrong with reaching a node becomes one
:class:`~tuner.errors.NodeError` line in the job's result; paramiko's own log stays quiet.
"""

from __future__ import annotations

import logging
import shlex
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import paramiko

from tuner.errors import NodeError, RemoteCommandError
from tuner.launch.base import PROCESS_SCRIPT, Executor, LaunchRequest, NodeProcess
from tuner.launch.sshconfig import MAX_HOPS, SSHResolver, SSHTarget
from tuner.launch.sshtransport import (
    AcceptNewPolicy,
    ProxyCommandSocket,
    RejectPolicy,
    UnknownHostKey,
    exc_reason,
    no_ssh_server,
    quiet_paramiko,
)
from tuner.layout import temp_beside
from tuner.spec.study import SSHSpec

logger = logging.getLogger(__name__)

_CHUNK = 65536
_Key = tuple[str, ...]
"""A cached connection: ``("node", name)`` or ``("jump", hop, *hops before it)``."""


class _Connection:
    def __init__(self, client: paramiko.SSHClient) -> None:
        self.client = client
        self.lock = threading.Lock()  # guards the SFTP session, which is not thread-safe
        self._sftp: paramiko.SFTPClient | None = None

    @property
    def transport(self) -> paramiko.Transport:
        transport = self.client.get_transport()
        if transport is None:
            raise paramiko.SSHException("not connected")
        return transport

    @property
    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.client.open_sftp()
        return self._sftp

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
        self.client.close()


class _RemoteProcess(NodeProcess):
    """One node's script: a channel whose output a thread copies into ``node-<k>.log``."""

    def __init__(self, host: str, channel: paramiko.Channel, log: Path) -> None:
        self._host = host
        self._channel = channel
        self._reader = threading.Thread(
            target=self._copy, args=(log,), name=f"log-{host}", daemon=True
        )
        self._reader.start()

    def _copy(self, log: Path) -> None:
        with log.open("ab", buffering=0) as out:
            while True:
                data = self._channel.recv(_CHUNK)
                if not data:
                    return
                out.write(data)

    def poll(self) -> int | None:
        if self._reader.is_alive():
            if not self._channel.get_transport().is_active():
                raise NodeError(self._host, "connection lost while the trial was running")
            return None
        if not self._channel.exit_status_ready():
            return None
        code = self._channel.recv_exit_status()
        if code == -1 and not self._channel.get_transport().is_active():
            raise NodeError(self._host, "connection lost while the trial was running")
        return code

    def close(self) -> None:
        self._channel.close()
        self._reader.join(timeout=1.0)


class SSHExecutor(Executor):
    """Runs trials on remote nodes over SSH. One connection per node, reused across trials."""

    def __init__(self, ssh: SSHSpec | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ssh = ssh or SSHSpec()
        self.resolver = SSHResolver(self.ssh)
        """How node names and jump hosts become destinations (the ssh config and the study)."""
        quiet_paramiko()
        self._lock = threading.Lock()
        self._known_hosts_lock = threading.Lock()
        self._conns: dict[_Key, _Connection] = {}
        self._connect_locks: dict[_Key, threading.Lock] = {}

    # ----- connections --------------------------------------------------------------------------

    def target(self, host: str) -> SSHTarget:
        """Where node ``host`` leads (see :mod:`tuner.launch.sshconfig` for the precedence)."""
        return self.resolver.node(host)

    def master_addr(self, hosts: Sequence[str]) -> str:
        # A node name may be an alias only this machine's ssh config knows.
        return self.target(hosts[0]).hostname

    def connection(self, host: str) -> _Connection:
        """The cached, live connection to ``host``; (re)connects when needed. Raises NodeError."""
        target = self.target(host)
        self._check_route(target)
        return self._cached(("node", host), target)

    def _next_hop(self, t: SSHTarget) -> tuple[_Key, SSHTarget] | None:
        """The jump host ``t`` is reached through (its cache key and destination), if any."""
        if t.proxy_command or not t.jump:
            return None
        *before, last = t.jump
        return ("jump", last, *before), self.resolver.hop(last, via=tuple(before) or None)

    def _check_route(self, t: SSHTarget) -> None:
        """Refuse a ProxyJump loop before connecting: two threads walking one loop from two ends
        would each hold the connection lock the other waits for."""
        names, keys, hop = [t.name], set(), self._next_hop(t)
        while hop is not None:
            key, jump = hop
            names.append(jump.name)
            if key in keys or len(names) > MAX_HOPS + 1:
                raise NodeError(t.name, f"ProxyJump loop: {' -> '.join(names)}")
            keys.add(key)
            hop = self._next_hop(jump)

    def _cached(self, key: _Key, target: SSHTarget) -> _Connection:
        with self._lock:
            lock = self._connect_locks.setdefault(key, threading.Lock())
        with lock:
            conn = self._conns.get(key)
            if conn is not None and conn.alive:
                return conn
            if conn is not None:
                conn.close()
            conn = _Connection(self._connect(target))
            self._conns[key] = conn
            return conn

    def _connect(self, t: SSHTarget) -> paramiko.SSHClient:
        sock = self._proxy(t)
        client = paramiko.SSHClient()
        try:
            if t.known_hosts.is_file():
                client.load_host_keys(str(t.known_hosts))
            client.set_missing_host_key_policy(
                AcceptNewPolicy(t.known_hosts, self._known_hosts_lock)
                if self.ssh.accept_new_host_keys
                else RejectPolicy()
            )
            timeout = self.ssh.connect_timeout_s
            keys: Any = list(t.key_files) or None  # paramiko takes a list; its stubs say str
            client.connect(
                t.hostname,
                port=t.port,
                username=t.user,
                key_filename=keys,
                look_for_keys=t.look_for_keys,
                allow_agent=t.agent,
                sock=sock,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
            )
        except Exception as exc:
            client.close()
            if sock is not None:
                sock.close()
            reason = self._explain(t, exc)
            if isinstance(sock, ProxyCommandSocket):
                reason = sock.explain(t, reason)
            raise NodeError(t.name, reason) from exc
        return client

    def _proxy(self, t: SSHTarget) -> paramiko.Channel | ProxyCommandSocket | None:
        """The socket to run ``t``'s SSH session over: a ``direct-tcpip`` channel of the last
        jump host's connection (cached: many nodes share one bastion), a ProxyCommand, or None
        for a plain TCP connection."""
        if t.proxy_command:
            try:
                return ProxyCommandSocket(t.proxy_command)
            except (OSError, ValueError) as exc:
                raise NodeError(t.name, f"ProxyCommand {t.proxy_command!r}: {exc}") from exc
        hop = self._next_hop(t)
        if hop is None:
            return None
        key, jump_target = hop
        try:
            return self._cached(key, jump_target).transport.open_channel(
                "direct-tcpip",
                (t.hostname, t.port),
                ("127.0.0.1", 0),
                timeout=self.ssh.connect_timeout_s,
            )
        except NodeError as exc:
            raise NodeError(t.name, f"through jump host {exc.host}: {exc.reason}") from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            why = exc_reason(exc)
            raise NodeError(
                t.name, f"jump host {jump_target.name} cannot reach {t.hostname}:{t.port}: {why}"
            ) from exc

    def _explain(self, t: SSHTarget, exc: Exception) -> str:
        where = t.where
        if isinstance(exc, paramiko.BadHostKeyException):
            return (
                f"host key mismatch for {where}: the server's {exc.key.get_name()} key is not the "
                f"one recorded in {t.known_hosts} (node reinstalled, or someone in between); "
                "remove the old entry if you trust the new key"
            )
        if isinstance(exc, UnknownHostKey):
            return (
                f"unknown host key for {where}: not in {t.known_hosts}; add it "
                "(ssh-keyscan) or set cluster.ssh.accept_new_host_keys"
            )
        if isinstance(exc, paramiko.AuthenticationException):
            keys = ", ".join(t.key_files) or "default keys"
            agent = " / agent" if t.agent else ""
            return f"authentication refused for {where} ({keys}{agent}): {exc}"
        if isinstance(exc, paramiko.SSHException) and "No authentication methods" in str(exc):
            return (
                f"authentication refused for {where}: no key to offer (cluster.ssh.key_file, "
                "IdentityFile, ~/.ssh/id_* or an agent allowed by IdentitiesOnly)"
            )
        if isinstance(exc, paramiko.ProxyCommandFailure):
            return f"ProxyCommand for {where} failed: {exc}"
        if isinstance(exc, OSError):  # refused, unreachable, timed out, name not known
            return f"cannot connect to {where}: {exc_reason(exc)}"
        if isinstance(exc, (paramiko.SSHException, EOFError)) and no_ssh_server(exc):
            return (
                f"cannot connect to {where}: no SSH server there (no SSH protocol banner "
                f"within {self.ssh.connect_timeout_s:g} s)"
            )
        return f"ssh to {where} failed: {type(exc).__name__}: {exc_reason(exc)}"

    def run(self, host: str, command: str, *, timeout: float = 60.0) -> tuple[int, str, str]:
        """Run ``command`` on ``host`` in a fresh channel: (exit code, stdout, stderr)."""
        try:
            chan = self.connection(host).transport.open_session(timeout=timeout)
            chan.settimeout(timeout)
            chan.exec_command(command)
            chan.shutdown_write()
            out = chan.makefile("rb").read().decode(errors="replace")
            err = chan.makefile_stderr("rb").read().decode(errors="replace")
            code = chan.recv_exit_status()
            chan.close()
        except NodeError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise NodeError(host, f"connection lost: {exc}") from exc
        return code, out, err

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()
        super().close()

    # ----- hooks --------------------------------------------------------------------------------

    def _prepare_node(self, request: LaunchRequest, node_rank: int) -> None:
        files = {request.remote_script(node_rank): (request.scripts[node_rank], 0o755)}
        for name, content in request.files.items():
            files[request.remote_dir / name] = (content, 0o644)
        self._put_files(request.hosts[node_rank], request.remote_dir, files, make_dir=True)

    def send_files(self, request: LaunchRequest, files: Mapping[str, str]) -> None:
        """Each of ``files`` into the running job's directory on every node, over SFTP."""
        named = {request.remote_dir / name: (content, 0o644) for name, content in files.items()}
        for host in dict.fromkeys(request.hosts):
            self._put_files(host, request.remote_dir, named, make_dir=False)

    def _put_files(
        self, host: str, folder: PurePosixPath, files: Mapping[PurePosixPath, tuple[str, int]],
        *, make_dir: bool,
    ) -> None:  # fmt: skip
        """``files`` (path -> content, mode) onto ``host`` over SFTP; a lost connection or a
        folder the node cannot write is a :class:`NodeError` naming what failed."""
        conn = self.connection(host)
        try:
            with conn.lock:
                sftp = conn.sftp()
                if make_dir:
                    _makedirs(sftp, folder)
                for path, (content, mode) in files.items():
                    _put_atomic(sftp, path, content, mode)
        except (paramiko.SSHException, EOFError, TimeoutError) as exc:  # the link, not the disk
            raise NodeError(host, f"copying files failed: {exc_reason(exc)}") from exc
        except OSError as exc:  # not mounted there, read-only, full, a file in the way
            why = exc_reason(exc)
            raise NodeError(host, f"cannot write files into {folder}: {why}") from exc

    def _start_node(self, request: LaunchRequest, node_rank: int, token: str) -> NodeProcess:
        host = request.hosts[node_rank]
        # a signalled process would give no exit status over SSH: setsid reports the script's
        command = request.shell_command(node_rank, token)
        try:
            chan = self.connection(host).transport.open_session(timeout=self.ssh.connect_timeout_s)
            chan.set_combine_stderr(True)
            chan.exec_command(command)
            chan.shutdown_write()
        except NodeError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise NodeError(host, f"starting the script failed: {exc}") from exc
        return _RemoteProcess(host, chan, request.paths.node_log(node_rank))

    def _run_check(self, host: str, argv: Sequence[str]) -> tuple[int, str, str]:
        command = " ".join(shlex.quote(a) for a in argv)
        return self.run(host, command, timeout=self.ssh.connect_timeout_s + 60)

    def _reap_node(
        self, request: LaunchRequest, node_rank: int, token: str, grace_s: float
    ) -> list[str]:
        host = request.hosts[node_rank]
        pid_file = str(request.remote_pid_file(node_rank))
        args = " ".join(shlex.quote(a) for a in ("tuner-reap", token, pid_file, str(grace_s)))
        command = f"sh -c {shlex.quote(PROCESS_SCRIPT)} {args}"
        code, out, err = self.run(host, command, timeout=grace_s + 60)
        if code != 0:
            raise RemoteCommandError(host, f"process reaper ({request.what})", code, err)
        return [line.strip() for line in out.splitlines() if line.strip()]


def _makedirs(sftp: paramiko.SFTPClient, path: PurePosixPath) -> None:
    missing: list[PurePosixPath] = []
    current = path
    while True:
        try:
            sftp.stat(str(current))
            break
        except FileNotFoundError:
            missing.append(current)
            if current.parent == current:
                break
            current = current.parent
    for p in reversed(missing):
        try:
            sftp.mkdir(str(p))
        except OSError:
            sftp.stat(str(p))  # another connection (a loopback node) made it meanwhile


def _put_atomic(sftp: paramiko.SFTPClient, path: PurePosixPath, content: str, mode: int) -> None:
    """Write ``content`` beside ``path`` and rename it into place; a copy that fails part-way
    (a full disk, a lost connection, ``path`` a folder) is removed where the node still answers,
    so no ``.tmp`` file is left in the trial's folder."""
    tmp = temp_beside(path)
    try:
        with sftp.open(str(tmp), "w") as f:
            f.write(content.encode())
        sftp.chmod(str(tmp), mode)
        sftp.posix_rename(str(tmp), str(path))
    except BaseException:
        try:
            sftp.remove(str(tmp))
        except (OSError, paramiko.SSHException, EOFError):
            pass  # never written, or the node is gone: the first error is the one to report
        raise
