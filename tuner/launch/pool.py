"""Hands out disjoint groups of nodes so that several trials can run at once.

Each group in use gets its own rendezvous (master) port, so two trials that share nothing but the
scheduler never collide. A node that keeps failing to be reached is quarantined: it is never handed
out again and the study reports it.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.spec.bounds import LAST_PORT, listed_twice

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """The nodes one trial runs on, and its rendezvous port."""

    id: int
    """Unique among the groups this pool handed out."""
    hosts: tuple[str, ...]
    """Node names in node-rank order; ``hosts[0]`` hosts the rendezvous."""
    master_port: int
    """The rendezvous port; no other group in use at the same time has it."""

    @property
    def master_host(self) -> str:
        """The node of rank 0."""
        return self.hosts[0]

    @property
    def size(self) -> int:
        """The number of nodes."""
        return len(self.hosts)


NodeFault = str | tuple[str, str] | tuple[str, str, bool]
"""What went wrong with a node of a group: its name, ``(host, reason)``, or ``(host, reason,
True)`` for a fault that quarantines it at once (processes tuner could not end hold it)."""
EXHAUSTED = ("every node is quarantined", "too few nodes left for a trial")
"""How :attr:`NodePool.exhausted_reason` begins: all nodes quarantined, or some (``tune run``
then stops, exit 1)."""


class NodePool:
    """A thread-safe pool of nodes handed out in groups of ``nodes_per_trial``.

    ``release(group, node_errors=...)`` returns the nodes. A node named in ``node_errors`` on
    ``quarantine_after`` consecutive releases is quarantined; a clean release resets its count.
    """

    def __init__(
        self,
        hosts: Sequence[str],
        nodes_per_trial: int,
        *,
        quarantine_after: int = 2,
        base_port: int = 29500,
        port_range: int = 100,
    ) -> None:
        if not hosts:
            raise ConfigError("no nodes given", path="cluster.nodes")
        seen: dict[str, str] = {}
        for host in hosts:
            if (twice := listed_twice(host, seen)) is not None:
                raise ConfigError(f"node {twice}", path="cluster.nodes")
        if not 1 <= nodes_per_trial <= len(hosts):
            raise ConfigError(
                f"{nodes_per_trial} nodes per trial, but the cluster has {len(hosts)} nodes",
                path="search.nodes_per_trial",
            )
        if quarantine_after < 1:
            raise ValueError(f"quarantine_after must be >= 1, got {quarantine_after}")
        # the ports handed out are base_port .. base_port + port_range - 1, the last <= 65535
        if not 1024 <= base_port <= LAST_PORT + 1 - port_range:
            raise ConfigError(f"master port {base_port} out of range", path="launch.master_port")
        port_range = max(port_range, len(hosts))  # groups may be smaller (proxy trials)
        if base_port + port_range - 1 > LAST_PORT:
            raise ConfigError(
                f"{len(hosts):,} nodes need up to {port_range:,} master ports from "
                f"{base_port} (one per trial running at once), past the last port {LAST_PORT}: "
                f"at most {LAST_PORT + 1 - base_port:,} nodes from this port; a lower one "
                "allows more",
                path="launch.master_port",
            )
        self._hosts = tuple(hosts)
        self._index = {host: i for i, host in enumerate(self._hosts)}
        self._per_trial = nodes_per_trial
        self._quarantine_after = quarantine_after
        self._base_port = base_port
        self._port_range = port_range
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._free = list(range(-len(self._hosts) + 1, 1))
        """The hosts not in use, as their indices negated in ascending order: the first host in
        the order given is the last item, so a group taken from the front of the order is
        deleted from the end of the list (no shift of the rest). A quarantined host's is
        dropped when an acquire comes to it."""
        self._ports: set[int] = set()
        """The master ports of the groups in use."""
        self._in_use: dict[int, NodeGroup] = {}
        self._strikes: dict[str, int] = {}
        self._quarantined: dict[str, str] = {}
        self._next_id = 0
        self._next_port = 0

    @property
    def nodes_per_trial(self) -> int:
        """The size of every group."""
        return self._per_trial

    @property
    def hosts(self) -> tuple[str, ...]:
        """All nodes, quarantined or not, in the order given."""
        return self._hosts

    def acquire(self, avoid: Iterable[str] = (), size: int | None = None) -> NodeGroup | None:
        """A group of free, healthy nodes with its own master port, or None when none is free.

        ``avoid``: nodes not to hand out this time (another worker of the study holds them);
        ``size``: nodes in the group (default ``nodes_per_trial``; a proxy trial takes fewer).
        """
        skip = set(avoid)
        want = self._per_trial if size is None else size
        with self._lock:  # the first free hosts in the order given, without a scan of them all
            free, taken, dropped = self._free, [], []
            for pos in range(len(free) - 1, -1, -1):  # the lowest index is the last
                host = self._hosts[-free[pos]]
                if host in self._quarantined:
                    dropped.append(pos)  # never handed out again
                elif host not in skip:
                    taken.append(pos)
                    if len(taken) == want:
                        break
            if len(taken) < want:
                for pos in dropped:  # descending: each deletion leaves the others' places
                    del free[pos]
                return None
            hosts = tuple(self._hosts[-free[pos]] for pos in taken)
            for pos in sorted(taken + dropped, reverse=True):
                del free[pos]
            group = NodeGroup(
                id=self._next_id,
                hosts=hosts,
                master_port=self._take_port(),
            )
            self._next_id += 1
            self._busy.update(group.hosts)
            self._in_use[group.id] = group
            self._ports.add(group.master_port)
            return group

    def _take_port(self) -> int:
        # Rotate through the range rather than reusing the lowest free port, so a port released a
        # moment ago (possibly still in TIME_WAIT) is the last one handed out again.
        for _ in range(self._port_range):
            port = self._base_port + self._next_port
            self._next_port = (self._next_port + 1) % self._port_range
            if port not in self._ports:
                return port
        raise RuntimeError("no free master port")  # unreachable: range >= number of groups

    def release(
        self, group: NodeGroup, node_errors: Iterable[NodeFault] = (), *, ran: bool = True,
    ) -> list[str]:  # fmt: skip
        """Return the nodes of ``group``; returns the nodes quarantined by this release.

        ``node_errors`` holds host names, ``(host, reason)`` pairs (``JobResult.node_errors``)
        or ``(host, reason, True)``: a fault that quarantines the node at once.
        ``ran``: the group ran a trial, so a node without an error is forgiven its strikes (a
        group given back unused, e.g. leased by another worker, proves nothing about its nodes).
        """
        faults = [_as_fault(e) for e in node_errors]
        reasons = {host: reason for host, reason, _ in faults}
        at_once = {host for host, _, now in faults if now}
        newly: list[str] = []
        with self._lock:
            if self._in_use.pop(group.id, None) is None:
                raise ValueError(f"node group {group.id} is not in use")
            self._busy.difference_update(group.hosts)
            self._ports.discard(group.master_port)
            for host in group.hosts:
                if host not in reasons:
                    if ran:
                        self._strikes.pop(host, None)
                elif self._strike(host, reasons[host], at_once=host in at_once):
                    newly.append(host)
                if host not in self._quarantined:
                    bisect.insort(self._free, -self._index[host])
        for host in newly:
            self._say_quarantined(host, reasons[host])
        return newly

    def strike(self, host: str, reason: str) -> bool:
        """A node error on ``host`` outside a group it was handed (a dead worker's trial there
        could not be cleaned up); True when this quarantines it."""
        with self._lock:
            newly = self._strike(host, reason)
        if newly:
            self._say_quarantined(host, reason)
        return newly

    def _strike(self, host: str, reason: str, *, at_once: bool = False) -> bool:
        self._strikes[host] = self._strikes.get(host, 0) + 1
        enough = at_once or self._strikes[host] >= self._quarantine_after
        if enough and host not in self._quarantined:
            self._quarantined[host] = reason
            return True
        return False

    def _say_quarantined(self, host: str, reason: str) -> None:
        logger.warning("node %s quarantined after %d node errors: %s", host,
                       self._quarantine_after, reason)  # fmt: skip

    @property
    def quarantined(self) -> dict[str, str]:
        """Quarantined nodes and the last reason each failed."""
        with self._lock:
            return dict(self._quarantined)

    @property
    def in_use(self) -> tuple[NodeGroup, ...]:
        """The groups handed out and not yet released."""
        with self._lock:
            return tuple(self._in_use.values())

    @property
    def capacity(self) -> int:
        """How many groups could run at once on the healthy nodes."""
        with self._lock:
            healthy = len(self._hosts) - len(self._quarantined)
        return healthy // self._per_trial

    @property
    def free_count(self) -> int:
        """Healthy nodes not in use."""
        with self._lock:
            idle = sum(h not in self._busy for h in self._quarantined)
            return len(self._hosts) - len(self._busy) - idle

    @property
    def exhausted(self) -> bool:
        """True when too few healthy nodes remain to form even one group."""
        return self.capacity == 0

    @property
    def exhausted_reason(self) -> str:
        """Why no group can form: the quarantined nodes with their reasons, and the healthy ones
        when some are left (too few for a group; not "every node")."""
        with self._lock:
            bad = [f"{h}: {r}" for h, r in self._quarantined.items()]
            healthy = [h for h in self._hosts if h not in self._quarantined]
        if not healthy:
            return f"{EXHAUSTED[0]} ({_few(bad)})"
        verb = "is" if len(healthy) == 1 else "are"
        return (f"{EXHAUSTED[1]} of {self._per_trial}: quarantined {_few(bad)}; "
                f"{_few(healthy, ', ')} {verb} healthy")  # fmt: skip


def _few(items: Sequence[str], sep: str = "; ", shown: int = 3) -> str:
    """The first ``shown`` of ``items`` and how many more (a pool may hold thousands)."""
    more = f"{sep}and {len(items) - shown:,} more" if len(items) > shown else ""
    return sep.join(items[:shown]) + more


def _as_fault(error: NodeFault) -> tuple[str, str, bool]:
    if isinstance(error, str):
        return error, "node error", False
    if len(error) == 2:
        return error[0], error[1], False
    return error[0], error[1], bool(error[2])
