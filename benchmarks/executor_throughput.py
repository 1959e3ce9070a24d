"""Slurm beside SSH on trivial trials: submit -> recorded, cancel -> gone, trials per minute.

    python benchmarks/executor_throughput.py [--trials 12] [--nodes 2] [--poll 0.2]

Starts a throw-away local Slurm (tools/local_slurm.py: munged, slurmctld, N slurmd) and N loopback
sshd nodes (tools/loopback_sshd.py: 127.0.0.2, ...), then through each executor:

* **submit -> recorded**: one 1-node trial whose script only exits, from ``submit()`` until the
  executor returns its result (scheduling, start-up, the poll interval, the reaper);
* **cancel -> gone**: ``Job.cancel()`` of a running ``sleep`` trial until it returns (the
  executor's reaper has checked that no process of the trial is left);
* **trials per minute**: ``--trials`` trivial 1-node trials, one per node at a time, as the study
  loop runs them with ``nodes_per_trial: 1``.

Figures are printed, never asserted: this machine is shared and noisy. A real Slurm adds its
controller's scheduling interval (often tens of seconds): these are the tuner's own costs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.local_slurm import LocalSlurm, slurm_missing_reason  # noqa: E402
from tools.loopback_sshd import LoopbackCluster, sshd_missing_reason  # noqa: E402
from tuner.launch import LaunchRequest  # noqa: E402
from tuner.launch.slurm import SlurmExecutor  # noqa: E402
from tuner.launch.ssh import SSHExecutor  # noqa: E402
from tuner.layout import ResultsLayout  # noqa: E402
from tuner.spec.study import SlurmSpec, SSHSpec  # noqa: E402


class Bench:
    """One executor, its node names and a results folder of its own."""

    def __init__(self, name: str, executor: Any, hosts: tuple[str, ...], base: Path) -> None:
        self.name, self.ex, self.hosts = name, executor, hosts
        self.layout = ResultsLayout(base / name, "bench")
        self.number = 0

    def submit(self, host: str, script: str) -> Any:
        self.number += 1
        return self.ex.submit(LaunchRequest(trial=self.number, hosts=(host,), scripts=(script,),
                                            paths=self.layout.trial(self.number)))  # fmt: skip


def _wait(job: Any) -> None:
    while job.poll() is None:
        time.sleep(0.01)


def latency(b: Bench, rounds: int) -> dict[str, float]:
    recorded, gone = [], []
    for _ in range(rounds):
        t0 = time.time()
        _wait(b.submit(b.hosts[0], "exit 0\n"))
        recorded.append(time.time() - t0)
        sleeper = b.submit(b.hosts[0], "sleep 600\n")
        time.sleep(1.5)  # running by now on both executors (submit -> running is ~1 s on Slurm)
        t0 = time.time()
        sleeper.cancel()
        gone.append(time.time() - t0)
    return {"submit_to_recorded_s": statistics.median(recorded),
            "cancel_to_gone_s": statistics.median(gone)}  # fmt: skip


def throughput(b: Bench, trials: int) -> float:
    """Trivial trials per minute, one per node at a time."""
    started, running, free = time.time(), {}, list(b.hosts)
    left = trials
    while left or running:
        while left and free:
            host = free.pop()
            running[host] = b.submit(host, "exit 0\n")
            left -= 1
        for host, job in list(running.items()):
            if job.poll() is not None:
                del running[host]
                free.append(host)
        time.sleep(0.01)
    return trials / (time.time() - started) * 60.0


def run(name: str, make: Callable[[], Bench], args: argparse.Namespace) -> dict[str, float]:
    b = make()
    try:
        out = latency(b, args.rounds)
        out["trials_per_min"] = throughput(b, args.trials)
    finally:
        b.ex.close()
    print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in out.items()))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--poll", type=float, default=0.2, help="cluster.slurm.poll_interval_s")
    args = p.parse_args()
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="tuner-exec-bench-") as tmp:
        base = Path(tmp)
        reason = slurm_missing_reason()
        if reason is None:
            cluster = LocalSlurm(base / "slurm", args.nodes)
            cluster.start()
            try:
                hosts = tuple(f"slurm-{k}" for k in range(args.nodes))
                ex = SlurmExecutor(SlurmSpec(poll_interval_s=args.poll), env=cluster.env)
                rows["slurm"] = run("slurm", lambda: Bench("slurm", ex, hosts, base), args)
            finally:
                left = cluster.stop()
            if left:
                print(f"local Slurm left processes: {left}")
        else:
            print(f"slurm skipped: {reason}")
        reason = sshd_missing_reason()
        if reason is None:
            with LoopbackCluster(base / "sshd", args.nodes) as nodes:
                ssh = SSHSpec(
                    config_file=str(nodes.ssh_config), known_hosts=str(nodes.known_hosts)
                )
                rows["ssh"] = run("ssh", lambda: Bench("ssh", SSHExecutor(ssh), nodes.names, base),
                                  args)  # fmt: skip
        else:
            print(f"ssh skipped: {reason}")
    if rows:
        keys = list(next(iter(rows.values())))
        print(f"\n{'executor':10s}" + "".join(f"{k:>24s}" for k in keys))
        for name, row in rows.items():
            print(f"{name:10s}" + "".join(f"{row[k]:24.2f}" for k in keys))
        print(f"({args.nodes} nodes, {args.trials} trials, Slurm poll {args.poll} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
