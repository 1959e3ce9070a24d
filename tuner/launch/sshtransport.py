"""How one SSH connection is made and why it failed: host-key policies, the ProxyCommand socket,
and turning paramiko's exceptions into one readable line (its own log is kept quiet)."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import paramiko

from tuner.launch.sshconfig import SSHTarget

logger = logging.getLogger(__name__)


class UnknownHostKey(paramiko.SSHException):
    """The server's host key is in no known_hosts file (and new keys are not accepted)."""


class RejectPolicy(paramiko.MissingHostKeyPolicy):
    """OpenSSH's ``StrictHostKeyChecking=yes``: an unknown host key is refused."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        raise UnknownHostKey(hostname)


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """OpenSSH's ``StrictHostKeyChecking=accept-new``: trust and record keys never seen before.

    Appends one line under a lock (paramiko's own save rewrites the file from one client's view,
    which loses keys when many nodes connect at once).
    """

    def __init__(self, path: Path, lock: threading.Lock) -> None:
        self._path = path
        self._lock = lock

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        with self._lock:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with self._path.open("a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        logger.warning(
            "accepted new host key of %s (%s), saved to %s", hostname, key.get_name(), self._path
        )


class ProxyCommandSocket(paramiko.ProxyCommand):
    """paramiko's ProxyCommand, with three changes. The command leads its own session and closing
    ends the whole session (a shell's children too, as OpenSSH does), then waits for it. Its end of
    output is EOF (paramiko's reads on after it until each timeout). Its stderr goes to a file
    (never a full pipe), whose last line explains a failure."""

    def __init__(self, command_line: str) -> None:  # not paramiko's: it starts the process
        self.cmd = shlex.split(command_line)
        self._stderr = tempfile.TemporaryFile()
        self._closing = threading.Lock()
        self.process = subprocess.Popen(
            self.cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            bufsize=0,
            start_new_session=True,
        )
        self.timeout: float | None = None
        self.last_words = ""
        """The last line the command wrote to stderr, once closed."""
        self.exit_status: int | None = None
        """Its exit status if it ended by itself before it was closed."""

    def recv(self, size: int) -> bytes:
        out = self.process.stdout
        if self.process.poll() is not None:
            return os.read(out.fileno(), size) if out is not None else b""  # its last words
        data: bytes = super().recv(size)
        return data

    def explain(self, t: SSHTarget, reason: str) -> str:
        """Why connecting to ``t`` through this (closed) command failed; ``reason``: as paramiko
        saw it."""
        said = f": {self.last_words}" if self.last_words else ""
        code = self.exit_status
        if code is not None:
            return f"cannot connect to {t.where}: ProxyCommand exited with status {code}{said}"
        return f"{reason} (ProxyCommand said{said})" if said else reason

    def close(self) -> None:
        # paramiko's transport thread and the connecting thread may both close it, at the same
        # moment: the first one does the work, under the lock.
        with self._closing:
            self._close()

    def _close(self) -> None:
        # paramiko's transport thread may close first (a banner timeout): what counts is whether
        # the command had ended before anyone closed it.
        if not self._stderr.closed:
            self.exit_status = self.process.poll()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5.0)
                break
        if not self._stderr.closed:
            self._stderr.seek(0)
            lines = self._stderr.read().decode(errors="replace").strip().splitlines()
            self.last_words = lines[-1].strip() if lines else ""
            self._stderr.close()


def quiet_paramiko() -> None:
    """Keep paramiko's own log out of the user's terminal.

    Its transport thread logs a 30-line traceback at ERROR for a host that accepts the TCP
    connection but never speaks SSH, and more for dropped connections; everything it knows
    reaches the user as one :class:`NodeError` line instead. An application that set the
    ``paramiko`` logger's level itself (to debug a connection) keeps its choice.
    """
    log = logging.getLogger("paramiko")
    if log.level == logging.NOTSET:
        log.setLevel(logging.CRITICAL)


def exc_reason(exc: BaseException) -> str:
    """The message of ``exc``, or its type when it has none (``EOFError()``, ``timeout()``)."""
    if isinstance(exc, socket.timeout) or type(exc) is TimeoutError:
        return "timed out"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        # "[Errno None] Unable to connect to port 22 on 10.0.0.5": the real reason is inside
        return "; ".join(sorted({exc_reason(e) for e in exc.errors.values()})) or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip()
    return text or type(exc).__name__


def no_ssh_server(exc: BaseException) -> bool:
    # What paramiko raises when the peer accepted TCP but sent no (or no valid) SSH banner, or
    # closed before the session was set up.
    text = str(exc)
    return isinstance(exc, EOFError) or any(
        s in text for s in ("protocol banner", "No existing session", "Error reading SSH")
    )
