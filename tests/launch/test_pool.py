"""NodePool: disjoint groups, unique ports, quarantine, thread safety."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from tests.test_study import SURFACE, study_data
from tuner.errors import ConfigError
from tuner.launch import NodeGroup, NodePool
from tuner.spec.file import study_from_mapping
from tuner.study.build import build_loop

HOSTS = [f"gpu{i:03d}" for i in range(8)]


def test_groups_are_disjoint_until_released() -> None:
    pool = NodePool(HOSTS, 3)
    a, b = pool.acquire(), pool.acquire()
    assert a is not None and b is not None
    assert a.hosts == ("gpu000", "gpu001", "gpu002") and a.master_host == "gpu000"
    assert not set(a.hosts) & set(b.hosts)
    assert pool.acquire() is None  # only 2 nodes left
    pool.release(a)
    c = pool.acquire()
    assert c is not None and not set(c.hosts) & set(b.hosts)


def test_the_stop_reason_names_the_quarantined_node_not_every_node(tmp_path: Path) -> None:
    """One node of two quarantined, two nodes per trial: the study stopped saying "every node is
    quarantined", sending the user to a node that was never at fault."""
    data = study_data(tmp_path, SURFACE, nodes_per_trial=2)
    loop = build_loop(study_from_mapping(data), results=str(tmp_path / "results"))
    with loop.executor:
        group = loop.pool.acquire()
        assert group is not None
        for _ in range(2):
            loop.pool.release(group, node_errors=[("local-1", "connection refused")])
            group = loop.pool.acquire() or group
        assert loop.step() is False
    assert loop.summary.failed == loop.summary.stop_reason  # tune run exits 1
    assert loop.summary.stop_reason == (
        "too few nodes left for a trial of 2: quarantined local-1: connection refused; "
        "local-0 is healthy"
    )
    pool = NodePool(HOSTS[:1], 1, quarantine_after=1)
    pool.release(pool.acquire() or group, node_errors=[("gpu000", "auth refused")])
    assert pool.exhausted_reason == "every node is quarantined (gpu000: auth refused)"
    pool = NodePool(HOSTS, 8, quarantine_after=1)
    pool.release(pool.acquire() or group, node_errors=[(h, "down") for h in HOSTS[:5]])
    assert pool.exhausted_reason == (
        "too few nodes left for a trial of 8: quarantined gpu000: down; gpu001: down; gpu002: "
        "down; and 2 more; gpu005, gpu006, gpu007 are healthy"
    )


def test_concurrent_groups_get_distinct_ports_and_a_released_port_is_not_reused_at_once() -> None:
    pool = NodePool(HOSTS, 1, base_port=30000)
    groups = [pool.acquire() for _ in range(8)]
    ports = [g.master_port for g in groups if g is not None]
    assert len(set(ports)) == 8 and min(ports) == 30000
    first = groups[0]
    assert first is not None
    pool.release(first)
    again = pool.acquire()
    assert again is not None and again.master_port not in ports


def test_quarantine_after_repeated_node_errors_and_reset_by_success() -> None:
    pool = NodePool(HOSTS[:4], 2, quarantine_after=2)
    g = pool.acquire()
    assert g is not None
    assert pool.release(g, node_errors=[("gpu000", "connection refused")]) == []
    g = pool.acquire()
    assert g is not None and g.hosts[0] == "gpu000"
    pool.release(g)  # clean: the strike is forgiven
    for _ in range(2):
        g = pool.acquire()
        assert g is not None
        newly = pool.release(g, node_errors=[("gpu001", "auth refused")])
    assert newly == ["gpu001"]
    assert pool.quarantined == {"gpu001": "auth refused"}
    assert pool.capacity == 1
    g = pool.acquire()
    assert g is not None and "gpu001" not in g.hosts
    assert g.hosts == ("gpu000", "gpu002")
    pool.release(g, node_errors=["gpu002", "gpu003"])  # gpu003 is not in the group: ignored
    g = pool.acquire()
    assert g is not None
    pool.release(g, node_errors=["gpu002"])
    assert sorted(pool.quarantined) == ["gpu001", "gpu002"]
    g = pool.acquire()
    assert g is not None and g.hosts == ("gpu000", "gpu003")
    pool.release(g, node_errors=["gpu000"])
    pool.release(pool.acquire() or g, node_errors=["gpu000"])
    assert pool.exhausted and pool.acquire() is None


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ConfigError, match="search.nodes_per_trial"):
        NodePool(HOSTS[:2], 3)
    with pytest.raises(ConfigError, match="listed twice"):
        NodePool(["a", "a"], 1)
    pool = NodePool(HOSTS, 2)
    with pytest.raises(ValueError, match="not in use"):
        pool.release(NodeGroup(id=99, hosts=("gpu000",), master_port=29500))


