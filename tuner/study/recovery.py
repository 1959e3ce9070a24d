"""After a worker died or the storage failed: clean up, keep what was measured, run the rest.

Called when a worker starts and every heartbeat period after. A launched trial still RUNNING
whose worker holds no live lease any more is failed (Optuna's own heartbeat check does the same
on SQL storages; this also covers journal files, which have no heartbeats). A lost trial whose
job had finished keeps its measurement, read back from its folder; every other interrupted,
lost or node-error trial, and those the user asked to ``--rerun``, is queued once to run again.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.catalog import GPUSpec
from tuner.layout import ResultsLayout
from tuner.models.rates import Rates
from tuner.outcome import Outcome
from tuner.space.trials import (
    RETRYABLE,
    config_from_params,
    current_params,
    is_duplicate,
    runs_again,
)
from tuner.spec.study import StudySpec
from tuner.study.leases import Leases
from tuner.study.proxy import trial_verdict
from tuner.study.record import recovered_metrics
from tuner.study.schedule import end_lost_trial, live_running

logger = logging.getLogger(__name__)


class Recovery:
    """What a worker does for trials that no live worker is watching."""

    def __init__(
        self, spec: StudySpec, study: optuna.Study, storage: optuna.storages.BaseStorage,
        leases: Leases, executor: Any, layout: ResultsLayout, gpu: GPUSpec, *,
        study_id: int, worker: str, heartbeat_s: float, rerun: frozenset[Outcome],
        rates: Rates | None = None,
    ) -> None:  # fmt: skip
        self.spec, self.study, self.storage, self.leases = spec, study, storage, leases
        self.executor, self.layout, self.gpu = executor, layout, gpu
        self.worker, self.heartbeat_s, self.rerun = worker, heartbeat_s, rerun
        self._study_id = study_id
        self.rates = rates
        """The time model's rates a recovered proxy is extrapolated with: the loop's (the
        cluster profile's when there is one), as for a job the loop watched."""

    def run(self, trials: Callable[[], list[FrozenTrial]]) -> None:
        """Fail dead workers' trials, recover or re-queue every lost one (once)."""
        self._fail_dead(trials())
        requeued = set(self.study.user_attrs.get("requeued", []))
        again = [
            t for t in trials()
            if t.number not in requeued and t.params and t.state.is_finished()
            and not is_duplicate(t) and runs_again(t, self.rerun)
        ]  # fmt: skip
        for t in again:
            hosts = tuple(t.user_attrs.get("hosts", ()))
            if "outcome" not in t.user_attrs and t.user_attrs.get("token") and hosts:
                # its worker died: its processes may still run
                end_lost_trial(
                    self.executor,
                    self.layout,
                    t.number,
                    hosts,
                    str(t.user_attrs["token"]),
                    t.user_attrs.get("node_dir"),
                )
        for t in again:
            if not self._recovered(t):
                self.study.enqueue_trial(current_params(t.params))
            requeued.add(t.number)
        if again:
            self.study.set_user_attr("requeued", sorted(requeued))
            logger.info("re-running %d interrupted, lost or node-error trials", len(again))

    def _fail_dead(self, trials: list[FrozenTrial]) -> None:
        if isinstance(self.storage, optuna.storages.RDBStorage):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)
        alive = {t.number for t in live_running(trials, self.leases, self.worker,
                                                self.heartbeat_s)}  # fmt: skip
        for t in trials:
            if t.state != TrialState.RUNNING or not t.user_attrs.get("launched"):
                continue
            if t.number in alive:
                continue
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(
                self._study_id, t.number
            )
            try:
                self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
            except (RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
                continue  # finished or failed by someone else meanwhile
            logger.warning("trial %d: its worker %s stopped beating", t.number,
                           t.user_attrs.get("worker"))  # fmt: skip

    def _recovered(self, t: FrozenTrial) -> bool:
        """Record a lost trial's measurement from its folder (its job had finished); True if
        that was possible."""
        if "outcome" in t.user_attrs or not t.user_attrs.get("launched"):
            return False
        paths = self.layout.trial(t.number)
        config = config_from_params(self.spec, t.params)  # a proxy's figure is extrapolated
        verdict = trial_verdict(self.spec, self.gpu, self.rates, t.user_attrs, config,
                                lambda ran: recovered_metrics(ran, self.gpu, paths))  # fmt: skip
        if verdict is None or verdict.outcome in RETRYABLE:
            return False
        attrs = {**t.user_attrs, **verdict.metrics, "outcome": str(verdict.outcome),
                 "reason": verdict.reason, "recovered_from": t.number}  # fmt: skip
        step = verdict.metrics.get("step_time_s")
        value = float(step) if verdict.outcome == Outcome.OK and step else None
        self.study.add_trial(optuna.trial.create_trial(
            params=t.params, distributions=t.distributions, user_attrs=attrs, value=value,
            state=TrialState.COMPLETE if value is not None else TrialState.PRUNED,
        ))  # fmt: skip
        logger.info("trial %d: its result was recovered from %s", t.number,
                    self.layout.trial(t.number).dir)  # fmt: skip
        return True
