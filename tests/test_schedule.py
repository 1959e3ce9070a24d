"""tuner.study.schedule.live_running: which launched trials run on a live worker."""

from __future__ import annotations

import datetime
import time

import pytest
from optuna.trial import FrozenTrial, TrialState

from tuner.study import schedule
from tuner.study.holder import worker_name
from tuner.study.leases import Lease

ME = worker_name()
HEARTBEAT_S = 30.0


def running(number: int, worker: str, hosts: tuple[str, ...]) -> FrozenTrial:
    return FrozenTrial(
        number=number, state=TrialState.RUNNING, value=None,
        datetime_start=datetime.datetime.now(), datetime_complete=None, params={},
        distributions={}, user_attrs={"launched": True, "worker": worker, "hosts": list(hosts)},
        system_attrs={}, intermediate_values={}, trial_id=number,
    )  # fmt: skip


class Held:
    """The leases' one read ``live_running`` makes, counted."""

    def __init__(self, leases: list[Lease]) -> None:
        self.leases, self.reads = leases, 0

    def held(self) -> list[Lease]:
        self.reads += 1
        return self.leases


def test_this_workers_own_trials_need_no_lease_read() -> None:
    mine = [running(n, ME, (f"node{n}",)) for n in range(64)]
    held = Held([])
    live = schedule.live_running(mine, held, ME, HEARTBEAT_S)  # type: ignore[arg-type]
    assert live == mine and held.reads == 0


def test_another_worker_counts_while_its_lease_is_fresh_and_it_lives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's liveness is read once however many leases it holds (its nodes share it)."""
    now = time.time()
    alive, dead, silent = ME.replace(ME.rsplit(":", 1)[1], "other1"), "dead", "silent"
    leases = [Lease(f"host:a{i}", alive, now) for i in range(16)]
    leases += [Lease(f"host:d{i}", dead, now) for i in range(16)]
    leases += [Lease("host:s0", silent, now - 10 * HEARTBEAT_S)]  # stopped beating
    asked: list[str] = []

    def provably_dead(holder: str) -> bool:
        asked.append(holder)
        return holder == dead

    monkeypatch.setattr(schedule, "provably_dead", provably_dead)
    trials = [running(0, ME, ("m0",)), running(1, alive, ("a0", "a1")),
              running(2, dead, ("d0",)), running(3, silent, ("s0",))]  # fmt: skip
    held = Held(leases)
    live = schedule.live_running(trials, held, ME, HEARTBEAT_S)  # type: ignore[arg-type]
    assert [t.number for t in live] == [0, 1]
    assert held.reads == 1 and sorted(asked) == sorted([alive, dead])  # once each, none expired
