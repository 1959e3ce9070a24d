"""A restarted worker takes over the batch jobs (Slurm) a dead predecessor left queued or running.

A batch job outlives the tuner that submitted it: killing ``tune run`` with SIGKILL leaves its
Slurm jobs in the queue. When ``tune run`` starts again, every launched trial still RUNNING in the
storage whose worker is dead (its process is gone from this machine, or its leases expired) and
whose job Slurm still knows (found by the job name the trial's token gives) is adopted: this
worker holds as many node slots as the trial holds (a proxy's ``proxy_nodes``, not a full
trial's) and the leases for them, beats for it, watches the job and records its result like its
own. Jobs of the study that belong to no live trial (the trial was already
ended; or, for a trial launched by an older tuner that recorded the token after ``sbatch``, the
tuner died in between) are cancelled.

Executors without batch jobs (local, SSH: their processes die with the tuner's session or are
reaped by the token) have no ``attach`` and are left to :mod:`tuner.study.recovery`.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config.parallel import ParallelConfig
from tuner.launch import LaunchRequest
from tuner.layout import ResultsLayout
from tuner.space.cost import trial_limit_s
from tuner.space.trials import config_from_params
from tuner.spec.study import StudySpec
from tuner.study.leases import Lease, Leases
from tuner.study.schedule import Placement, Scheduler, live_running
from tuner.study.storage import record_heartbeats

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Adopted:
    """A dead worker's trial whose job this worker now watches."""

    trial: optuna.Trial
    config: ParallelConfig
    job: Any  # tuner.launch.Job
    placement: Placement


def trial_nodes(spec: StudySpec, attrs: Mapping[str, Any]) -> int:
    """Nodes a launched trial holds: its proxy's (``proxy_nodes``, recorded before it started)
    or a full trial's."""
    return int(attrs["proxy_nodes"]) if attrs.get("proxy") else spec.nodes_per_trial


