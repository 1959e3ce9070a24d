"""Live processes of this machine, read from ``/proc`` (no ``ps`` column width can truncate)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


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
