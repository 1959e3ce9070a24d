"""The study loop: ask -> config -> validate -> predict -> prune or launch -> parse -> tell.

One Optuna study per tuner study (:mod:`tuner.study.storage`), shared by any number of ``tune run``
workers. The objective is the measured steady-state step time in seconds (lower is better).

What never reaches a node: configs that break a framework rule, configs the memory model predicts
to OOM (recorded as pruned with their predicted peak), configs that need at least as much memory
as one that really ran out of memory, and configs already measured or running (answered from
that trial). Nodes are leased through the storage (:mod:`tuner.study.schedule`), so two workers
never run two trials on one node; what a finished trial measured is recorded by
:mod:`tuner.study.record`; a worker's loop is assembled by :func:`tuner.study.build.build_loop`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from tuner.calibrate.store import keep
from tuner.config.parallel import ParallelConfig
from tuner.config.spelling import spell
from tuner.errors import StorageError
from tuner.launch import NodePool, new_token
from tuner.layout import ResultsLayout
from tuner.models.rates import Rates
from tuner.outcome import Outcome, figure
from tuner.search.sampler import ModelGuidedSampler
from tuner.search.stopping import Stopper
from tuner.space.cost import trial_limit_s
from tuner.space.enumerate import SharedSpace, expand_axes, study_gpu
from tuner.space.trials import (
    RETRYABLE,
    config_from_params,
    config_params,
    distributions,
)
from tuner.space.trials import measured as trials_measured
from tuner.spec.study import StudySpec
from tuner.study.asking import ask, config_attrs
from tuner.study.budget import LaunchCosts, launch_refusal, spent_node_hours
from tuner.study.faults import StorageWatch
from tuner.study.holder import worker_name
from tuner.study.leases import BUDGET_LEASE, Leases, exclusive, give_back
from tuner.study.measure import Watch
from tuner.study.proxy import Proxies, full_scale_first
from tuner.study.reader import TrialReader
from tuner.study.reattach import Reattach
from tuner.study.record import (
    LAUNCH_ERRORS_STOP,
    Summary,
    Verdict,
    guarded,
    storage_errors,
    tell,
    write_metrics,
)
from tuner.study.recovery import Recovery
from tuner.study.schedule import Heartbeat, Placement, Running, Scheduler, live_running
from tuner.study.screen import Screen
from tuner.study.storage import record_heartbeats, set_user_attrs

logger = logging.getLogger(__name__)

__all__ = ["LAUNCH_ERRORS_STOP", "Launcher", "Running", "StudyLoop", "Summary"]


Launcher = Callable[[StudySpec, ParallelConfig, int, Any, Any, str], Any]
"""(spec, config, trial number, node group, trial paths, master address) -> LaunchRequest."""


def fastest(measured: Iterable[FrozenTrial]) -> FrozenTrial | None:
    """The fastest of ``measured`` (full scale over proxies); a stored step time that is no
    figure (:func:`tuner.outcome.figure`: NaN, infinite, zero, negative) never is."""
    done = full_scale_first([t for t in measured if figure(t.value) is not None])
    return min(done, key=lambda t: float(t.value or 0.0)) if done else None


class StudyLoop:
    """Runs one worker of a study until the budget is spent, the space is exhausted or stopped."""

    def __init__(
        self, spec: StudySpec, study: optuna.Study, executor: Any, pool: NodePool,
        layout: ResultsLayout, launcher: Launcher, *, storage: optuna.storages.BaseStorage,
        leases: Leases, n_trials: int | None = None, clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.2, on_update: Callable[[StudyLoop], None] | None = None,
        rerun: Collection[Outcome] = (), rates: Rates | None = None,
        space: SharedSpace | None = None,
    ) -> None:  # fmt: skip
        self.spec, self.study, self.executor, self.pool = spec, study, executor, pool
        self.layout, self.launcher, self.clock, self.poll_s = layout, launcher, clock, poll_s
        self.storage, self.leases, self.rerun = storage, leases, frozenset(rerun)
        self.n_trials = n_trials or spec.search.n_trials
        self.on_update = on_update
        self.gpu = study_gpu(spec)
        self.heartbeat_s = spec.search.heartbeat_s
        self.running: dict[int, Running] = {}
        self.summary = Summary()
        self.stop_requested: str | None = None
        self.started = clock()
        self.worker = worker_name()
        self.scheduler = Scheduler(pool, leases, executor, layout, self.worker,
                                   heartbeat_s=self.heartbeat_s)  # fmt: skip
        self._study_id = storage.get_study_id_from_name(spec.name)
        self._reader = TrialReader(storage, self._study_id)  # plain queries, finished kept
        self._asking: list[FrozenTrial] | None = None  # the trials next_config read, in its ask
        if isinstance(study.sampler, ModelGuidedSampler):  # its asks read the loop's trials
            study.sampler.trials_source = lambda: self._asking or self.trials()
        self.screen = Screen(spec, study, leases, self.gpu, self.summary, worker=self.worker,
                             heartbeat_s=self.heartbeat_s, rerun=self.rerun,
                             rates=rates, space=space)  # fmt: skip
        self.recovery = Recovery(spec, study, storage, leases, executor, layout, self.gpu,
                                 study_id=self._study_id, worker=self.worker,
                                 heartbeat_s=self.heartbeat_s,
                                 rerun=self.rerun, rates=rates)  # fmt: skip
        self.reattach = Reattach(spec, study, storage, executor, self.scheduler, leases, layout,
                                 study_id=self._study_id, worker=self.worker,
                                 heartbeat_s=self.heartbeat_s, on_adopt=self._watch)  # fmt: skip
        self.stopper = Stopper(spec, study.sampler)
        self.costs = LaunchCosts(spec, study.sampler)  # limits at the measured start-up
        self.proxies = Proxies(spec, self.gpu, rates, space.terms if space else None)
        self.watch = Watch(spec, self.proxies.full_step)  # a proxy raced on its full step
        self._over_budget: str | None = None
        self._consecutive_launch_errors = 0
        self._last_recover = clock()
        self._beating: tuple[int, ...] = ()
        self.storage_watch = StorageWatch(None, "the study storage")
        """What became of the storage file when it fails (set by
        :func:`tuner.study.build.build_loop`)."""
        self.space_counts: dict[str, Any] = {}
        """Counts over the whole space (``SpaceReport.counts``), set by :meth:`seed`."""

    # -- what the storage says ---------------------------------------------------------------

    def trials(self) -> list[FrozenTrial]:
        """All trials of the study (every worker's)."""
        return guarded("reading the study", self._reader.trials)

    def runs_done(self, trials: list[FrozenTrial]) -> int:
        """Finished runs that count against n_trials."""
        return self.screen.digest.of(trials).runs  # finished trials, each counted once

    def in_flight(self, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        """Launched trials running now on a live worker (this one or another)."""
        unfinished = self.screen.digest.of(trials).open  # (live_running reads only these)
        return live_running(unfinished, self.leases, self.worker, self.heartbeat_s)

    def launched_count(self, trials: list[FrozenTrial]) -> int:
        """Runs that count against n_trials: finished ones plus those running now."""
        return self.runs_done(trials) + len(self.in_flight(trials))

    def measured(self, trials: list[FrozenTrial]) -> dict[str, FrozenTrial]:
        """Config key -> the trial that measured it (ok outcome, not a duplicate)."""
        return trials_measured(trials)

    def best(self, trials: list[FrozenTrial]) -> FrozenTrial | None:
        """The fastest measured trial (:func:`fastest`)."""
        return fastest(self.measured(trials).values())

    # -- seeding and recovery ------------------------------------------------------------------

    def seed(self) -> None:
        """Enqueue the top predicted configs on a new study, and re-runs of interrupted trials.
        The ranking is the loop's one enumeration (the screen's, under the cluster profile's
        rates when there is one), so it is the order ``tune space`` prints."""
        report = self.screen.space.report()
        self.space_counts = report.counts()
        # The report's funnel reads them from the storage (enumerating a large space again
        # there would cost seconds).
        counts = self.space_counts
        guarded("recording the space", lambda: self.study.set_user_attr("space_counts", counts))
        if (
            not self.trials()
            and self.spec.search.enqueue_top
            and self.spec.search.sampler != "model"
        ):
            ranked = report.ranked()[: self.spec.search.enqueue_top]
            for cand in ranked:
                params = config_params(cand.config, expand_axes(self.spec))
                self.study.enqueue_trial(params, skip_if_exists=True)
            logger.info("enqueued the %d fastest predicted configs", len(ranked))
        self.recover()

    def recover(self) -> None:
        """Watch dead workers' batch jobs again (:mod:`tuner.study.reattach`), clean up after them
        and queue what must run again (:mod:`tuner.study.recovery`)."""
        self._last_recover = self.clock()
        self.reattach.run(self.trials(), {r.job.token for r in self.running.values()})
        self.recovery.run(self.trials)

    def _watch(self, a: Any) -> None:
        """Watch a dead worker's job from now on (:class:`tuner.study.reattach.Adopted`)."""
        self.running[a.trial.number] = Running(a.trial, a.config, a.job, a.placement, self.clock())
        self._beating = tuple(self.running)
        self.proxies.adopted(a.trial.user_attrs)  # a proxy: its size is what to ask for next

    # -- choosing the next config ----------------------------------------------------------------

    def next_config(
        self, trials: list[FrozenTrial] | None = None, max_asks: int = 300
    ) -> tuple[optuna.Trial, ParallelConfig] | None:
        """Ask until a config that may run comes up; None when the space looks exhausted (at
        once when every config of the space is taken: :meth:`Screen.exhausted`). ``trials``: a
        read of them just made (for the check, the sampler's ask, the screen; read again if
        refused)."""
        trials = self.trials() if trials is None else trials
        if self.screen.exhausted(trials, {r.config.key() for r in self.running.values()}):
            return None
        dists, attrs = distributions(self.spec), lambda p: config_attrs(self.spec, p)
        sampler = self.study.sampler
        for _ in range(max_asks):
            if isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(
                self.study
            ):
                return None
            with warnings.catch_warnings():  # heartbeats are recorded by the Heartbeat thread
                warnings.filterwarnings("ignore", message="Heartbeat of storage")
                self._asking = trials
                trial = ask(self.study, dists, attrs, self._reader.settled())  # one write
            self._asking = None  # (a failed ask ends the loop; the proxies' asks read afresh)
            config = config_from_params(self.spec, trial.params)
            if self.screen(trial, config, trials):
                return trial, config
            if self.stop_requested:
                return None
            trials = self.trials()
        return None

    # -- launching and recording ---------------------------------------------------------------

    def launch(self, trial: optuna.Trial, config: ParallelConfig, placement: Placement) -> None:
        """Render and start ``config`` on ``placement``; a launch failure is recorded."""
        group = placement.group
        spec, runs = self.proxies.launch_as(trial, config)  # a proxy's, or the config itself
        record = {"trial": trial.number, "config": runs.to_dict(), "hosts": list(group.hosts),
                  "predicted_step_s": (attrs := trial.user_attrs).get("predicted_step_s"),
                  "predicted_peak_gib": attrs.get("predicted_peak_gib")}  # fmt: skip
        try:
            paths, aside = self.layout.fresh_trial(trial.number)
            paths.dir.mkdir(parents=True, exist_ok=True)
            paths.config_yaml.write_text(json.dumps(record, indent=2) + "\n")  # JSON is YAML
        except OSError as exc:  # the results folder's fault, not the config's: tune stops, and
            # the trial runs again on resume (it stayed "running" for ever, never launched)
            why = f"its folder could not be made: {exc.strerror or exc}"
            self._finish(trial, config, placement, Verdict(Outcome.INTERRUPTED, why), 0.0)
            raise
        if aside is not None:
            logger.warning("trial %d: its folder held an earlier run's files: moved to %s",
                           trial.number, aside)  # fmt: skip
        # who and where with "launched" (one transaction): another worker that sees a launched
        # trial must find its worker's leases, or it takes the trial for a dead worker's
        set_user_attrs(trial, {"hosts": [*group.hosts], "worker": self.worker, "launched": True})
        try:
            master = self.executor.master_addr(group.hosts)
            request = self.launcher(spec, runs, trial.number, group, paths, master)
            # the token on the trial and the leases before any process starts: a worker killed
            # between the start and the record would leave processes no other worker could find
            # (an expired lease without a token reads as "claimed, never launched")
            token = new_token()
            node_dir = None if request.node_dir is None else str(request.node_dir)
            if request.timeout_s is None:  # the study's limit for this config
                limit = trial_limit_s(self.costs.spec, attrs.get("predicted_step_s"))
                request = dataclasses.replace(request, timeout_s=limit)
            where = {"token": token, "limit_s": request.timeout_s}  # (re-attach keeps the limit)
            where |= {} if node_dir is None else {"node_dir": node_dir}
            set_user_attrs(trial, where)  # the token lets another worker clean up if we die
            self.scheduler.launched(placement, trial.number, token, node_dir)
            job = self.executor.submit(request, token=token)
        except Exception as exc:  # a template or file error must not stop the study
            logger.error("trial %d could not be launched: %s", trial.number, exc)
            verdict = Verdict(Outcome.LAUNCH_ERROR, str(exc).splitlines()[0])
            self._finish(trial, config, placement, verdict, 0.0)
            return
        if getattr(job, "job_id", None) is not None:  # a batch job (Slurm): findable after a crash
            trial.set_user_attr("job_id", job.job_id)
        self.running[trial.number] = Running(trial, config, job, placement, self.clock())
        self._beating = tuple(self.running)
        logger.info(
            "trial %d started on %s: %s", trial.number, ",".join(group.hosts), spell(config)
        )

    def _finish(
        self, trial: optuna.Trial, config: ParallelConfig, placement: Placement | None,
        verdict: Verdict, duration: float, node_errors: Sequence[Any] = (),
    ) -> None:  # fmt: skip
        """Tell the study, then free the nodes and the config (in that order: another worker
        must never see the nodes free while the trial still looks running)."""
        tell(self.study, trial, verdict, duration)
        self.summary.count(verdict.outcome)
        if verdict.outcome == Outcome.OK:
            self._consecutive_launch_errors = 0
        self._consecutive_launch_errors += verdict.outcome == Outcome.LAUNCH_ERROR
        if placement is not None:
            self.scheduler.release(placement, node_errors=node_errors)
        self.leases.release(self.worker, [f"config:{config.key()}"])

    def reap(self) -> None:
        """End the trials whose measurement is complete, then record every finished job."""
        self.watch.end_complete(self.running, self.trials)
        for number, run in list(self.running.items()):
            result = run.job.poll()
            if result is None:
                continue
            del self.running[number]
            self._beating = tuple(self.running)
            self._record(run, result)

    def _record(self, run: Running, result: Any) -> None:
        tail = self.watch.tail(run.trial.number)  # read on, not its logs read again
        verdict = self.proxies.judge(run.trial, run.config, result, tail)  # a proxy extrapolated
        if result.job_id is not None:  # the hosts the batch scheduler picked, not the pool's slots
            run.trial.set_user_attr("job_hosts", list(result.hosts))
        if verdict.outcome not in RETRYABLE:
            guarded(f"writing {run.job.paths.metrics_json}",
                    lambda: write_metrics(run.job.paths, verdict, result))  # fmt: skip
        self._finish(run.trial, run.config, run.placement, verdict, result.duration_s,
                     node_errors=Scheduler.faults(result))  # fmt: skip
        if result.node_errors:
            self.recover()  # retried on other nodes

    # -- stopping ------------------------------------------------------------------------------

    def budget_reason(self, trials: list[FrozenTrial]) -> str | None:
        """Why no new trial may start (None: go on)."""
        s = self.spec.search
        if self.stop_requested:
            return self.stop_requested
        if self.runs_done(trials) >= self.n_trials:
            return f"ran {self.n_trials} trial{'' if self.n_trials == 1 else 's'} (n_trials)"
        if s.max_wall_time_min and self.clock() - self.started >= s.max_wall_time_min * 60:
            return f"wall time limit of {s.max_wall_time_min} min"
        if s.max_node_hours and self.node_hours(trials) >= s.max_node_hours:
            return f"node-hour budget of {s.max_node_hours} spent"
        if self._over_budget:
            return self._over_budget
        if self._consecutive_launch_errors >= 3:
            return LAUNCH_ERRORS_STOP
        return self.stopper(trials)

    def _refused_for_node_hours(self, trial: optuna.Trial, config: ParallelConfig) -> bool:
        """Whether ``config`` could pass ``max_node_hours``: recorded ``interrupted`` if so."""
        scale = self.proxies.scale(trial, config)  # a proxy's worst case on its own nodes
        why = launch_refusal(self, trial.user_attrs, config.key(), scale)
        if why is not None:
            self._over_budget = why
            self._finish(trial, config, None, Verdict(Outcome.INTERRUPTED, why), 0.0)
        return why is not None

    def node_hours(self, trials: list[FrozenTrial]) -> float:
        """Node-hours of every finished launched trial plus this worker's running ones."""
        return spent_node_hours(trials, self.running, self.clock())

    # -- main loop -----------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask the loop to cancel running trials and return (signal handlers call this)."""
        if self.stop_requested is None:
            self.stop_requested = reason

    def cancel_all(self, level: int = logging.ERROR) -> None:
        """Cancel every running trial of this worker and record it as interrupted; a file or
        the storage failing on the way is logged at ``level`` (processes surviving: errors)."""
        for number, run in list(self.running.items()):
            try:
                run.job.cancel()
            except Exception as exc:  # survivors are named; the others must still be cancelled
                logger.log(level if isinstance(exc, OSError) else logging.ERROR, "%s", exc)
            result = run.job.wait(timeout=60)
            del self.running[number]
            verdict = Verdict(Outcome.INTERRUPTED, self.stop_requested or "stopped")
            try:
                self._finish(run.trial, run.config, run.placement, verdict, result.duration_s)
            except StorageError as exc:
                logger.log(level, "%s", exc)
        self._beating = ()

    def beat(self) -> None:
        """Mark this worker's running trials and its leases alive (the Heartbeat thread)."""
        record_heartbeats(self.storage, self._study_id, self._beating)
        self.scheduler.renew()

    def step(self) -> bool:
        """One pass: record finished jobs, start new ones. False when the loop is over."""
        self.reap()
        if self.clock() - self._last_recover >= self.heartbeat_s:
            self.recover()  # another worker may have died since
        trials = self.trials()
        if self.stop_requested:
            self.cancel_all()
            self.summary.stop_reason = self.stop_requested
            return False
        # Asked afresh each pass: a stop rule that held launches back while trials ran may let
        # them go on once those finish, and a reason kept from before would end the loop on the
        # first pass that launches nothing (another worker holding the nodes or the budget lease).
        self.summary.stop_reason = self.budget_reason(trials) or ""
        if not self.summary.stop_reason and self.pool.exhausted:
            self.summary.stop_reason = self.pool.exhausted_reason
        elif not self.summary.stop_reason:
            self._launch_more(trials)
        self.proxies.confirm(self, trials)  # the best proxies run at full scale before the end
        if self.on_update:
            self.on_update(self)
        # Nothing of ours runs: done once a stop reason is set; else wait for nodes or for the
        # trials other workers are running (they may still use up the budget).
        return bool(self.running) or not self.summary.stop_reason

    def _launch_more(self, trials: list[FrozenTrial]) -> None:
        if self.pool.free_count < self.proxies.size():
            return  # every node of ours is busy: no need to read the leases on each pass
        launched = self.launched_count(trials)
        self.costs.see(trials, len(trials) - len(self.screen.digest.of(trials).open))
        while launched < self.n_trials:
            placement = self.scheduler.acquire(self.proxies.size())
            if placement is None:
                return
            with exclusive(self.leases, BUDGET_LEASE, self.worker, self.heartbeat_s) as turn:
                if turn:  # counted again under the budget lease: no other worker launches now
                    launched = self.launched_count(trials := self.trials())  # (and asked on)
                go = turn and launched < self.n_trials
                picked = (self.proxies.pending() or self.next_config(trials)) if go else None
                if picked is not None and self._refused_for_node_hours(*picked):
                    return self.scheduler.release(placement)
                if picked is None:
                    self.scheduler.release(placement)
                    if go:
                        self.summary.stop_reason = "no new config to try (space exhausted)"
                    return
                placed = self.proxies.place(self.scheduler, picked[0], picked[1], placement)
                if placed is None:
                    return  # its nodes are busy: it waits (Proxies.pending)
                self.launch(picked[0], picked[1], placed)
            self.summary.launched += 1
            launched += 1
            if self._consecutive_launch_errors >= 3:
                return  # a failed launch frees its nodes at once: don't burn the budget

    def run(self) -> Summary:
        """Loop until done; returns what happened. Finished trials are stored as they finish.

        A failing storage (:class:`StorageError`) cancels this worker's trials, frees their
        nodes and is raised with the real cause."""
        with Heartbeat(self.beat, self.heartbeat_s / 2) as heartbeat:
            try:
                with storage_errors("running the study"):
                    self.seed()
                    while self.step():
                        if (failed := heartbeat.failing()) is not None:
                            raise failed
                        time.sleep(self.poll_s)
            except StorageError as exc:
                self.request_stop("the study storage failed")
                self.cancel_all(logging.DEBUG)  # the one line is the storage's
                raise self.storage_watch.explain(exc) from exc
            finally:
                give_back(self.leases, self.worker)
        trials = self.trials()
        best = self.best(trials)
        if best is not None:
            self.summary.best_step_s, self.summary.best_trial = best.value, best.number
        self.summary.measured_any = best is not None
        keep(self.spec, trials, self.gpu.memory_gib, self.layout.root)  # for the next study
        return self.summary
