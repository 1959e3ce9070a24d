"""A probe job's node log as the project's workloads frame it (:data:`tuner.profile.probe.POINT`
lines), the steps' own lines given by the caller: the stand-ins of the probe tests share it."""

from __future__ import annotations

from collections.abc import Callable

from tuner.profile.probe import INTERLEAVED, POINT, PROBE_ITERS


def probe_job_log(points: int, interleaved: bool, step: Callable[[int, int], str]) -> str:
    """Node 0's log of ``points`` probe points, ``step(k, it)`` the line of point ``k``'s
    iteration ``it``, called in the order the steps ran. ``interleaved``: as the DeepSpeed
    workload runs its points in one process (each point's first step in turn, then one step of
    each per round, in reverse on odd rounds, framed by resume/pause); else one point after
    the other, as a script that runs its points in turn."""
    out: list[str] = []
    if not interleaved:
        for k in range(points):
            out.append(f"{POINT} {k} start")
            out += [step(k, it) for it in range(1, PROBE_ITERS + 1)]
            out.append(f"{POINT} {k} end rc=0")
        return "\n".join(out) + "\n"
    for k in range(points):
        out += [f"{POINT} {k} start", step(k, 1), f"{POINT} {k} pause"]
    for it in range(2, PROBE_ITERS + 1):
        for k in range(points) if it % 2 == 0 else reversed(range(points)):
            out += [f"{POINT} {k} {INTERLEAVED}", step(k, it), f"{POINT} {k} pause"]
    out += [f"{POINT} {k} end rc=0" for k in range(points)]
    return "\n".join(out) + "\n"
