"""Which nodes the next trial runs on, agreed with every other worker of the study.

This worker's :class:`~tuner.launch.NodePool` knows quarantined nodes and hands out groups with
their own rendezvous port; the study's :class:`~tuner.study.storage.Leases` decide, across workers,
that a node and a port run one trial at a time. A lease whose holder stopped beating is taken
over only once the dead holder's trial has no process left on its nodes.

A :class:`Heartbeat` thread renews this worker's leases and its running trials' heartbeats, so a
slow log parse or a slow node in the loop's thread never makes the worker look dead.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.errors import UnreachableNodes
from tuner.launch import LaunchRequest, NodeGroup, NodePool
from tuner.launch.pool import NodeFault
from tuner.layout import ResultsLayout
from tuner.study.holder import provably_dead
from tuner.study.leases import Lease, LeaseConflict, Leases

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """A node group claimed for one trial: the group (with its port) and the leased names."""

    group: NodeGroup
    resources: tuple[str, ...]


@dataclasses.dataclass(slots=True)
class Running:
    """A launched trial a worker is watching (:class:`tuner.study.loop.StudyLoop`)."""

    trial: Any  # optuna.Trial
    config: Any  # tuner.config.parallel.ParallelConfig
    job: Any  # tuner.launch.Job
    placement: Placement
    started: float

    @property
    def group(self) -> Any:
        """The node group (tuner.launch.NodeGroup) it runs on."""
        return self.placement.group


class Scheduler:
    """Hands out node groups that no other worker of the study is using."""

    def __init__(
        self, pool: NodePool, leases: Leases, executor: Any, layout: ResultsLayout,
        worker: str, *, heartbeat_s: float, clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.pool, self.leases, self.executor, self.layout = pool, leases, executor, layout
        self.worker, self.heartbeat_s, self.clock = worker, heartbeat_s, clock
        self.waiting_for: set[str] = set()
        """Nodes last found leased by another worker (shown while nothing can start)."""
        self._tried: dict[tuple[str, int], float] = {}
        """When this worker last tried to clean up each dead holder's trial (holder, trial)."""
        self.adopt: Callable[[Lease], bool] | None = None
        """Takes over a dead holder's still-queued or running batch job instead of ending it
        (:mod:`tuner.study.reattach`); True when it did."""
        self._ran: set[int] = set()
        """The groups (``NodeGroup.id``) a trial was launched on since they were acquired."""

    def acquire(self, size: int | None = None) -> Placement | None:
        """A group of free nodes (``size`` of them, default the pool's group size) and a free
        port, leased for this worker; None when none is."""
        avoid: set[str] = set()
        self.waiting_for = set()
        for _ in range(2 * len(self.pool.hosts) + 4):
            group = self.pool.acquire(avoid=avoid, size=size)
            if group is None:
                return None
            port = self.executor.master_port(group.hosts, group.master_port)
            addr = self.executor.master_addr(group.hosts)
            resources = tuple(f"host:{h}" for h in group.hosts) + (f"port:{addr}:{port}",)
            try:
                self.leases.claim(resources, self.worker, hosts=group.hosts)
            except LeaseConflict as conflict:
                self.pool.release(group, ran=False)
                if not self._take_over(conflict.held):
                    busy = {r.removeprefix("host:") for x in conflict.held
                            for r in [x.resource] if r.startswith("host:")}  # fmt: skip
                    avoid |= busy
                    self.waiting_for |= busy
                continue
            return Placement(dataclasses.replace(group, master_port=port), resources)
        return None

    def launched(self, placement: Placement, trial: int, token: str, node_dir: str | None) -> None:
        """Record on the leases which trial runs there (another worker cleans up if we die)."""
        self._ran.add(placement.group.id)
        self.leases.attach(self.worker, placement.resources, trial=trial, token=token,
                           hosts=placement.group.hosts, node_dir=node_dir)  # fmt: skip

    def release(self, placement: Placement, node_errors: Any = ()) -> None:
        """Give the nodes back to the pool and the study. A group no trial was launched on
        (refused for node-hours, no config left, the wrong size for a proxy, a launch that
        failed before its record) proves nothing about its nodes: their strikes stay."""
        ran = placement.group.id in self._ran
        self._ran.discard(placement.group.id)
        self.pool.release(placement.group, node_errors=node_errors, ran=ran)
        self.leases.release(self.worker, placement.resources)

    @staticmethod
    def faults(result: Any) -> tuple[NodeFault, ...]:
        """A finished job's (``JobResult``) node errors, and each node where processes survived
        the kill, quarantined at once: tuner cannot end them, and the next trial there would
        find their GPUs and ports taken (a false OOM or a hang, blamed on its config)."""
        survived: dict[str, str] = {}
        for line in result.survivors:  # "host: pid stat args"
            host, _, what = line.partition(": ")
            survived.setdefault(host, what)
        stuck = ((h, f"processes survived the kill: {w}", True) for h, w in survived.items())
        return (*result.node_errors, *stuck)

    def renew(self) -> None:
        """This worker's heartbeat on all its leases."""
        self.leases.renew(self.worker)

    def _take_over(self, held: tuple[Lease, ...]) -> bool:
        """Free the expired leases among ``held`` once their trial has no process left; True
        when something was freed (the caller tries the same nodes again)."""
        now = self.clock()
        dead = [x for x in held if x.lost(now, self.heartbeat_s)]
        if not dead:
            return False
        freed = False
        for trial in {(x.holder, x.trial) for x in dead}:
            leases = [x for x in dead if (x.holder, x.trial) == trial]
            if self._clean(leases[0], now):
                for x in leases:
                    self.leases.take_over(x)
                freed = True
        return freed

    def _clean(self, lease: Lease, now: float) -> bool:
        """End what the dead holder's trial left on its nodes; True when nothing survives. Tried
        once a heartbeat, not on every pass of the loop; a node it cannot reach gets a strike
        in the pool, as a node that fails a trial does, so a node that stays away is
        quarantined instead of waited on for ever."""
        if lease.token is None or lease.trial is None or not lease.hosts:
            return True  # claimed but never launched
        if self.adopt is not None and self.adopt(lease):
            return True  # its job is watched by this worker now
        key = (lease.holder, lease.trial)
        if key in self._tried and now - self._tried[key] < self.heartbeat_s:
            return False
        unreachable: list[tuple[str, str]] = []
        clean = end_lost_trial(self.executor, self.layout, lease.trial, lease.hosts, lease.token,
                               lease.node_dir, unreachable=unreachable,
                               again=key in self._tried)  # fmt: skip
        self._tried[key] = now
        for host, reason in unreachable:
            self.pool.strike(host, f"cannot clean up trial {lease.trial} there: {reason}")
        return clean


