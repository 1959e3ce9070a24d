"""The models corrected by a cluster's saved calibration: for ``tune space``, ``tune estimate``,
``tune run --dry-run`` and ``tune calibrate``.

The correction is the model sampler's (:mod:`tuner.calibrate.correction`): log(measured /
predicted) step time and memory, regressed on the features of each config's knob values, Bayesian
with a prior centred on "the model is right". Fitted here on the saved observations
(:mod:`tuner.calibrate.store`) only.

The memory model keeps the last word on what may launch: a config it predicts to run out of
memory is never launched, whatever the calibrated memory says (``tune space`` lists how many the
calibration would have let through), and a config it admits but whose calibrated peak is over the
limit is tried only when nothing else is left (the sampler's rule), which ``tune space`` and
``tune run --dry-run`` say.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.calibrate.correction import (
    TIME_CHOICES,
    Features,
    Posterior,
    Prior,
    TimeChoice,
    choose_time,
    fit,
    fit_memory,
    shared_factor,
)
from tuner.calibrate.store import Observation, history, memory_fingerprint, setup_fingerprint
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import GIB
from tuner.space.enumerate import Candidate, study_gpu
from tuner.spec.study import StudySpec


@dataclass(frozen=True, slots=True)
class Corrected:
    """One config's predictions, before and after the calibration."""

    config: ParallelConfig
    step_s: float
    calibrated_step_s: float
    step_spread: float
    """Standard deviation of the log of the calibrated step time (correction + run noise)."""
    peak_gib: float
    calibrated_peak_gib: float


@dataclass(frozen=True, slots=True)
class LooRow:
    """One saved trial, predicted from all the others (leave-one-out)."""

    observation: Observation
    before: float
    """measured / predicted step time (or peak memory) by the model alone."""
    after: float
    """measured / calibrated step time (or peak), the calibration fitted without this trial."""


