"""Slurm executor latencies on the throw-away local Slurm (tools/local_slurm.py): figures printed.

    python benchmarks/slurm_latency.py [--rounds 5] [--nodes 2] [--poll 0.2]

Starts munged, slurmctld and N slurmd under a temporary directory (needs root and Debian's
``slurmctld slurmd slurm-client munge``), then per round submits one trial of N nodes through
:class:`~tuner.launch.slurm.SlurmExecutor` and measures, by this machine's wall clock:

* **submit -> running**: from ``submit()`` to the executor first seeing the job RUNNING (Slurm's
  scheduling pass, ``sched_interval=1`` in the local slurm.conf, plus the tuner's poll interval);
* **finish -> recorded**: from the last node script's last line (a timestamp it writes) to the
  executor's result (Slurm ending the job, the poll interval, sacct / scontrol, the reaper);
* **scancel -> gone**: ``Job.cancel()`` of a running trial until Slurm reports it ended and the
  token reaper found nothing left.

A real cluster adds its own controller load and ``sched_interval`` (often 60 s for the main
scheduler; backfill every 30 s): these figures are the tuner's own share.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.local_slurm import LocalSlurm, slurm_missing_reason  # noqa: E402
from tuner.launch import LaunchRequest  # noqa: E402
from tuner.launch.slurm import SlurmExecutor, SlurmJob  # noqa: E402
from tuner.layout import ResultsLayout  # noqa: E402
from tuner.spec.study import SlurmSpec  # noqa: E402

# The node script stamps the moment it is done, just before exiting.
FINISH = 'sleep 1\ndate +%s.%N > "finished-$SLURM_NODEID"\n'
SLEEP = "sleep 600\n"


def _request(layout: ResultsLayout, n: int, nodes: int, script: str) -> LaunchRequest:
    return LaunchRequest(trial=n, hosts=tuple(f"slurm-{k}" for k in range(nodes)),
                         scripts=(script,) * nodes, paths=layout.trial(n))  # fmt: skip


def _until_running(job: SlurmJob, started: float) -> float:
    while job.state not in ("RUNNING", "COMPLETING") and job.poll() is None:
        time.sleep(0.01)
    return time.time() - started


def one_round(ex: SlurmExecutor, layout: ResultsLayout, n: int, nodes: int) -> dict[str, float]:
    started = time.time()
    job = ex.submit(_request(layout, 2 * n, nodes, FINISH))
    assert isinstance(job, SlurmJob)
    to_running = _until_running(job, started)
    while job.poll() is None:
        time.sleep(0.01)
    recorded = time.time()
    stamps = [float((job.paths.dir / f"finished-{k}").read_text()) for k in range(nodes)]
    started = time.time()
    sleeper = ex.submit(_request(layout, 2 * n + 1, nodes, SLEEP))
    assert isinstance(sleeper, SlurmJob)
    _until_running(sleeper, started)
    cancel_at = time.time()
    sleeper.cancel()
    return {"submit_to_running_s": to_running, "finish_to_recorded_s": recorded - max(stamps),
            "scancel_to_gone_s": time.time() - cancel_at}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--poll", type=float, default=0.2, help="cluster.slurm.poll_interval_s")
    args = p.parse_args()
    reason = slurm_missing_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    with tempfile.TemporaryDirectory(prefix="tuner-slurm-bench-") as tmp:
        cluster = LocalSlurm(Path(tmp) / "slurm", args.nodes)
        t0 = time.time()
        cluster.start()
        print(f"local Slurm with {args.nodes} nodes up in {time.time() - t0:.1f} s")
        ex = SlurmExecutor(SlurmSpec(poll_interval_s=args.poll), env=cluster.env)
        layout = ResultsLayout(Path(tmp) / "results", "bench")
        rows = []
        try:
            for n in range(args.rounds):
                rows.append(one_round(ex, layout, n, args.nodes))
                print(f"round {n + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in rows[-1].items()))
        finally:
            ex.close()
            survivors = cluster.stop()
        print(f"{args.nodes}-node trials, poll interval {args.poll} s, {args.rounds} rounds; "
              "accounting: " + (ex.accounting.disabled or "sacct"))  # fmt: skip
        for key in rows[0]:
            values = [r[key] for r in rows]
            print(f"  {key:22s} median {statistics.median(values):6.2f}  max {max(values):6.2f}")
        if survivors:
            print(f"local Slurm left processes: {survivors}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
