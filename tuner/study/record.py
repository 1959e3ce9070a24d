"""Recording what a trial did: its outcome, reason and metrics, into the study and its folder.

A finished job is parsed into an outcome (:func:`judge`), its metrics are written to
``metrics.json`` *before* the study is told, and a storage that fails while telling (a full
disk, a lost database server) stops the study with the real cause (:class:`StorageError`). The
next worker then finds the trial's ``metrics.json`` (or its ``result.json`` and logs) and
records the measurement instead of running the config again (:func:`recovered_metrics`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import optuna
from optuna.trial import TrialState

from tuner.catalog import GPUSpec
from tuner.errors import StorageError
from tuner.launch import JobResult
from tuner.launch.pool import EXHAUSTED
from tuner.launch.request import ended_how, ended_verdict
from tuner.layout import TrialPaths, write_atomic
from tuner.models.time.breakdown import fastest_step_s
from tuner.models.time.estimate import model_flops_per_step
from tuner.outcome import Outcome, figure
from tuner.search.sampler import ModelGuidedSampler
from tuner.space.trials import RETRYABLE
from tuner.spec.study import StudySpec
from tuner.study.faults import StorageFailure
from tuner.study.measure import LogTail, measured_anyway
from tuner.study.storage import set_user_attrs, upsert_backend, write_trial

logger = logging.getLogger(__name__)
T = TypeVar("T")

LAUNCH_ERRORS_STOP = "3 launch errors in a row: check the launch section (see the trial logs)"


@dataclass(slots=True)
class Summary:
    """What one ``tune run`` did."""

    launched: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    stop_reason: str = ""
    best_step_s: float | None = None
    best_trial: int | None = None
    measured_any: bool = False
    """Whether the study holds at least one measured config when the run ends."""

    @property
    def failed(self) -> str | None:
        """Why ``tune run`` exits 1 (None: it succeeded): trials could not be launched, every
        node, or too many to form a trial, is quarantined, or trials ran and none measured a
        step time."""
        if self.stop_reason == LAUNCH_ERRORS_STOP or self.stop_reason.startswith(EXHAUSTED):
            return self.stop_reason
        ran = sum(n for k, n in self.outcomes.items() if Outcome(k).launched)
        if ran and not self.measured_any:
            what = ", ".join(f"{n} {k}" for k, n in sorted(self.outcomes.items()))
            return f"no trial measured a step time ({what})"
        return None

    def count(self, outcome: Outcome) -> None:
        """Add one trial with ``outcome``."""
        self.outcomes[str(outcome)] = self.outcomes.get(str(outcome), 0) + 1


@contextmanager
def storage_errors(what: str) -> Iterator[None]:
    """Turn a failing storage into one :class:`StorageError` that names the real cause."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        if not _is_storage_error(exc):
            raise
        raise StorageFailure(what, exc) from exc


def _is_storage_error(exc: BaseException) -> bool:
    import sqlalchemy.exc

    kinds = (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, OSError)
    return isinstance(exc, kinds)


def parse_result(spec: StudySpec, result: JobResult, logs: list[Path] | None = None) -> Any:
    """The :class:`~tuner.logs.RunMetrics` of a finished job: its nodes' logs read together,
    with the study's warm-up and global batch size and the job's exit codes. ``logs``: the
    job's :func:`logs_of`, where the caller has them."""
    from tuner.logs import parse_log_files  # parsers are needed only once jobs finish

    logs = logs_of(result) if logs is None else logs  # streamed: never a whole log in memory
    tokens = spec.training.global_batch_size * spec.model.seq_length / spec.world_size
    return parse_log_files(logs, spec.framework, spec.launch.warmup_iters,
                           exit_codes=result.exit_codes,
                           timed_out=result.timed_out or result.stopped is not None,
                           global_batch_size=spec.training.global_batch_size,
                           step_tokens=tokens)  # fmt: skip