def test_more_nodes_than_ports_left_says_the_limit_and_why() -> None:
    """36,037 nodes from the default port 29500 said "master port 29500 out of range": a valid
    port; the limit is the ports from it, one per trial running at once, up to 65535 itself
    (36,036 nodes from 29500 were refused, one short of it)."""
    hosts = [f"n{i}" for i in range(65535 - 29500 + 2)]
    NodePool(hosts[:-1], 1)  # the most from this port: the last group's port is 65535
    with pytest.raises(ConfigError) as refused:
        NodePool(hosts, 1)
    assert refused.value.path == "launch.master_port"
    assert refused.value.reason == (
        "36,037 nodes need up to 36,037 master ports from 29500 (one per trial running at "
        "once), past the last port 65535: at most 36,036 nodes from this port; a lower one "
        "allows more"
    )
    NodePool(hosts, 1, base_port=29499)
    pool = NodePool([f"n{i}" for i in range(100)], 1, base_port=65436)  # its 100 ports
    ports = [group.master_port for group in iter(pool.acquire, None)]
    assert sorted(ports) == list(range(65436, 65536))  # each handed out, 65535 the last
    with pytest.raises(ConfigError, match="master port 65437 out of range"):
        NodePool(["a"], 1, base_port=65437)


def test_thread_safety_no_node_or_port_is_ever_shared() -> None:
    pool = NodePool(HOSTS, 2)
    held: dict[int, NodeGroup] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            g = pool.acquire()
            if g is None:
                continue
            with lock:
                for other in held.values():
                    if set(other.hosts) & set(g.hosts) or other.master_port == g.master_port:
                        errors.append(f"{g} overlaps {other}")
                held[g.id] = g
            time.sleep(rng.random() / 10000)
            with lock:
                del held[g.id]
            pool.release(g)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pool.in_use == ()


def test_smaller_groups_for_proxy_trials_share_the_nodes_disjointly() -> None:
    pool = NodePool([f"n{i}" for i in range(4)], 4)
    a = pool.acquire(size=2)
    b = pool.acquire(size=2)
    assert a is not None and b is not None and a.size == b.size == 2
    assert not set(a.hosts) & set(b.hosts) and a.master_port != b.master_port
    assert pool.free_count == 0 and pool.acquire(size=1) is None and pool.acquire() is None
    pool.release(a)
    assert pool.free_count == 2 and pool.acquire() is None  # a full group needs all 4
    c = pool.acquire(size=1)
    assert c is not None and c.hosts == (a.hosts[0],) and pool.free_count == 1


class _ScanningPool:
    """The pool's hand-out rule written as a scan (what :class:`NodePool` did on every call,
    over every host and every group in use): the first free, healthy, not avoided hosts in the
    order given, and the next port in rotation that no group in use holds."""

    def __init__(self, hosts: list[str], per_trial: int, quarantine_after: int) -> None:
        self.hosts, self.per_trial, self.after = hosts, per_trial, quarantine_after
        self.busy: set[str] = set()
        self.groups: dict[int, tuple[tuple[str, ...], int]] = {}
        self.strikes: dict[str, int] = {}
        self.quarantined: set[str] = set()
        self.next_id = self.next_port = 0

    def acquire(self, avoid: set[str], size: int) -> tuple[tuple[str, ...], int] | None:
        out = self.busy | self.quarantined | avoid
        free = [h for h in self.hosts if h not in out]
        if len(free) < size:
            return None
        used = {port for _, port in self.groups.values()}
        while 29500 + self.next_port in used:
            self.next_port = (self.next_port + 1) % 100
        port, self.next_port = 29500 + self.next_port, (self.next_port + 1) % 100
        self.groups[self.next_id] = (tuple(free[:size]), port)
        self.busy.update(free[:size])
        self.next_id += 1
        return self.groups[self.next_id - 1]

    def release(self, gid: int, faults: set[str]) -> None:
        hosts, _ = self.groups.pop(gid)
        self.busy.difference_update(hosts)
        for h in hosts:
            if h not in faults:
                self.strikes.pop(h, None)
                continue
            self.strikes[h] = self.strikes.get(h, 0) + 1
            if self.strikes[h] >= self.after:
                self.quarantined.add(h)


def test_the_incremental_hand_out_is_the_scan_s() -> None:
    """``acquire`` keeps the free hosts in a heap and the ports in use in a set instead of
    scanning every host and every group on each call (36,036 single-node acquires took 221 s):
    over 3,000 random acquires (avoided hosts, smaller groups), releases and quarantines, every
    group, port and free count is the scan's."""
    rng = random.Random(7)
    hosts = [f"n{i:02d}" for i in range(40)]
    pool, scan = NodePool(hosts, 3, quarantine_after=2), _ScanningPool(hosts, 3, 2)
    held: list[NodeGroup] = []
    for _ in range(3000):
        if held and rng.random() < 0.45:
            group = held.pop(rng.randrange(len(held)))
            faults = {h for h in group.hosts if rng.random() < 0.05}
            pool.release(group, [(h, "lost") for h in faults])
            scan.release(group.id, faults)
        else:
            avoid = set(rng.sample(hosts, rng.choice((0, 0, 3, 12))))
            size = rng.choice((None, None, 1, 2))
            got = pool.acquire(avoid, size)
            want = scan.acquire(avoid, size or 3)
            assert (None if got is None else (got.hosts, got.master_port)) == want
            if got is not None:
                held.append(got)
        free = len(hosts) - len(scan.busy | scan.quarantined)
        assert pool.free_count == free and set(pool.quarantined) == scan.quarantined
