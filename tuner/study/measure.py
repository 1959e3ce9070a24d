"""A trial lasts as long as its measurement needs: watching running trials' logs.

The loop (:mod:`tuner.study.loop`) asks :class:`Watch` about each running trial a few times a
second. The watch reads what the trial's node logs gained since it last looked (the executors
stream them into the trial folder), keeps Megatron's iteration records, and runs the
steady-state estimator (:mod:`tuner.logs.steady`) over them. A trial is ended cleanly:

- ``precise``: its step time is known (``search.min_batches`` batches, 95 % interval within
  ``search.precision`` of the mean);
- ``raced`` (``search.race``): its interval lies entirely above the best measured trial's, so
  it cannot win. A trial that runs a proxy or fewer micro-batches per step measures a step
  that is not the full one: its interval is raced mapped through the extrapolation its
  recorded figure goes through (:meth:`Watch.why_stop`).

A trial that runs to its time limit is recorded with its figure when its log holds enough steady
batches (:func:`measured_anyway`). Logs without Megatron iteration lines (DeepSpeed's own) are
never ended early.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

from tuner.logs.megatron import iteration_records
from tuner.logs.steady import ESTIMATOR, Record, SteadyEstimate, estimate
from tuner.outcome import Outcome, figure, rankable
from tuner.spec.study import StudySpec

logger = logging.getLogger(__name__)

_READ_CHUNK = 1 << 20


class LogTail:
    """The iteration records of one trial's node logs, read incrementally (a line is read once
    it ends)."""

    def __init__(self, logs: Sequence[Path]) -> None:
        self.logs = list(logs)
        self._offsets = [0] * len(self.logs)
        self._partial = [""] * len(self.logs)
        self.records: dict[int, float] = {}
        """Iteration -> average seconds per iteration of the record ending there."""

    def read(self) -> list[Record]:
        """Read what the logs gained; every record so far, in iteration order."""
        for k, path in enumerate(self.logs):
            try:
                with path.open("rb") as f:
                    f.seek(self._offsets[k])
                    while data := f.read(_READ_CHUNK):
                        self._offsets[k] += len(data)
                        self._feed(k, data.decode("utf-8", errors="replace"))
            except OSError:
                continue  # not created yet
        return [Record(iteration=i, step_s=s) for i, s in sorted(self.records.items())]

    def _feed(self, k: int, text: str) -> None:
        *lines, self._partial[k] = (self._partial[k] + text).split("\n")
        for line in lines:
            if "iteration" not in line:
                continue
            for r in iteration_records(line):
                if r.step_time_s is not None:
                    self.records.setdefault(r.iteration, r.step_time_s)


def steady_estimate(spec: StudySpec, records: Sequence[Record]) -> SteadyEstimate:
    """The estimator with the study's warm-up floor, precision and minimum batches."""
    s = spec.search
    return estimate(records, warmup_iters=spec.launch.warmup_iters, precision=s.precision,
                    min_batches=s.min_batches)  # fmt: skip


def steady_attrs(found: SteadyEstimate) -> dict[str, Any]:
    """The estimate as trial attributes (``metrics.json`` too)."""
    return {
        "steady_step_s": found.mean_s, "steady_halfwidth_s": found.half_width_s,
        "steady_batches": found.batches, "steady_iterations": found.steady_iterations,
        "steady_estimator": ESTIMATOR,
    }  # fmt: skip


def incumbent_high(trials: Sequence[FrozenTrial], precision: float) -> float | None:
    """The upper end of the best measured trial's interval (its step time plus ``precision``
    when it recorded no interval, or one that is no figure); None before any measurement. Only
    a trial that may rank (:func:`tuner.outcome.rankable`) is the incumbent: one whose figure
    is no measurement (a stored step of 1e-320 s, its tokens/s infinite) was the best here, so
    every other trial was raced against it, while the leaderboard never ranked it."""
    done = [t for t in trials if t.value is not None and t.user_attrs.get("outcome") == "ok"
            and rankable(t.value, t.user_attrs.get("tokens_per_s"))]  # fmt: skip
    if not done:
        return None
    best = min(done, key=lambda t: float(t.value or 0.0))
    mean = figure(best.user_attrs.get("steady_step_s"))
    half = best.user_attrs.get("steady_halfwidth_s")
    width = 0.0 if half == 0 else figure(half)
    if mean is not None and width is not None:
        return mean + width
    return float(best.value or 0.0) * (1 + precision)


FullStep = Callable[[float], float]
"""A measured step of what a trial runs mapped to the full-step figure it stands for."""