def worker_dead(worker: str) -> bool:
    """Whether a worker (``host:pid:nonce``) of this machine has no process any more (other
    machines' workers are judged by their leases)."""
    host, _, rest = worker.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Reattach:
    """Adopts a dead worker's batch jobs and cancels the study's stray ones (module docstring)."""

    def __init__(
        self, spec: StudySpec, study: optuna.Study, storage: optuna.storages.BaseStorage,
        executor: Any, scheduler: Scheduler, leases: Leases, layout: ResultsLayout, *,
        study_id: int, worker: str, heartbeat_s: float, on_adopt: Callable[[Adopted], None],
    ) -> None:  # fmt: skip
        self.spec, self.study, self.storage, self.executor = spec, study, storage, executor
        self.scheduler, self.leases, self.layout = scheduler, leases, layout
        self.study_id, self.worker, self.heartbeat_s = study_id, worker, heartbeat_s
        self.on_adopt = on_adopt
        self.watched: set[str] = set()
        """Tokens of the jobs this worker adopted. One adoption may happen inside another: the
        slot the first needs is leased by a second dead trial, which the scheduler adopts on the
        way (:meth:`adopt_lease`); the trials read before must not adopt that one again."""
        if hasattr(executor, "attach"):
            scheduler.adopt = self.adopt_lease

    def adopt_lease(self, lease: Lease) -> bool:
        """Before the scheduler cleans up an expired lease of a dead worker: adopt its trial's
        job instead, when Slurm still has it; True when adopted (nothing to clean up)."""
        trials = self.study.get_trials(deepcopy=False)
        found = [t for t in trials if t.number == lease.trial
                 and t.user_attrs.get("token") == lease.token]  # fmt: skip
        if not found or found[0].state != TrialState.RUNNING:
            return False
        adopted = self._adopt(found[0])
        if adopted is not None:
            self.on_adopt(adopted)
        return adopted is not None

    def run(self, trials: list[FrozenTrial], watching: set[str]) -> None:
        """Adopt what can be adopted (``on_adopt`` each), cancel the rest of the study's jobs;
        ``watching``: the tokens of the jobs this worker already watches."""
        if not hasattr(self.executor, "attach"):
            return
        alive = {t.number for t in live_running(trials, self.leases, self.worker,
                                                self.heartbeat_s)}  # fmt: skip
        for t in trials:
            # ``trials`` was read before: a trial adopted inside an earlier adoption still
            # reads as lost there, and a second adoption would find no slot and cancel its job
            if self._lost(t, alive) and t.user_attrs["token"] not in self.watched:
                found = self._adopt(t)
                if found is not None:
                    self.on_adopt(found)
        keep = watching | self.watched
        live = {t.number for t in trials if t.state == TrialState.RUNNING
                and t.number in alive and not self._lost(t, alive)}  # fmt: skip
        self._cancel_strays(trials, keep, live)

    def _lost(self, t: FrozenTrial, alive: set[int]) -> bool:
        attrs = t.user_attrs
        worker = str(attrs.get("worker", ""))
        return (
            t.state == TrialState.RUNNING
            and bool(attrs.get("launched") and attrs.get("token") and attrs.get("hosts"))
            and worker != self.worker
            and (t.number not in alive or worker_dead(worker))
        )

    def _request(self, t: FrozenTrial) -> LaunchRequest:
        hosts = tuple(t.user_attrs.get("hosts", ())) or ("slurm-0",)
        return LaunchRequest(
            trial=t.number, hosts=hosts, scripts=("",) * len(hosts),
            paths=self.layout.trial(t.number), node_dir=t.user_attrs.get("node_dir"),
            timeout_s=self._limit_s(t),
        )  # fmt: skip

    def _limit_s(self, t: FrozenTrial) -> float:
        """The limit ``t`` was launched with (its worker recorded it: it may have been cut from
        a start-up measured since); a trial of an older tuner, the study's limit for it."""
        given = t.user_attrs.get("limit_s")
        return (
            float(given)
            if given
            else trial_limit_s(self.spec, t.user_attrs.get("predicted_step_s"))
        )

    def _adopt(self, t: FrozenTrial) -> Adopted | None:
        token = str(t.user_attrs["token"])
        job_id = t.user_attrs.get("job_id")
        job = self.executor.attach(
            self._request(t), token, None if job_id is None else str(job_id)
        )
        if job is None:
            return None  # Slurm forgot it: tuner.study.recovery keeps or re-runs its result
        dead = str(t.user_attrs.get("worker"))
        for lease in self.leases.held():
            if lease.holder == dead and lease.trial == t.number:
                self.leases.take_over(lease)
        placement = self.scheduler.acquire(trial_nodes(self.spec, t.user_attrs))
        if placement is None:  # more lost jobs than slots: end it, recovery re-runs it
            logger.warning("trial %d: no free slot to watch its job on; cancelling it", t.number)
            job.cancel()
            return None
        node_dir = t.user_attrs.get("node_dir")
        self.scheduler.launched(placement, t.number, token, node_dir)
        self.watched.add(token)
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, t.number)
        trial = optuna.Trial(self.study, trial_id)
        trial.set_user_attr("worker", self.worker)
        trial.set_user_attr("reattached_from", dead)
        record_heartbeats(self.storage, self.study_id, (t.number,))
        logger.info("trial %d: watching its job again (worker %s died)", t.number, dead)
        return Adopted(trial, config_from_params(self.spec, t.params), job, placement)

    def _cancel_strays(self, trials: list[FrozenTrial], keep: set[str], live: set[int]) -> None:
        dirs = [str(self.layout.trial(0).dir.resolve())]
        dirs += [str(t.user_attrs["node_dir"]) for t in trials if t.user_attrs.get("node_dir")]
        by_number = {t.number: t for t in trials}
        for job_id, number, token in self.executor.study_jobs(dirs):
            if token in keep or number in live:
                continue
            t = by_number.get(number)
            request = self._request(t) if t is not None else LaunchRequest(
                trial=number, hosts=("slurm-0",), scripts=("",),
                paths=self.layout.trial(number),
            )  # fmt: skip
            logger.warning("Slurm job %s (trial %d) belongs to no live trial: cancelling it",
                           job_id, number)  # fmt: skip
            try:
                self.executor.reap_lost(request, token)
            except Exception as exc:  # a stuck job must not stop the study
                logger.error("cannot cancel Slurm job %s: %s", job_id, exc)
