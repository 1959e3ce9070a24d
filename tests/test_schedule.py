"""tuner.study.schedule.live_running: which launched trials run on a live worker."""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import FrozenTrial, TrialState

from tests.test_study import SURFACE, study_data
from tuner.errors import UnreachableNodes
from tuner.launch import LaunchRequest, LocalExecutor, NodePool
from tuner.layout import ResultsLayout
from tuner.spec.file import study_from_mapping
from tuner.study import schedule
from tuner.study.build import build_loop
from tuner.study.holder import worker_name
from tuner.study.leases import Lease, open_leases

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


class Unreachable:
    """An executor whose ``node-1`` cannot be reached to clean up a dead worker's trial."""

    def __init__(self) -> None:
        self.reaps = 0

    def master_port(self, hosts: object, preferred: int) -> int:
        return preferred

    def master_addr(self, hosts: tuple[str, ...]) -> str:
        return hosts[0]

    def reap_lost(self, request: LaunchRequest, token: str) -> list[str]:
        self.reaps += 1
        raise UnreachableNodes(request.what, (("node-1", "cannot connect to node-1: refused"),))


def test_a_dead_workers_node_that_cannot_be_reached_is_quarantined_not_waited_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Resumed after tune was killed, with one of the trial's two nodes gone: every pass of the
    loop tried to clean it up again, logging the same error each time, and with no other nodes
    the study waited forever. Now: one try per heartbeat, a strike against the node each try
    (quarantined like a node that fails a trial), and the pool says why it cannot go on."""
    clock = [time.time()]
    layout = ResultsLayout(tmp_path, "s")
    layout.study_dir.mkdir()
    leases = open_leases(None, layout)
    hosts = ("node-0", "node-1")
    held = (*(f"host:{h}" for h in hosts), "port:node-0:29500")
    leases.claim(held, "dead-worker", hosts=hosts)
    leases.attach("dead-worker", held, trial=0, token="tok", hosts=hosts)
    pool, executor = NodePool(hosts, 2), Unreachable()
    sched = schedule.Scheduler(pool, leases, executor, layout, ME, heartbeat_s=HEARTBEAT_S,
                               clock=lambda: clock[0])  # fmt: skip
    clock[0] += 10 * HEARTBEAT_S  # the dead worker's lease has expired
    for _ in range(50):  # passes of the loop within one heartbeat
        assert sched.acquire() is None
    assert executor.reaps == 1 and not pool.exhausted
    clock[0] += HEARTBEAT_S
    assert sched.acquire() is None
    assert executor.reaps == 2 and pool.exhausted
    assert pool.exhausted_reason.startswith(
        "too few nodes left for a trial of 2: quarantined node-1: cannot clean up trial 0 there: "
        "cannot connect to node-1: refused"
    )
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1


class Stuck(LocalExecutor):
    """Processes of a trial on local-0 that survive SIGKILL (a rank stuck in the GPU driver, in
    uninterruptible sleep): the reaper's scan names them after every kill."""

    def _reap_node(
        self, request: LaunchRequest, node_rank: int, token: str, grace_s: float
    ) -> list[str]:
        # the scripts below exit at once: nothing of theirs is left to sweep
        return ["4242 D python pretrain_gpt.py"] if request.hosts[node_rank] == "local-0" else []


def _exiting(spec: Any, config: Any, number: int, group: Any, paths: Any, master: str) -> Any:
    return LaunchRequest(trial=number, hosts=tuple(group.hosts), scripts=("exit 0",) * len(
        group.hosts), paths=paths)  # fmt: skip


def test_a_node_where_processes_survive_the_kill_gets_no_other_trial(tmp_path: Path) -> None:
    """Its node went back to the pool, so the next trial there found the GPUs held (a false
    OOM or a hang, blamed on its config); quarantined at once: tuner cannot end them."""
    data = study_data(tmp_path, SURFACE, n_trials=3, nodes_per_trial=1)
    spec = study_from_mapping(data)
    loop = build_loop(spec, results=str(tmp_path / "results"), executor=Stuck(grace_s=0.1),
                      launcher=_exiting)  # fmt: skip
    with loop.executor:
        loop.run()
    hosts = [t.user_attrs["hosts"] for t in loop.study.get_trials()]
    assert hosts[0] == ["local-0"] and all(h == ["local-1"] for h in hosts[1:]), hosts
    assert loop.pool.quarantined == {
        "local-0": "processes survived the kill: 4242 D python pretrain_gpt.py"
    }


def test_a_group_handed_back_unused_keeps_its_nodes_strikes(tmp_path: Path) -> None:
    """Only the lease-conflict path said so: a group given back because the config was refused
    for node-hours or no config was left forgave its nodes' strikes, so a node failing every
    other trial was never quarantined. Only a group a trial was launched on forgives them."""
    layout = ResultsLayout(tmp_path, "s")
    layout.study_dir.mkdir()
    pool = NodePool(("node-0",), 1, quarantine_after=2)
    sched = schedule.Scheduler(pool, open_leases(None, layout), Unreachable(), layout, ME,
                               heartbeat_s=HEARTBEAT_S)  # fmt: skip
    pool.strike("node-0", "lost")
    unused = sched.acquire()
    assert unused is not None
    sched.release(unused)  # ran nothing: the strike stays
    assert pool.strike("node-0", "lost again")  # the second strike quarantines it
    assert pool.quarantined == {"node-0": "lost again"}

    fresh = NodePool(("node-0",), 1, quarantine_after=2)
    sched = schedule.Scheduler(fresh, open_leases(None, layout), Unreachable(), layout, ME,
                               heartbeat_s=HEARTBEAT_S)  # fmt: skip
    fresh.strike("node-0", "lost")
    ran = sched.acquire()
    assert ran is not None
    sched.launched(ran, 0, "tok", None)
    sched.release(ran)  # a trial ran there cleanly: forgiven
    assert not fresh.strike("node-0", "lost again") and not fresh.quarantined
