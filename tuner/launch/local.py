"""Run every "node" of a trial as a bash process on this machine (tests, single-node studies)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tuner.errors import LaunchError
from tuner.launch.base import (
    PROCESS_SCRIPT,
    TOKEN_ENV,
    Executor,
    LaunchRequest,
    NodeProcess,
)
from tuner.layout import write_atomic

logger = logging.getLogger(__name__)

PORT_SEARCH = 100
"""Ports tried upward from the preferred one (the node pool's range is as wide)."""


class _LocalProcess(NodeProcess):
    def __init__(self, popen: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        self._popen = popen
        self._log = log

    def poll(self) -> int | None:
        return self._popen.poll()

    def close(self) -> None:
        self._log.close()


class LocalExecutor(Executor):
    """Each node of the group is a ``bash launch-node-<k>.sh`` process here, in its own session.

    Output goes straight from the process into ``node-<k>.log`` (no copying thread), so the log is
    live. ``master_addr`` is the loopback address whatever the host names are.
    """

    def __init__(self, *, env: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._base_env = dict(os.environ if env is None else env)

    def master_addr(self, hosts: Sequence[str]) -> str:
        return "127.0.0.1"

    def master_port(self, hosts: Sequence[str], preferred: int) -> int:
        """A port free on this machine right now: other studies, tests or jobs here may hold
        the pool's fixed ports (two workers of one study on one machine would collide)."""
        # Next ports of the pool's range before the kernel's choice: an ephemeral port may be
        # taken as the source port of some outgoing connection before torchrun binds it.
        for port in range(preferred, min(preferred + PORT_SEARCH, 65536)):
            if _bindable(port):
                return port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def _run_check(self, host: str, argv: Sequence[str]) -> tuple[int, str, str]:
        # Every local "node" is this machine, in the directory tune runs in: relative paths mean
        # what the launch templates make of them (resolved against the current directory).
        done = subprocess.run(
            list(argv), env=self._base_env, capture_output=True, text=True, timeout=60, check=False
        )
        return done.returncode, done.stdout, done.stderr

    def _prepare_node(self, request: LaunchRequest, node_rank: int) -> None:
        # Executor.submit already wrote the files into paths.dir; copy them only when the "node"
        # was told to use another directory.
        target = Path(request.remote_dir)
        if target.resolve() == request.paths.dir.resolve():
            return
        target.mkdir(parents=True, exist_ok=True)
        script = Path(request.remote_script(node_rank))
        write_atomic(script, request.scripts[node_rank], mode=0o755)
        for name, content in request.files.items():
            write_atomic(target / name, content)

    def _start_node(self, request: LaunchRequest, node_rank: int, token: str) -> NodeProcess:
        env = {**self._base_env, **request.env, TOKEN_ENV: token}
        log = request.paths.node_log(node_rank).open("ab", buffering=0)
        try:
            popen = subprocess.Popen(
                ["bash", str(request.remote_script(node_rank))],
                cwd=str(request.remote_dir),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            log.close()
            raise
        # start_new_session: the script's pid is its process group id.
        Path(request.remote_pid_file(node_rank)).write_text(f"{popen.pid}\n")
        return _LocalProcess(popen, log)

    def _reap_node(
        self, request: LaunchRequest, node_rank: int, token: str, grace_s: float
    ) -> list[str]:
        pid_file = str(request.remote_pid_file(node_rank))
        done = subprocess.run(
            ["sh", "-c", PROCESS_SCRIPT, "tuner-reap", token, pid_file, str(grace_s)],
            capture_output=True,
            text=True,
            timeout=grace_s + 60,
            check=False,
            start_new_session=True,  # a terminal's second Ctrl-C must not end the cleanup
        )
        if done.returncode != 0:
            raise LaunchError(f"process reaper exited {done.returncode}: {done.stderr.strip()}")
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def _bindable(port: int) -> bool:
    """Whether a TCP listener could take ``port`` on loopback now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
