"""Who holds a lease: a worker named so that its death can be proved, not only waited out.

A worker's name is ``host:pid:start:boot:nonce``: the host name, the process id, the process's
start time (clock ticks after boot, from ``/proc/PID/stat``), the machine's boot and pid
namespace (``boot_id`` and the namespace's inode) and a random nonce. A pid alone is reused, and
containers share host names, so a worker is provably dead only when every part says so: same
host, same boot and pid namespace as the one asking, and no process with that pid and start time
any more. Anything else (another machine, another container, an older name of the form
``host:pid:nonce``, a system without ``/proc``) proves nothing, and the lease waits out its
heartbeats as before.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from pathlib import Path

_PROC = Path("/proc")


def process_start(pid: int) -> str | None:
    """Start time of process ``pid`` in clock ticks after boot; None when there is none."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) is in parentheses and may hold blanks and ')': split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None  # field 22 of proc(5)


@functools.cache
def machine() -> str | None:
    """This boot of this machine and this pid namespace, or None where it cannot be told."""
    try:
        boot = (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
        namespace = os.stat(_PROC / "self" / "ns" / "pid").st_ino
    except OSError:
        return None
    return f"{boot.replace('-', '')[:12]}.{namespace}"


def worker_name(pid: int | None = None) -> str:
    """The name of worker process ``pid`` (default: this one) as leases record it."""
    pid = os.getpid() if pid is None else pid
    start = process_start(pid) or "?"
    return f"{socket.gethostname()}:{pid}:{start}:{machine() or '?'}:{uuid.uuid4().hex[:6]}"


def provably_dead(holder: str) -> bool:
    """Whether ``holder`` (a :func:`worker_name`) names a process of this machine, boot and pid
    namespace that no longer runs. False whenever that cannot be proved."""
    parts = holder.rsplit(":", 4)
    if len(parts) != 5:
        return False
    host, pid, start, where, _ = parts
    if host != socket.gethostname() or not pid.isdigit() or start == "?":
        return False
    here = machine()
    if here is None or where != here:
        return False
    return process_start(int(pid)) != start