class Watch:
    """Decides when a running trial's measurement is complete."""

    def __init__(
        self, spec: StudySpec, full_step: Callable[[Any, Any], FullStep | None] | None = None
    ) -> None:
        """``full_step``: given a running trial and its config, the map from what it measures to
        the full-step figure the study records for it (None: it runs at full scale), the same
        extrapolation the recorded figure goes through (:meth:`tuner.study.proxy.Proxies.
        full_step`); without it every trial is raced on its measured interval."""
        self.spec = spec
        self._full_step = full_step
        self._tails: dict[int, LogTail] = {}
        self._seen: dict[int, tuple[int, float | None]] = {}
        self._maps: dict[int, FullStep | None] = {}

    def tail(self, number: int) -> LogTail | None:
        """The tail the watch reads trial ``number``'s logs with (None before its first look):
        read on by :func:`measured_anyway` when the trial ends, instead of reading its logs
        again from their start."""
        return self._tails.get(number)

    def why_stop(self, number: int, logs: Sequence[Path], best_high: float | None,
                 to_full: FullStep | None = None) -> str | None:  # fmt: skip
        """``precise``, ``raced`` or None (go on) for trial ``number`` logging to ``logs``.

        ``to_full``: for a trial that runs a proxy or fewer micro-batches per step, the map from
        its measured step to its full-step figure (:data:`FullStep`, monotone in the measured
        step): its interval is raced through it against ``best_high``, a full-step figure, so
        the figure that ends it is the one the study would record for it (compared as
        measured, a shortened trial's interval, shorter than any full step, is never above the
        best's)."""
        tail = self._tails.setdefault(number, LogTail(logs))
        records = tail.read()
        seen = (len(records), best_high)
        if self._seen.get(number) == seen:
            return None  # nothing new since the last look
        self._seen[number] = seen
        found = steady_estimate(self.spec, records)
        if found.precise:
            return "precise"
        low = found.low_s
        if self.spec.search.race and found.enough and best_high is not None and low is not None:
            full = low if to_full is None else to_full(low) if low > 0 else None
            if full is not None and full > best_high:
                return "raced"
        return None

    def end_complete(
        self, running: Mapping[int, Any], trials: Callable[[], Sequence[FrozenTrial]]
    ) -> None:
        """Stop every running trial (:class:`tuner.study.schedule.Running`, by trial number)
        whose measurement is complete; ``trials`` reads the study's trials (only when a job
        runs)."""
        for gone in set(self._tails) - set(running):
            del self._tails[gone]  # the trial ended
            self._seen.pop(gone, None)
            self._maps.pop(gone, None)
        if not running:
            return
        high = incumbent_high(trials(), self.spec.search.precision)
        for number, run in running.items():
            job = run.job
            if job.result() is not None:
                continue
            if number not in self._maps:  # what it runs is decided at its launch: once
                full = self._full_step
                self._maps[number] = None if full is None else full(run.trial, run.config)
            logs = [job.paths.node_log(k) for k in range(len(job.request.hosts))]
            why = self.why_stop(number, logs, high, self._maps[number])
            if why is not None:
                logger.info("trial %d: measurement complete (%s); ending it", number, why)
                job.stop(why)


def measured_anyway(spec: StudySpec, verdict: Any, logs: Sequence[Path], stopped: str | None,
                    tail: LogTail | None = None) -> Any:  # fmt: skip
    """A trial ended at its time limit or by the watch is ``ok`` with its figure when its log
    holds enough steady batches; the estimate's attributes go on every verdict with records.
    ``verdict``: :class:`tuner.study.record.Verdict`. ``tail``: the watch's tail of the trial
    (:meth:`Watch.tail`), read on from where it stopped when it reads these very ``logs``."""
    paths = [Path(p) for p in logs]
    records = (tail if tail is not None and tail.logs == paths else LogTail(paths)).read()
    if not records:
        return verdict
    found = steady_estimate(spec, records)
    if verdict.outcome == Outcome.TIMEOUT:
        found = settled(spec, records, precise=stopped == "precise") or found
    metrics = {**verdict.metrics, **steady_attrs(found)}
    if verdict.outcome == Outcome.TIMEOUT and found.enough and verdict.metrics.get("step_time_s"):
        metrics["ended"] = stopped or "limit"
        return replace(verdict, outcome=Outcome.OK, reason=None, metrics=metrics)
    return replace(verdict, metrics=metrics)


def settled(spec: StudySpec, records: Sequence[Record], *, precise: bool) -> SteadyEstimate | None:
    """The estimate over the longest prefix of ``records`` that is precise (``precise``) or has
    enough batches: what the watch saw when it ended the trial, or the most a trial cut at its
    limit can say. The batch size follows the records, so a longer prefix may say less."""
    for n in range(len(records), 0, -1):
        found = steady_estimate(spec, records[:n])
        if found.precise or (found.enough and not precise):
            return found
    return None