def end_lost_trial(executor: Any, layout: ResultsLayout, trial: int, hosts: tuple[str, ...],
                   token: str, node_dir: str | None, *,
                   unreachable: list[tuple[str, str]] | None = None,
                   again: bool = False) -> bool:  # fmt: skip
    """End every process a dead worker's trial left on its nodes; True when none survives (an
    unreachable node counts as not clean: its nodes keep their lease until it can be checked).
    ``unreachable`` gets ``(host, reason)`` of each node not reached; ``again``: a retry, whose
    failure is logged at debug level (the first one was said)."""
    request = LaunchRequest(
        trial=trial, hosts=hosts, scripts=("",) * len(hosts), paths=layout.trial(trial),
        node_dir=node_dir,
    )  # fmt: skip
    try:
        survivors = executor.reap_lost(request, token)
    except Exception as exc:  # an unreachable node must not stop the study
        logger.log(logging.DEBUG if again else logging.ERROR, "trial %d of a dead worker: %s",
                   trial, exc)  # fmt: skip
        if unreachable is not None and isinstance(exc, UnreachableNodes):
            unreachable.extend(exc.errors)
        return False
    if survivors:
        logger.error("trial %d of a dead worker: processes survive: %s", trial,
                     "; ".join(survivors))  # fmt: skip
        return False
    logger.info("trial %d of a dead worker: its processes on %s are gone", trial,
                ",".join(hosts))  # fmt: skip
    return True


class Heartbeat:
    """Calls ``beat`` every ``period_s`` seconds on its own thread until stopped.

    A failed beat is logged at debug level and kept: :meth:`failing` hands the loop the error
    once :data:`FAILED_BEATS` beats in a row failed, so a storage that broke stops the worker
    with its real cause instead of a warning per beat."""

    FAILED_BEATS = 2

    def __init__(self, beat: Callable[[], None], period_s: float) -> None:
        self._beat = beat
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuner-heartbeat", daemon=True)
        self._failed: tuple[int, Exception | None] = (0, None)  # beats failed in a row, last

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def failing(self) -> Exception | None:
        """The last error when the last :data:`FAILED_BEATS` beats all failed, else None."""
        count, last = self._failed  # one read: the thread replaces the tuple whole
        return last if count >= self.FAILED_BEATS else None

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self._beat()
            except Exception as exc:  # a storage hiccup must not end the beats
                logger.debug("heartbeat failed: %s", exc, exc_info=True)
                self._failed = (self._failed[0] + 1, exc)
            else:
                self._failed = (0, None)


def live_running(trials: list[FrozenTrial], leases: Leases, worker: str,
                 heartbeat_s: float) -> list[FrozenTrial]:  # fmt: skip
    """The launched trials still RUNNING whose worker is alive: this worker, or one holding a
    lease on the trial's nodes that it renewed within its last few heartbeats."""
    running = [t for t in trials if t.state == TrialState.RUNNING
               and t.user_attrs.get("launched")]  # fmt: skip
    if all(t.user_attrs.get("worker") == worker for t in running):
        return running  # this worker's own: no lease to read (one worker: every decision)
    now = time.time()
    dead: dict[str, bool] = {}  # a worker's leases share its fate: /proc is read once a worker
    held = leases.held()
    for x in held:
        if x.holder not in dead and not x.expired(now, heartbeat_s):
            dead[x.holder] = provably_dead(x.holder)
    fresh = {
        (x.holder, x.resource) for x in held
        if not x.expired(now, heartbeat_s) and not dead[x.holder]
    }  # fmt: skip
    return [
        t for t in running
        if t.user_attrs.get("worker") == worker
        or any((t.user_attrs.get("worker"), f"host:{h}") in fresh
               for h in t.user_attrs.get("hosts", ()))
    ]  # fmt: skip
