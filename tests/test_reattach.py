"""tuner.study.reattach: a restarted worker adopts each batch job a dead worker left, once.

A small fake batch executor stands for Slurm here; the real one is in
``tests/launch/test_slurm_reattach.py``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

from optuna.trial import TrialState

from tests.test_study import SURFACE, study_data
from tuner.launch import LaunchRequest
from tuner.spec.file import study_from_mapping
from tuner.study.build import build_loop
from tuner.study.holder import worker_name


class Queued:
    """A job the batch scheduler still holds: it never ends in this test."""

    def __init__(self, batch: Batch, token: str, job_id: str) -> None:
        self.batch, self.token, self.job_id = batch, token, job_id

    def poll(self) -> None:
        return None

    def cancel(self) -> None:
        self.batch.cancelled.append(self.job_id)


class Batch:
    """A batch scheduler's executor (as Slurm's): its jobs outlive the worker that submitted
    them and are found again by their token; every cancel is recorded."""

    def __init__(self, jobs: dict[str, tuple[int, str]]) -> None:
        self.jobs = jobs  # token -> (trial, job id)
        self.cancelled: list[str] = []
        self.attached: list[int] = []

    def master_port(self, hosts: object, preferred: int) -> int:
        return preferred

    def master_addr(self, hosts: tuple[str, ...]) -> str:
        return hosts[0]

    def attach(self, request: LaunchRequest, token: str, job_id: str | None = None) -> Queued:
        self.attached.append(request.trial)
        return Queued(self, token, self.jobs[token][1])

    def study_jobs(self, trial_dirs: Collection[str]) -> list[tuple[str, int, str]]:
        return [(job_id, trial, token) for token, (trial, job_id) in self.jobs.items()]

    def reap_lost(self, request: LaunchRequest, token: str) -> list[str]:
        self.cancelled.append(self.jobs[token][1])
        return []

    def close(self) -> None:
        pass


def _dead_worker() -> str:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    name = worker_name(child.pid)
    child.kill()
    child.wait()
    return name


def test_a_job_adopted_on_the_way_to_another_is_not_adopted_again_and_cancelled(
    tmp_path: Path,
) -> None:
    """The dead worker's trial 0 hit a rendezvous port another program held and ran again as
    trial 2 on local-0, while trial 1 ran on local-1. Adopting trial 1 first, the scheduler was
    offered local-0, leased by trial 2, and adopted trial 2 on the way; the loop over the
    trials read before then adopted trial 2 a second time, found no slot left and cancelled
    its job, which the worker was watching: the trial was run again (the user paid twice)."""
    data = study_data(tmp_path, SURFACE, n_trials=4, nodes_per_trial=1)
    spec = study_from_mapping(data)
    batch = Batch({"tok1": (1, "3"), "tok2": (2, "4")})
    loop = build_loop(spec, results=str(tmp_path / "results"), executor=batch)
    dead = _dead_worker()
    asked = [loop.next_config() for _ in range(3)]
    trials = [a[0] for a in asked if a is not None]
    assert [t.number for t in trials] == [0, 1, 2]
    trials[0].set_user_attr("outcome", "node_error")
    loop.study.tell(trials[0], state=TrialState.FAIL)
    for trial, node, port in ((trials[1], "local-1", 29501), (trials[2], "local-0", 29502)):
        token = f"tok{trial.number}"
        for key, value in {"worker": dead, "launched": True, "hosts": [node], "token": token,
                           "job_id": batch.jobs[token][1], "limit_s": 120.0}.items():  # fmt: skip
            trial.set_user_attr(key, value)
        held = (f"host:{node}", f"port:{node}:{port}")
        loop.leases.claim(held, dead, hosts=(node,))
        loop.leases.attach(dead, held, trial=trial.number, token=token, hosts=(node,))
    loop.recover()
    assert batch.cancelled == [], "a job the worker watches was cancelled"
    assert sorted(batch.attached) == [1, 2] and sorted(loop.running) == [1, 2]
    assert {r.job.job_id for r in loop.running.values()} == {"3", "4"}
    stored = {t.number: t for t in loop.study.get_trials(deepcopy=False)}
    assert all(stored[n].state == TrialState.RUNNING for n in (1, 2))
    assert all(stored[n].user_attrs["reattached_from"] == dead for n in (1, 2))
