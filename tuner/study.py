"""The study loop: ask -> config -> validate -> predict -> prune or launch -> parse -> tell.

One Optuna study per tuner study, stored by default in SQLite under ``results/<study>/``; any
SQLAlchemy URL or a journal file works too, so several ``tune run`` workers can share it. The
objective is the measured steady-state step time in seconds (lower is better).

What never reaches a node: configs that break a framework rule, configs the memory model predicts
to OOM (recorded as pruned with their predicted peak), configs that need at least as much memory
as one that really ran out of memory, and configs already measured (answered from the earlier
trial). Each trial records its outcome and reason in its user attributes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import StudyError
from tuner.layout import ResultsLayout
from tuner.memory import GIB, estimate_memory, fits
from tuner.outcome import Outcome
from tuner.parallel import ParallelConfig, validate
from tuner.perf import estimate_time, model_flops_per_step
from tuner.space import Axes, enumerate_space, expand_axes, study_gpu
from tuner.spec import StudySpec

logger = logging.getLogger(__name__)

FINGERPRINT_ATTR = "tuner_spec_fingerprint"
RETRYABLE = (Outcome.INTERRUPTED, Outcome.NODE_ERROR)
HEARTBEAT_S = 30  # running trials are marked alive this often; 4 missed beats fail them
LAUNCH_ERRORS_STOP = "3 launch errors in a row: check the launch section (see the trial logs)"
IMPROVEMENT = 0.01  # early stop: the best must improve by 1 % within search.early_stop_trials


# ----------------------------------------------------------------------------- configs <-> params


def encode_recompute(rc: str, method: str | None, n: int | None) -> str:
    """One categorical value for the three recompute knobs: ``none``, ``full:uniform:1``."""
    return rc if rc != "full" else f"full:{method}:{n}"


def distributions(spec: StudySpec, axes: Axes | None = None) -> dict[str, BaseDistribution]:
    """The Optuna search space: one categorical parameter per knob."""
    axes = axes or expand_axes(spec)
    rc = sorted({encode_recompute(*r) for r in axes.recompute})
    return {
        "tp": CategoricalDistribution(list(axes.tp)),
        "pp": CategoricalDistribution(list(axes.pp)),
        "cp": CategoricalDistribution(list(axes.cp)),
        "vp": CategoricalDistribution(list(axes.vp)),
        "micro_batch_size": CategoricalDistribution(list(axes.micro_batch_size)),
        "sequence_parallel": CategoricalDistribution(list(axes.sequence_parallel)),
        "recompute": CategoricalDistribution(rc),
        "distributed_optimizer": CategoricalDistribution(list(axes.distributed_optimizer)),
        "zero_stage": CategoricalDistribution(list(axes.zero_stage)),
    }


def config_params(config: ParallelConfig, axes: Axes | None = None) -> dict[str, Any]:
    """The Optuna parameters of a config (inverse of :func:`config_from_params`).

    At tp=1 SP is off whatever the parameter says, so with ``axes`` a tp=1 config takes the
    axis' first SP value (``sequence_parallel: [true]`` has no ``false`` to enqueue).
    """
    sp = config.sequence_parallel
    if axes is not None and config.tp == 1 and sp not in axes.sequence_parallel:
        sp = axes.sequence_parallel[0]
    return {
        "tp": config.tp, "pp": config.pp, "cp": config.cp, "vp": config.vp,
        "micro_batch_size": config.micro_batch_size,
        "sequence_parallel": sp,
        "recompute": encode_recompute(
            config.recompute, config.recompute_method, config.recompute_num_layers
        ),
        "distributed_optimizer": config.distributed_optimizer, "zero_stage": config.zero_stage,
    }  # fmt: skip


def config_from_params(spec: StudySpec, params: dict[str, Any]) -> ParallelConfig:
    """Build the config a trial's parameters describe (DP derived from the world size)."""
    rc, method, n = (str(params["recompute"]).split(":") + [None, None])[:3]
    tp, pp, cp = int(params["tp"]), int(params["pp"]), int(params["cp"])
    return ParallelConfig(
        tp=tp, pp=pp, cp=cp, dp=max(spec.world_size // (tp * pp * cp), 1), vp=int(params["vp"]),
        sequence_parallel=bool(params["sequence_parallel"]) and tp > 1,  # Megatron: off at tp=1
        micro_batch_size=int(params["micro_batch_size"]),
        global_batch_size=spec.training.global_batch_size, recompute=rc,  # type: ignore[arg-type]
        recompute_method=method,  # type: ignore[arg-type]
        recompute_num_layers=int(n) if n else None,
        distributed_optimizer=bool(params["distributed_optimizer"]),
        zero_stage=int(params["zero_stage"]),
    )  # fmt: skip


# ----------------------------------------------------------------------------- storage and study


def open_storage(url: str | None, layout: ResultsLayout) -> optuna.storages.BaseStorage:
    """SQLite under results/ by default; an RDB URL; or a journal file (``*.log``/``journal:``).

    RDB storages get heartbeats: the running trials of a worker that died are failed when the
    next worker starts, which re-runs them as interrupted (:meth:`StudyLoop.seed`).
    """
    if url is None:
        layout.study_dir.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{layout.storage_path.resolve()}"
    if url.startswith("journal:") or url.endswith((".log", ".journal")):
        path = url.removeprefix("journal:")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        backend = JournalFileBackend(path)
        return optuna.storages.JournalStorage(backend)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=HEARTBEAT_S,
                grace_period=4 * HEARTBEAT_S,
                engine_kwargs={"connect_args": {"timeout": 60}}
                if url.startswith("sqlite")
                else {},
            )
    except Exception as exc:  # SQLAlchemy raises many types for a bad URL or an unreachable DB
        raise StudyError(f"cannot open storage {url!r}: {exc}") from None


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its ``study.stop()`` once the grid is visited: that works
    inside ``study.optimize`` only and raises under ask/tell. The loop checks exhaustion."""

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
        values: Sequence[float] | None,
    ) -> None:  # fmt: skip
        return None


def make_sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    """model (the default: :mod:`tuner.sampler`), tpe (multivariate, constant liar for parallel
    trials), gp, random or grid."""
    s = spec.search
    if s.sampler == "model":
        from tuner.sampler import ModelGuidedSampler

        return ModelGuidedSampler(spec, seed=s.seed)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.sampler == "grid":
        space = {
            k: list(d.choices)
            for k, d in distributions(spec).items()
            if isinstance(d, CategoricalDistribution)
        }
        return _GridSampler(space, seed=s.seed)
    if s.sampler == "gp":
        try:
            import torch  # noqa: F401  # Optuna's GP sampler runs on torch
        except ImportError:
            raise StudyError(
                "search.sampler 'gp' needs torch (pip install torch, or the 'train' extra); "
                "the default 'model' sampler does not"
            ) from None
        return optuna.samplers.GPSampler(seed=s.seed)
    with warnings.catch_warnings():  # group=True is experimental in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            multivariate=True, group=True, constant_liar=True, seed=s.seed, n_startup_trials=5
        )


def open_study(spec: StudySpec, storage: optuna.storages.BaseStorage, force: bool) -> optuna.Study:
    """Create or resume the Optuna study; refuse a changed spec unless ``force``."""
    study = optuna.create_study(
        study_name=spec.name, storage=storage, direction="minimize",
        sampler=make_sampler(spec), load_if_exists=True,
    )  # fmt: skip
    recorded = study.user_attrs.get(FINGERPRINT_ATTR)
    mine = spec.fingerprint()
    if recorded is None:
        study.set_user_attr(FINGERPRINT_ATTR, mine)
    elif recorded != mine:
        if not force:
            raise StudyError(
                f"study {spec.name!r} was started with a different study file (fingerprint "
                f"{recorded}, now {mine}); resume with --force, or give the study a new name"
            )
        logger.warning("study file changed since the study started; resuming (--force)")
        study.set_user_attr(FINGERPRINT_ATTR, mine)
    return study


# ----------------------------------------------------------------------------- the loop


@dataclass(slots=True)
class Running:
    """A launched trial this worker is watching."""

    trial: optuna.Trial
    config: ParallelConfig
    job: Any  # tuner.launch.Job
    group: Any  # tuner.launch.NodeGroup
    started: float


@dataclass(slots=True)
class Summary:
    """What one ``tune run`` did."""

    launched: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    stop_reason: str = ""
    best_step_s: float | None = None
    best_trial: int | None = None

    @property
    def failed(self) -> bool:
        """The study stopped because trials cannot be launched: ``tune run`` exits 1."""
        return self.stop_reason == LAUNCH_ERRORS_STOP

    def count(self, outcome: Outcome) -> None:
        """Add one trial with ``outcome``."""
        self.outcomes[str(outcome)] = self.outcomes.get(str(outcome), 0) + 1


def trial_outcome(t: FrozenTrial) -> Outcome | None:
    """A trial's recorded outcome, if any. A launched trial failed without one lost its worker
    (heartbeats stopped: the storage failed it), so it counts as interrupted and runs again."""
    value = t.user_attrs.get("outcome")
    if value:
        return Outcome(value)
    if t.state == TrialState.FAIL and t.user_attrs.get("launched"):
        return Outcome.INTERRUPTED
    return None


def oom_dominates(oom: ParallelConfig, other: ParallelConfig) -> bool:
    """Whether ``other`` needs at least as much memory as ``oom`` (same split, a micro-batch at
    least as large, no more recomputation)."""
    level = {"none": 0, "selective": 1, "full": 2}
    same_split = (oom.tp, oom.pp, oom.cp, oom.vp, oom.sequence_parallel) == (
        other.tp, other.pp, other.cp, other.vp, other.sequence_parallel
    )  # fmt: skip
    same_sharding = (oom.distributed_optimizer, oom.zero_stage) == (
        other.distributed_optimizer, other.zero_stage
    )  # fmt: skip
    if not (same_split and same_sharding) or other.micro_batch_size < oom.micro_batch_size:
        return False
    if level[other.recompute] != level[oom.recompute]:
        return level[other.recompute] < level[oom.recompute]
    if other.recompute != "full":
        return True
    return (other.recompute_method, other.recompute_num_layers) == (
        oom.recompute_method, oom.recompute_num_layers
    )  # fmt: skip


def parse_result(spec: StudySpec, result: Any) -> Any:
    """The :class:`~tuner.logs.RunMetrics` of a finished job (``JobResult``): its nodes' logs
    read together, with the study's warm-up and global batch size and the job's exit codes."""
    from tuner.logs import parse_log, read_log  # parsers are needed only once jobs finish

    text = "\n".join(read_log(p) for p in result.logs if Path(p).exists())
    return parse_log(text, spec.framework, spec.launch.warmup_iters,
                     exit_codes=result.exit_codes, timed_out=result.timed_out,
                     global_batch_size=spec.training.global_batch_size)  # fmt: skip


Launcher = Callable[[StudySpec, ParallelConfig, int, Any, Any, str], Any]
"""(spec, config, trial number, node group, trial paths, master address) -> LaunchRequest."""


class StudyLoop:
    """Runs one worker of a study until the budget is spent, the space is exhausted or stopped."""

    def __init__(
        self,
        spec: StudySpec,
        study: optuna.Study,
        executor: Any,
        pool: Any,
        layout: ResultsLayout,
        launcher: Launcher,
        *,
        n_trials: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.2,
        on_update: Callable[[StudyLoop], None] | None = None,
    ) -> None:
        self.spec, self.study, self.executor, self.pool = spec, study, executor, pool
        self.layout, self.launcher, self.clock, self.poll_s = layout, launcher, clock, poll_s
        self.n_trials = n_trials or spec.search.n_trials
        self.on_update = on_update
        self.gpu = study_gpu(spec)
        self.running: dict[int, Running] = {}
        self.summary = Summary()
        self.stop_requested: str | None = None
        self.started = clock()
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self._consecutive_launch_errors = 0
        self._last_beat = float("-inf")
        self._last_recover = clock()
        self.space_counts: dict[str, Any] = {}
        """Counts over the whole space (``SpaceReport.counts``), set by :meth:`seed`."""

    # -- what the storage says ---------------------------------------------------------------

    def trials(self) -> list[FrozenTrial]:
        """All trials of the study (every worker's)."""
        return self.study.get_trials(deepcopy=False)

    @staticmethod
    def outcome_of(t: FrozenTrial) -> Outcome | None:
        """A trial's recorded outcome, if any (see :func:`trial_outcome`)."""
        return trial_outcome(t)

    def launched_count(self, trials: list[FrozenTrial]) -> int:
        """Runs that count against n_trials: launched and not to be re-run."""
        n = 0
        for t in trials:
            if not t.user_attrs.get("launched"):
                continue
            if t.state == TrialState.RUNNING or self.outcome_of(t) not in RETRYABLE:
                n += 1
        return n

    def measured(self, trials: list[FrozenTrial]) -> dict[str, FrozenTrial]:
        """Config key -> the trial that measured it (ok outcome, not a duplicate)."""
        out: dict[str, FrozenTrial] = {}
        for t in trials:
            if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs:
                out.setdefault(str(t.user_attrs.get("key")), t)
        return out

    def best(self, trials: list[FrozenTrial]) -> FrozenTrial | None:
        """The fastest measured trial."""
        done = [t for t in self.measured(trials).values() if t.value is not None]
        return min(done, key=lambda t: float(t.value or 0.0)) if done else None

    # -- seeding -------------------------------------------------------------------------------

    def seed(self) -> None:
        """Enqueue the top predicted configs on a new study, and re-runs of interrupted trials."""
        report = enumerate_space(self.spec)
        self.space_counts = report.counts()
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
        """Fail the running trials of dead workers (their heartbeats stopped), then queue every
        interrupted or node-error trial once to run again."""
        self._last_recover = self.clock()
        if hasattr(self.study._storage, "record_heartbeat"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)
        requeued = set(self.study.user_attrs.get("requeued", []))
        again = [
            t for t in self.trials()
            if self.outcome_of(t) in RETRYABLE and t.number not in requeued and t.params
            and t.state.is_finished()
        ]  # fmt: skip
        for t in again:
            if "outcome" not in t.user_attrs and t.user_attrs.get("token"):
                self._reap_lost(t)  # its worker died: its processes may still run
        for t in again:
            self.study.enqueue_trial(t.params)
            requeued.add(t.number)
        if again:
            self.study.set_user_attr("requeued", sorted(requeued))
            logger.info("re-running %d interrupted, lost or node-error trials", len(again))

    def _reap_lost(self, t: FrozenTrial) -> None:
        """End the processes a dead worker's trial left on its nodes."""
        from tuner.launch import LaunchRequest

        hosts = tuple(t.user_attrs.get("hosts", ()))
        if not hosts:
            return
        request = LaunchRequest(
            trial=t.number, hosts=hosts, scripts=("",) * len(hosts),
            paths=self.layout.trial(t.number), node_dir=t.user_attrs.get("node_dir"),
        )  # fmt: skip
        try:
            survivors = self.executor.reap_lost(request, str(t.user_attrs["token"]))
        except Exception as exc:  # an unreachable node must not stop the study
            logger.error("trial %d of a dead worker: %s", t.number, exc)
            return
        if survivors:
            logger.error("trial %d of a dead worker: processes survive: %s", t.number,
                         "; ".join(survivors))  # fmt: skip
        else:
            logger.info("trial %d of a dead worker: its processes are gone", t.number)

    # -- choosing the next config ----------------------------------------------------------------

    def _prune(self, trial: optuna.Trial, outcome: Outcome, reason: str) -> None:
        trial.set_user_attr("outcome", str(outcome))
        trial.set_user_attr("reason", reason)
        self.study.tell(trial, state=TrialState.PRUNED)
        self.summary.count(outcome)

    def _screen(self, trial: optuna.Trial, config: ParallelConfig) -> bool:
        """Record ``trial`` without launching when it must not run; True when it may run."""
        spec = self.spec
        errors = validate(config, spec.model, spec.world_size, spec.framework)
        if errors:
            self._prune(trial, Outcome.INVALID, "; ".join(e.message for e in errors))
            return False
        memory = estimate_memory(spec.model, config, self.gpu, spec.framework,
                                 spec.training.precision)  # fmt: skip
        predicted = estimate_time(spec.model, spec.training, config, self.gpu,
                                  spec.cluster.gpus_per_node, spec.framework)  # fmt: skip
        trial.set_user_attr("predicted_peak_gib", round(memory.peak / GIB, 3))
        trial.set_user_attr("predicted_allocated_gib", round(memory.allocated / GIB, 3))
        trial.set_user_attr("predicted_step_s", predicted.step)
        trial.set_user_attr("predicted_mfu", predicted.mfu)
        if not fits(memory, self.gpu, spec.search.memory_headroom):
            limit = spec.search.memory_headroom * self.gpu.memory_gib
            reason = f"predicted peak {memory.peak / GIB:.3g} GiB > {limit:.3g} GiB"
            self._prune(trial, Outcome.PRUNED_MEMORY, reason)
            return False
        return self._screen_history(trial, config)

    def _screen_history(self, trial: optuna.Trial, config: ParallelConfig) -> bool:
        key = config.key()
        trials = self.trials()
        for t in trials:
            if self.outcome_of(t) == Outcome.OOM and t.user_attrs.get("config"):
                oom = ParallelConfig(**t.user_attrs["config"])
                if oom_dominates(oom, config):
                    reason = f"needs at least the memory of trial {t.number}, which ran out"
                    self._prune(trial, Outcome.PRUNED_MEMORY, reason)
                    return False
        done = self.measured(trials).get(key)
        if done is not None and done.value is not None:
            trial.set_user_attr("duplicate_of", done.number)
            trial.set_user_attr("outcome", str(Outcome.OK))
            self.study.tell(trial, done.value)  # the sampler learns; nothing runs again
            return False
        return not self._claimed_elsewhere(trial, key)

    def _claimed_elsewhere(self, trial: optuna.Trial, key: str) -> bool:
        """Whether an earlier trial (any worker) holds ``key``; if so ``trial`` yields.

        The claim is the ``key`` attribute, written when the trial was asked and before this
        read: of two racing trials at least one sees the other, and the higher-numbered yields.
        """
        for t in self.trials():
            if t.number >= trial.number or t.user_attrs.get("key") != key:
                continue
            if t.state == TrialState.RUNNING or self.outcome_of(t) not in RETRYABLE:
                trial.set_user_attr("reason", f"same config as trial {t.number}")
                trial.set_user_attr("duplicate_of", t.number)  # not a trial of its own
                self.study.tell(trial, state=TrialState.FAIL)
                return True
        return False

    def next_config(self, max_asks: int = 300) -> tuple[optuna.Trial, ParallelConfig] | None:
        """Ask until a config that may run comes up; None when the space looks exhausted."""
        dists = distributions(self.spec)
        sampler = self.study.sampler
        for _ in range(max_asks):
            if isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(
                self.study
            ):
                return None
            with warnings.catch_warnings():  # heartbeats are recorded by self.heartbeat()
                warnings.filterwarnings("ignore", message="Heartbeat of storage")
                trial = self.study.ask(dists)
            config = config_from_params(self.spec, trial.params)
            trial.set_user_attr("config", dataclasses.asdict(config))
            trial.set_user_attr("key", config.key())
            if self._screen(trial, config):
                return trial, config
            if self.stop_requested:
                return None
        return None

    # -- launching and recording ---------------------------------------------------------------

    def launch(self, trial: optuna.Trial, config: ParallelConfig, group: Any) -> None:
        """Render and start ``config`` on ``group``; a launch failure is recorded, not raised."""
        paths = self.layout.trial(trial.number)
        paths.dir.mkdir(parents=True, exist_ok=True)
        record = {"trial": trial.number, "config": config.to_dict(), "hosts": list(group.hosts),
                  "predicted_step_s": trial.user_attrs.get("predicted_step_s"),
                  "predicted_peak_gib": trial.user_attrs.get("predicted_peak_gib")}  # fmt: skip
        paths.config_yaml.write_text(json.dumps(record, indent=2) + "\n")  # JSON is valid YAML
        trial.set_user_attr("launched", True)
        trial.set_user_attr("hosts", list(group.hosts))
        trial.set_user_attr("worker", self.worker)
        try:
            master = self.executor.master_addr(group.hosts)
            port = self.executor.master_port(group.hosts, group.master_port)
            placed = dataclasses.replace(group, master_port=port)
            request = self.launcher(self.spec, config, trial.number, placed, paths, master)
            job = self.executor.submit(request)
            trial.set_user_attr("token", job.token)  # lets another worker clean up if we die
            if request.node_dir is not None:
                trial.set_user_attr("node_dir", str(request.node_dir))
        except Exception as exc:  # a template or file error must not stop the study
            logger.error("trial %d could not be launched: %s", trial.number, exc)
            self.pool.release(group)
            self._finish(trial, Outcome.LAUNCH_ERROR, str(exc).splitlines()[0], 0.0)
            return
        self.running[trial.number] = Running(trial, config, job, group, self.clock())
        logger.info(
            "trial %d started on %s: %s", trial.number, ",".join(group.hosts), config.key()
        )

    def _finish(
        self, trial: optuna.Trial, outcome: Outcome, reason: str | None, duration: float,
        metrics: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        trial.set_user_attr("outcome", str(outcome))
        trial.set_user_attr("reason", reason)
        trial.set_user_attr("duration_s", round(duration, 3))
        for k, v in (metrics or {}).items():
            trial.set_user_attr(k, v)
        self.summary.count(outcome)
        if outcome == Outcome.OK and metrics and metrics.get("step_time_s"):
            self.study.tell(trial, float(metrics["step_time_s"]))
            self._consecutive_launch_errors = 0
        elif outcome in RETRYABLE:
            self.study.tell(trial, state=TrialState.FAIL)  # re-run on resume / other nodes
        else:
            self.study.tell(trial, state=TrialState.PRUNED)  # measured bad: steer away
        self._consecutive_launch_errors += outcome == Outcome.LAUNCH_ERROR

    def reap(self) -> None:
        """Record every finished job of this worker."""
        for number, run in list(self.running.items()):
            result = run.job.poll()
            if result is None:
                continue
            del self.running[number]
            self._record(run, result)

    def _record(self, run: Running, result: Any) -> None:
        node_errors = tuple(result.node_errors)
        self.pool.release(run.group, node_errors=node_errors)
        if node_errors:
            reason = "; ".join(f"{h}: {r}" for h, r in node_errors)
            self._finish(run.trial, Outcome.NODE_ERROR, reason, result.duration_s)
            self.recover()  # retried on other nodes
            return
        if result.cancelled:
            self._finish(run.trial, Outcome.INTERRUPTED, "the study was stopped",
                         result.duration_s)  # fmt: skip
            return
        m = parse_result(self.spec, result)
        metrics = self._metrics(m)
        run.job.paths.metrics_json.write_text(json.dumps(metrics | {
            "outcome": str(m.outcome), "reason": m.reason, "duration_s": result.duration_s,
            "exit_codes": list(result.exit_codes)}, indent=2) + "\n")  # fmt: skip
        self._finish(run.trial, m.outcome, m.reason, result.duration_s, metrics)

    def _metrics(self, m: Any) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step_time_s": m.step_time_s, "iterations": m.iterations,
            "peak_memory_gib": m.peak_memory_gib, "peak_reserved_gib": m.peak_reserved_gib,
            "tflops_per_gpu": m.tflops_per_gpu, "samples_per_s": m.samples_per_s,
        }  # fmt: skip
        if m.step_time_s:
            tokens = self.spec.training.global_batch_size * self.spec.model.seq_length
            out["tokens_per_s"] = tokens / m.step_time_s
            flops = model_flops_per_step(self.spec.model, self.spec.training.global_batch_size)
            peak = self.gpu.peak_tflops * 1e12 * self.spec.world_size
            out["mfu"] = flops / (m.step_time_s * peak)
        return out

    # -- stopping ------------------------------------------------------------------------------

    def budget_reason(self, trials: list[FrozenTrial]) -> str | None:
        """Why no new trial may start (None: go on)."""
        s = self.spec.search
        if self.stop_requested:
            return self.stop_requested
        if self.launched_count(trials) >= self.n_trials:
            return f"ran {self.n_trials} trials (n_trials)"
        if s.max_wall_time_min and self.clock() - self.started >= s.max_wall_time_min * 60:
            return f"wall time limit of {s.max_wall_time_min} min"
        if s.max_node_hours and self.node_hours(trials) >= s.max_node_hours:
            return f"node-hour budget of {s.max_node_hours} spent"
        if self._consecutive_launch_errors >= 3:
            return LAUNCH_ERRORS_STOP
        return self._early_stop(trials)

    def node_hours(self, trials: list[FrozenTrial]) -> float:
        """Node-hours of every finished launched trial plus this worker's running ones."""
        done = sum(
            float(t.user_attrs.get("duration_s", 0.0)) * len(t.user_attrs.get("hosts", []))
            for t in trials if t.state != TrialState.RUNNING
        ) / 3600  # fmt: skip
        now = self.clock()
        live = sum((now - r.started) * len(r.group.hosts) for r in self.running.values()) / 3600
        return done + live

    def _early_stop(self, trials: list[FrozenTrial]) -> str | None:
        k = self.spec.search.early_stop_trials
        launched = [t for t in trials if t.user_attrs.get("launched") and t.state.is_finished()]
        if not k or len(launched) <= k:
            return None
        launched.sort(key=lambda t: t.number)
        before = [t.value for t in launched[:-k] if t.value is not None]
        recent = [t.value for t in launched[-k:] if t.value is not None]
        if before and (not recent or min(recent) > min(before) * (1 - IMPROVEMENT)):
            return f"no 1% improvement in the last {k} trials (early stop)"
        return None

    # -- main loop -----------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask the loop to cancel running trials and return (signal handlers call this)."""
        self.stop_requested = reason

    def cancel_all(self) -> None:
        """Cancel every running trial of this worker and record it as interrupted."""
        for number, run in list(self.running.items()):
            run.job.cancel()
            result = run.job.wait(timeout=60)
            del self.running[number]
            self.pool.release(run.group)
            self._finish(run.trial, Outcome.INTERRUPTED, self.stop_requested or "stopped",
                         result.duration_s)  # fmt: skip

    def heartbeat(self) -> None:
        """Mark this worker's running trials alive (ask/tell does not do it by itself)."""
        storage = self.study._storage
        if not hasattr(storage, "record_heartbeat") or not self.running:
            return
        now = self.clock()
        if now - self._last_beat < HEARTBEAT_S / 2:
            return
        self._last_beat = now
        for run in self.running.values():
            storage.record_heartbeat(run.trial._trial_id)

    def step(self) -> bool:
        """One pass: record finished jobs, start new ones. False when the loop is over."""
        self.reap()
        self.heartbeat()
        if self.clock() - self._last_recover >= HEARTBEAT_S:
            self.recover()  # another worker may have died since
        trials = self.trials()
        reason = self.budget_reason(trials)
        if self.stop_requested:
            self.cancel_all()
            self.summary.stop_reason = self.stop_requested
            return False
        if reason is None and not self.pool.exhausted:
            launched = self.launched_count(trials)
            while launched < self.n_trials and (group := self.pool.acquire()) is not None:
                picked = self.next_config()
                if picked is None:
                    self.pool.release(group)
                    self.summary.stop_reason = "no new config to try (space exhausted)"
                    return bool(self.running)
                self.launch(*picked, group)
                self.summary.launched += 1
                launched += 1
                if self._consecutive_launch_errors >= 3:
                    break  # a failed launch frees its nodes at once: don't burn the budget
        elif reason is not None:
            self.summary.stop_reason = reason
        elif self.pool.exhausted:
            self.summary.stop_reason = "every node is quarantined"
        if self.on_update:
            self.on_update(self)
        return bool(self.running) or (reason is None and not self.pool.exhausted
                                      and not self.summary.stop_reason)  # fmt: skip

    def run(self) -> Summary:
        """Loop until done; returns what happened. Finished trials are stored as they finish."""
        self.seed()
        while self.step():
            time.sleep(self.poll_s)
        best = self.best(self.trials())
        if best is not None:
            self.summary.best_step_s, self.summary.best_trial = best.value, best.number
        return self.summary


@contextmanager
def stop_on_signals(loop: StudyLoop) -> Iterator[None]:
    """SIGINT / SIGTERM stop the loop cleanly (running trials cancelled, marked interrupted)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, _frame: object) -> None:
        loop.request_stop(f"interrupted by {signal.Signals(signum).name}")

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ----------------------------------------------------------------------------- wiring


def template_launcher(spec: StudySpec, config: ParallelConfig, number: int, group: Any,
                      paths: Any, master_addr: str) -> Any:  # fmt: skip
    """The default :data:`Launcher`: render the study's template for the node group."""
    from tuner.launch import LaunchRequest, render_launch

    trial_dir = str(paths.dir.resolve())
    rendered = render_launch(
        spec, config, hosts=group.hosts, master_addr=master_addr,
        master_port=group.master_port, trial_dir=trial_dir,
    )  # fmt: skip
    return LaunchRequest(
        trial=number, hosts=tuple(group.hosts), scripts=rendered.scripts, paths=paths,
        files=rendered.files, timeout_s=spec.search.trial_timeout_min * 60,
    )  # fmt: skip


def make_executor(spec: StudySpec) -> Any:
    """The executor the study's cluster section names."""
    from tuner.launch import LocalExecutor, SSHExecutor

    if spec.cluster.executor == "local":
        return LocalExecutor()
    if spec.cluster.executor == "ssh":
        return SSHExecutor(spec.cluster.ssh)
    raise StudyError("executor 'slurm' is not implemented yet: use ssh or local")


def build_loop(
    spec: StudySpec, *, storage: str | None = None, results: str = "results", force: bool = False,
    n_trials: int | None = None, launcher: Launcher = template_launcher,
    executor: Any = None, on_update: Callable[[StudyLoop], None] | None = None,
) -> StudyLoop:  # fmt: skip
    """Everything a worker needs: storage, study, executor, node pool, results layout."""
    from tuner.launch import NodePool

    layout = ResultsLayout(Path(results).resolve(), spec.name)
    study = open_study(spec, open_storage(storage, layout), force)
    pool = NodePool(spec.node_names, spec.nodes_per_trial, base_port=spec.launch.master_port)
    return StudyLoop(
        spec, study, executor or make_executor(spec), pool, layout, launcher,
        n_trials=n_trials, on_update=on_update,
    )  # fmt: skip
