"""Fixtures for the launch tests: loopback sshd nodes and small process helpers."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .sshd import LoopbackCluster, sshd_missing_reason


@pytest.fixture(scope="session")
def sshd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackCluster]:
    """Three loopback sshd nodes (127.0.0.2-4), shared by every SSH test of the session."""
    reason = sshd_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with LoopbackCluster(tmp_path_factory.mktemp("sshd"), 3) as cluster:
        yield cluster


def live_processes(marker: str) -> list[str]:
    """``ps`` lines (zombies excluded) whose command line contains ``marker``."""
    out = subprocess.run(
        ["ps", "-ww", "-eo", "pid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    return [
        line
        for line in out.splitlines()
        if marker in line and not line.split()[1].startswith("Z") and "ps -ww" not in line
    ]


def wait_for(predicate: object, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``predicate()`` until true (real processes need real time)."""
    import time

    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
