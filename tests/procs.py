"""Live processes of this machine, read from ``/proc`` (no ``ps`` column width can truncate)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Proc:
    """What a test may match a process on."""

    pid: int
    cmdline: str
    environ: tuple[str, ...]
    cwd: str

    def line(self) -> str:
        return f"{self.pid} {self.cmdline}"


def live_processes(match: Callable[[Proc], bool]) -> list[str]:
    """``"pid cmdline"`` of every live (non-zombie) process ``match`` accepts."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            raw = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            environ = (entry / "environ").read_bytes().decode(errors="replace").split("\0")
            cwd = str((entry / "cwd").readlink())
        except (OSError, IndexError):
            continue  # exited while we looked, or not ours to read
        proc = Proc(int(entry.name), raw.decode(errors="replace"), tuple(environ), cwd)
        if state != "Z" and match(proc):
            found.append(proc.line())
    return found


def run_in_group(
    argv: list[str], timeout: float, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` in a session of its own, text output captured; on timeout the whole
    session is killed (the launcher's ranks under torchrun included) before the error is raised,
    so a test that gives up leaves no training process behind."""
    with subprocess.Popen(
        argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        **kwargs,
    ) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