def metrics_attrs(spec: StudySpec, gpu: GPUSpec, m: Any) -> dict[str, Any]:
    """The measured figures of a :class:`~tuner.logs.RunMetrics`, as trial attributes."""
    out: dict[str, Any] = {
        "step_time_s": m.step_time_s, "iterations": m.iterations,
        "peak_memory_gib": m.peak_memory_gib, "peak_reserved_gib": m.peak_reserved_gib,
        "tflops_per_gpu": m.tflops_per_gpu, "samples_per_s": m.samples_per_s,
    }  # fmt: skip
    if m.step_time_s:
        tokens = spec.training.global_batch_size * spec.model.seq_length
        out["tokens_per_s"] = tokens / m.step_time_s
        flops = model_flops_per_step(spec.model, spec.training.global_batch_size)
        out["mfu"] = flops / (m.step_time_s * gpu.peak_tflops * 1e12 * spec.world_size)
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a finished job says about its config."""

    outcome: Outcome
    reason: str | None
    metrics: dict[str, Any] = field(default_factory=dict)


def judge(spec: StudySpec, gpu: GPUSpec, result: JobResult, tail: LogTail | None = None,
          ) -> Verdict:  # fmt: skip
    """The outcome of a finished job. A job killed at its own time limit is judged from its
    logs (``timeout``, or ``hang`` with no iteration line); only a job cancelled because the
    study stopped is ``interrupted``. ``tail``: the watch's tail of its logs (read on rather
    than the logs read again for the steady-state estimate). A log that makes its reader fail
    (a defect of the reader, not of the run) is ``no_metrics`` with the error as its reason:
    the finished trial is recorded once, never dropped or launched again."""
    how = ended_how(timed_out=result.timed_out, cancelled=result.cancelled,
                    stopped=result.stopped)  # fmt: skip
    ended = ended_verdict(node_errors=result.node_errors,
                          scheduler_verdict=result.scheduler_verdict, how=how)  # fmt: skip
    if ended is not None:
        return Verdict(*ended)
    try:
        return _from_logs(spec, gpu, result, tail)
    except Exception as exc:  # a reader's defect on a log nobody foresaw: keep the trial
        logger.warning("trial %d: its logs could not be read", result.trial, exc_info=True)
        why = f"its logs could not be read ({type(exc).__name__}: {exc})"[:500]
        return Verdict(Outcome.NO_METRICS, why)


def _from_logs(spec: StudySpec, gpu: GPUSpec, result: JobResult, tail: LogTail | None,
               ) -> Verdict:  # fmt: skip
    """:func:`judge` of a job that ran to its end: from what its logs say."""
    logs = logs_of(result)  # (16 file checks a 16-node trial: listed once)
    m = parse_result(spec, result, logs)
    if m.outcome == Outcome.LAUNCH_ERROR and _PORT_CLASH.search(m.reason or ""):
        # Not the config's fault: another job took the rendezvous port between our check and
        # torchrun's bind. Run it again (on a fresh port), without a strike against the node.
        return Verdict(Outcome.NODE_ERROR, f"rendezvous port in use: {m.reason}")
    verdict = Verdict(m.outcome, m.reason, metrics_attrs(spec, gpu, m))
    measured: Verdict = measured_anyway(spec, verdict, logs, result.stopped, tail)
    return physical(
        spec, gpu, replace(measured, metrics=objective_metrics(spec, gpu, measured.metrics))
    )


def physical(spec: StudySpec, gpu: GPUSpec, verdict: Verdict) -> Verdict:
    """``verdict``, or ``no_metrics`` when its figure is faster than the hardware allows (below
    :func:`tuner.models.time.breakdown.fastest_step_s` for what the job ran: ``spec`` is a
    proxy's own) or is no figure at all (:func:`tuner.outcome.figure`): a corrupt measurement
    (a step of 1e-300 s won the study), kept with its figures and the reason, never ranked."""
    step = verdict.metrics.get("step_time_s")
    if verdict.outcome != Outcome.OK or step is None:
        return verdict
    bound = fastest_step_s(spec.model, spec.training.global_batch_size, spec.world_size, gpu)
    if figure(step) is None:
        why = f"the step time {step!r} s is no figure"
    elif bound is not None and step < bound:
        why = (
            f"the step time {step:.3g} s is faster than the hardware allows: "
            f"{bound:.3g} s is the model's FLOPs per step on {spec.world_size} "
            f"{gpu.name} at their peak; a corrupt measurement"
        )
    else:
        return verdict
    return replace(verdict, outcome=Outcome.NO_METRICS, reason=why)


def objective_metrics(spec: StudySpec, gpu: GPUSpec, metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` with ``step_time_s`` (the study's objective, the figure every trial is ranked,
    raced and reported by) set to the steady-state estimate (:mod:`tuner.logs.steady`) where
    the log gave one over at least ``search.min_batches`` batches, and to the parser's median
    step otherwise (DeepSpeed's own logs, a log too short for the estimator); the median stays
    as ``median_step_s`` and ``objective`` says which one it is. Tokens/s and MFU follow.

    Why the steady-state mean: it is the figure the stopping rule measures to
    ``search.precision`` and the racing compares intervals of, so the best config, the
    incumbent racing reads and the figure that ended each trial are one quantity; and a mean
    over the steady iterations keeps the periodic events a real run pays for (garbage
    collection, logging), which the median drops. A trial recorded before (no
    ``objective`` attribute) keeps its median as its figure."""
    median = metrics.get("step_time_s")
    if not median:
        return metrics
    steady = metrics.get("steady_step_s")
    enough = int(metrics.get("steady_batches") or 0) >= spec.search.min_batches
    out = {**metrics, "median_step_s": median, "objective": "median"}
    if steady and enough:
        out.update(
            {k: v for k, v in metrics_attrs(spec, gpu, _StepOnly(float(steady))).items()
             if k in ("step_time_s", "tokens_per_s", "mfu")},
            objective="steady",
        )  # fmt: skip
    return out


@dataclass(frozen=True, slots=True)
class _StepOnly:
    """A step time as :func:`metrics_attrs` reads it (the other figures unknown)."""

    step_time_s: float
    iterations: None = None
    peak_memory_gib: None = None
    peak_reserved_gib: None = None
    tflops_per_gpu: None = None
    samples_per_s: None = None


def logs_of(result: JobResult) -> list[Path]:
    """The job's node logs that exist."""
    return [Path(p) for p in result.logs if os.path.exists(p)]


_PORT_CLASH = re.compile(r"EADDRINUSE|[Aa]ddress already in use")
"""torch's TCPStore (``DistNetworkError: The server socket has failed to listen on any local
network address. ... name: EADDRINUSE``) and the OS's errno 98 text."""


def write_metrics(paths: TrialPaths, verdict: Verdict, result: JobResult) -> None:
    """``metrics.json``: the measurement, on disk before the study hears of it; whole or not
    there (a ``tune`` killed or a disk filled mid-write left a cut file that hid the measurement
    from :func:`recovered_metrics`)."""
    record = verdict.metrics | {
        "outcome": str(verdict.outcome), "reason": verdict.reason,
        "duration_s": result.duration_s, "exit_codes": list(result.exit_codes),
    }  # fmt: skip
    write_atomic(paths.metrics_json, json.dumps(record, indent=2) + "\n")


def recovered_metrics(spec: StudySpec, gpu: GPUSpec, paths: TrialPaths) -> Verdict | None:
    """The verdict of a trial whose job finished but whose result never reached the study:
    from its ``metrics.json``, else from its ``result.json`` and logs; None when neither. A
    ``metrics.json`` that cannot be read (cut short, edited) falls back on the ``result.json``:
    the measurement is in the logs too, and the config would otherwise run again."""

    def saved() -> Verdict:
        data = json.loads(paths.metrics_json.read_text())
        outcome = Outcome(data.pop("outcome"))
        reason = data.pop("reason", None)
        data.pop("exit_codes", None)  # the executor's, not a trial attribute
        return Verdict(outcome, reason, data)

    def judged() -> Verdict:
        raw = json.loads(paths.result_json.read_text())
        raw["hosts"] = tuple(raw["hosts"])
        raw["exit_codes"] = tuple(raw["exit_codes"])
        raw["node_errors"] = tuple(tuple(e) for e in raw["node_errors"])
        raw["logs"] = tuple(Path(p) for p in raw["logs"])
        raw["survivors"] = tuple(raw.get("survivors", ()))
        if raw.get("scheduler_verdict") is not None:
            raw["scheduler_verdict"] = tuple(raw["scheduler_verdict"])
        return judge(spec, gpu, JobResult(**raw))

    for path, read in ((paths.metrics_json, saved), (paths.result_json, judged)):
        try:
            if path.exists():
                return read()
        except (ValueError, KeyError, TypeError, OSError) as exc:
            logger.warning("cannot recover %s from %s: %s", paths.dir, path.name, exc)
    return None


def tell(study: optuna.Study, trial: optuna.Trial, verdict: Verdict, duration: float) -> None:
    """Write a trial's verdict into the study: value for ``ok``; FAIL for outcomes that run
    again; PRUNED (measured bad: the sampler steers away) for the rest."""
    try:
        _tell(study, trial, verdict, duration)
    except optuna.exceptions.UpdateFinishedTrialError:
        # another worker took this worker for dead and ended the trial; the measurement stays
        # in the trial's metrics.json, from which recovery records it
        logger.warning("trial %d was ended by another worker meanwhile: not recorded twice",
                       trial.number)  # fmt: skip


def _tell(study: optuna.Study, trial: optuna.Trial, verdict: Verdict, duration: float) -> None:
    attrs = {"outcome": str(verdict.outcome), "reason": verdict.reason,
             "duration_s": round(duration, 3), **verdict.metrics}  # fmt: skip
    step = verdict.metrics.get("step_time_s")
    value = float(step) if verdict.outcome == Outcome.OK and step else None
    state = TrialState.COMPLETE if value is not None else (
        TrialState.FAIL if verdict.outcome in RETRYABLE else TrialState.PRUNED)  # fmt: skip
    with storage_errors(f"recording trial {trial.number}"):
        backend = upsert_backend(study._storage)
        if backend is not None and _tells_nothing(study.sampler) and (
            value is None or not math.isnan(value)  # NaN: Optuna fails it, with a warning
        ):  # fmt: skip
            study._thread_local.cached_all_trials = None  # as Study.tell
            write_trial(backend, trial, {}, attrs, end=(state, value), keep=True)
            return
        set_user_attrs(trial, attrs)
        if value is not None:
            study.tell(trial, value)
        else:
            study.tell(trial, state=state)


def _tells_nothing(sampler: optuna.samplers.BaseSampler) -> bool:
    """Whether ``sampler`` does nothing when a trial ends (Optuna's random sampler, the model
    sampler): then ``Study.tell`` is its refusal of a finished trial, which the one-transaction
    write keeps, and ``set_trial_state_values``; its two reads of the trial through the ORM
    (before, and a copy to return) are not needed. Another sampler (TPE, GP, grid) is told
    through Optuna."""
    after = type(sampler).after_trial
    return after is optuna.samplers.BaseSampler.after_trial or isinstance(
        sampler, ModelGuidedSampler)  # fmt: skip


def guarded(what: str, fn: Callable[[], T]) -> T:
    """``fn()`` with storage failures turned into :class:`StorageError`."""
    with storage_errors(what):
        return fn()