class Corrector:
    """Corrections fitted to saved observations, applicable to the configs of a space. The
    step-time correction applied is the one :func:`choose_time` picks (:attr:`time_choice`)."""

    def __init__(
        self, observations: Sequence[Observation], *, fingerprint: str = "",
        configs: Sequence[ParallelConfig] = (), limit_gib: float = math.inf,
        prior: Prior | None = None, memory_setup: str | None = None,
    ) -> None:  # fmt: skip
        self.prior = prior or Prior()
        self.observations = tuple(observations)
        self.ran = {  # ran on the cluster with the same model and GPU: known to fit
            o.parallel_config().key() for o in observations
            if o.outcome == "ok" and o.memory_setup == memory_setup
        }  # fmt: skip
        self.fingerprint, self.limit_gib = fingerprint, limit_gib
        self.features = Features(
            [*configs, *(o.parallel_config() for o in observations)], self.prior
        )
        self.time_choice: TimeChoice | None = None
        self.time = self._choose_time(self.observations, fingerprint)
        self.memory = self._fit_memory(self.observations)

    def _noise(self, obs: Sequence[Observation], base: float, fingerprint: str) -> np.ndarray:
        return np.array([math.hypot(base, o.transfer_sd(fingerprint)) for o in obs])

    def _time_rows(
        self, obs: Sequence[Observation], fingerprint: str
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The step-time fit's features, log ratios and noise over ``obs``' timed observations
        (None: none is timed)."""
        rows = [o for o in obs if o.time_ratio is not None]
        if not rows:
            return None
        x = np.array([self.features(o.parallel_config()) for o in rows])
        y = np.array([o.time_ratio or 0.0 for o in rows])
        return x, y, self._noise(rows, self.prior.noise, fingerprint)

    def _fit_time(
        self, obs: Sequence[Observation], fingerprint: str, kind: str = TIME_CHOICES[2]
    ) -> Posterior | None:
        """The step-time correction of ``kind`` (one of :data:`TIME_CHOICES`) fitted to
        ``obs`` (None: the model alone, or nothing timed)."""
        data = self._time_rows(obs, fingerprint)
        if data is None or kind == TIME_CHOICES[0]:
            return None
        if kind == TIME_CHOICES[1]:  # the intercept alone: every other weight stays at 0
            return shared_factor(self.features.prior_precision, *data)
        return fit(self.features.prior_precision, *data)

    def _choose_time(self, obs: Sequence[Observation], fingerprint: str) -> Posterior | None:
        """The step-time correction :func:`choose_time` picks (None: the model alone)."""
        data = self._time_rows(obs, fingerprint)
        if data is None:
            return None
        self.time_choice, post = choose_time(self.features.prior_precision, *data)
        return post

    def _fit_memory(self, obs: Sequence[Observation]) -> Posterior | None:
        rows = [o for o in obs if o.memory_ratio is not None]
        if not rows:
            return None
        x = np.array([self.features.memory_row(o.parallel_config(), o.activation_share)
                      for o in rows])  # fmt: skip
        y = np.array([o.memory_ratio or 0.0 for o in rows])
        bound = np.array([o.outcome == "oom" for o in rows], dtype=bool)
        noise = self._noise(rows, self.prior.memory_noise, self.fingerprint)
        return fit_memory(self.features, self.prior, x, y, bound, noise)

    def __bool__(self) -> bool:
        return self.time_choice is not None or self.memory is not None

    def correct(self, candidate: Candidate) -> Corrected:
        """``candidate``'s step time and peak, corrected."""
        x = self.features(candidate.config)[None, :]
        step = candidate.time.step if candidate.time else float("nan")
        peak = candidate.memory.peak / GIB
        t_mu, t_sd = self.time.predict(x) if self.time else (np.zeros(1), np.zeros(1))
        xm = self.features.memory_row(candidate.config, candidate.memory.activation_share)
        m_mu, _ = self.memory.predict(xm[None, :]) if self.memory else (np.zeros(1), np.zeros(1))
        spread = math.hypot(float(t_sd[0]), self.prior.noise)
        return Corrected(candidate.config, step, step * math.exp(float(t_mu[0])), spread,
                         peak, peak * math.exp(float(m_mu[0])))  # fmt: skip

    def factors(self) -> list[tuple[str, float]]:
        """The fitted time corrections: ``("all configs", x1.3)``, ``("tp=4", x1.1)``, ...;
        the one-knob factors that moved by more than 1 %."""
        return _factors(self.features, self.time, "all configs", lambda _knob: "")

    def memory_factors(self) -> list[tuple[str, float]]:
        """The fitted memory corrections: ``("whole peak", x1.02)``, then each knob value's
        factor on the component it sizes (``("activations, recompute=none", x1.5)``,
        ``("states, sharding=1:0", x0.9)``) that moved by more than 1 %."""
        return _factors(self.features, self.memory, "whole peak", _component)

    def memory_leave_one_out(self) -> list[LooRow]:
        """Each saved measured peak predicted by the memory calibration fitted to all the other
        observations (OOMs stay in as lower bounds; they are not predicted themselves)."""
        rows = []
        kept = [o for o in self.observations if o.memory_ratio is not None]
        for i, o in enumerate(kept):
            if o.outcome != "ok":
                continue
            post = self._fit_memory(kept[:i] + kept[i + 1 :])
            y = o.memory_ratio or 0.0
            mu = 0.0
            if post is not None:
                x = self.features.memory_row(o.parallel_config(), o.activation_share)
                mu = float(post.predict(x[None, :])[0][0])
            rows.append(LooRow(o, math.exp(y), math.exp(y - mu)))
        return rows

    def leave_one_out(self, kind: str | None = None) -> list[LooRow]:
        """Each saved measurement predicted by the step-time correction applied
        (:attr:`time_choice`; ``kind``: another of :data:`TIME_CHOICES`) fitted to all the
        others: what ``tune calibrate``'s table and error line show. The model alone applied,
        each row's calibrated ratio is its model ratio."""
        rows = []
        kind = kind or (self.time_choice.applied if self.time_choice else TIME_CHOICES[0])
        timed = [o for o in self.observations if o.time_ratio is not None]
        for i, o in enumerate(timed):
            post = self._fit_time(timed[:i] + timed[i + 1 :], o.fingerprint, kind)
            y = o.time_ratio or 0.0
            mu = 0.0
            if post is not None:
                mu = float(post.predict(self.features(o.parallel_config())[None, :])[0][0])
            rows.append(LooRow(o, math.exp(y), math.exp(y - mu)))
        return rows


def _factors(
    features: Features, post: Posterior | None, whole: str, part: Callable[[str], str]
) -> list[tuple[str, float]]:
    """``post``'s factor on every config (labelled ``whole``), then each one-knob factor that
    moved by more than 1 %, labelled ``part(knob)`` + ``knob=value``."""
    if post is None:
        return []
    out = [(whole, math.exp(float(post.mean[0])))]
    for key, i in features.index.items():
        factor = math.exp(float(post.mean[i]))
        if len(key) == 2 and abs(factor - 1) > 0.01:
            out.append((f"{part(key[0])}{key[0]}={key[1]}", factor))
    return out


def _component(knob: str) -> str:
    """The part of the peak a knob's memory factor applies to (:meth:`Features.memory_row`)."""
    return "states, " if knob == "sharding" else "activations, "


def corrector_for(
    spec: StudySpec, results: str | Path, configs: Sequence[ParallelConfig] = ()
) -> Corrector:
    """The study's cluster's calibration (falsy when nothing is saved)."""
    limit = spec.search.memory_headroom * study_gpu(spec).memory_gib
    return Corrector(history(spec, results), fingerprint=setup_fingerprint(spec), configs=configs,
                     limit_gib=limit, memory_setup=memory_fingerprint(spec))  # fmt: skip


def error_summary(rows: Sequence[LooRow]) -> dict[str, float]:
    """Mean absolute percentage error and median ratio, before and after calibration."""
    if not rows:
        return {}
    return {
        "mape_before": statistics.fmean(abs(r.before - 1) for r in rows),
        "mape_after": statistics.fmean(abs(r.after - 1) for r in rows),
        "median_ratio_before": statistics.median(r.before for r in rows),
        "median_ratio_after": statistics.median(r.after for r in rows),
    }


def memory_notes(
    corrector: Corrector, viable: Sequence[Candidate], rejected: Sequence[Candidate]
) -> list[str]:
    """What the calibrated memory would change, said out loud (it never launches a config the
    memory model rejects; it only moves admitted ones to the back of the queue)."""
    if corrector.memory is None:
        return []
    limit = corrector.limit_gib
    over = sum(
        corrector.correct(c).calibrated_peak_gib > limit and c.config.key() not in corrector.ran
        for c in viable
    )
    under = sum(corrector.correct(c).calibrated_peak_gib <= limit for c in rejected)
    notes = []
    if over:
        notes.append(
            f"calibrated memory: {over} of the {len(viable)} configs the memory model admits "
            f"would exceed {limit:.3g} GiB; they are tried only when nothing else is left"
        )
    if under:
        notes.append(
            f"calibrated memory: {under} config{'' if under == 1 else 's'} the memory model "
            "predicts to run out of memory would fit; they are still never launched (the memory "
            "model decides what launches)"
        )
    return notes
