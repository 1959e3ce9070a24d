"""A lease holder is proved dead only by its host, boot, pid namespace, pid and start time."""

from __future__ import annotations

import socket
import subprocess
import sys

from tuner.study.holder import machine, process_start, provably_dead, worker_name


def test_a_live_worker_is_not_dead_and_an_ended_one_is() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        name = worker_name(child.pid)
        assert not provably_dead(name)
        assert not provably_dead(worker_name())  # this process
    finally:
        child.kill()
        child.wait()
    assert provably_dead(name)


def test_a_reused_pid_is_still_dead() -> None:
    """Same pid, another start time: another process, so the holder is dead."""
    host, pid, start, where, nonce = worker_name().split(":")
    assert process_start(int(pid)) == start
    assert provably_dead(":".join([host, pid, str(int(start) - 1), where, nonce]))


def test_what_cannot_be_proved_is_never_dead() -> None:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    pid = child.stdout.strip()  # ended, but named from elsewhere:
    here, host = machine(), socket.gethostname()
    assert not provably_dead(f"other-host:{pid}:1:{here}:abc")  # another machine
    assert not provably_dead(f"{host}:{pid}:1:0000.1:abc")  # another boot or container
    assert not provably_dead(f"{host}:{pid}:abc123")  # the old host:pid:nonce form
    assert not provably_dead(f"{host}:{pid}:?:{here}:abc")  # start time unknown
    assert not provably_dead("w1")
