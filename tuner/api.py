"""The notebook-sized Python API: estimate a study's configs, run it, read its results.

``import tuner`` exposes these (and the model functions they build on) lazily; see ``tuner``'s
docstring. Every function takes a :class:`~tuner.spec.study.StudySpec` or a study name or path, as
``tune --study`` does. Optuna and pandas are imported only by :func:`run`, :func:`best` and
:func:`tuner.report.leaderboard.leaderboard`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import GIB, MemoryBreakdown, estimate_memory, fits
from tuner.models.rates import Rates
from tuner.models.stack import StackTerms
from tuner.models.time.estimate import TimeBreakdown, estimate_time
from tuner.models.uncertainty import band
from tuner.space.enumerate import config_from_settings, study_gpu, study_violations
from tuner.space.probes import at_risk, fit_probability
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec

if TYPE_CHECKING:
    from tuner.report.export import TrialRecord
    from tuner.study.record import Summary

__all__ = ["Estimate", "best", "estimate", "run", "study_spec"]


def study_spec(study: StudySpec | str) -> StudySpec:
    """``study`` itself, or the study of that name or path loaded (:func:`tuner.load_study`)."""
    return load_study(study) if isinstance(study, str) else study


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """One config checked against the framework's rules, with predicted memory and step time."""

    config: ParallelConfig
    """The config estimated."""
    errors: tuple[str, ...]
    """The rules it breaks (empty when valid); nothing is predicted for an invalid config."""
    memory: MemoryBreakdown | None
    """Predicted memory per GPU of the most loaded rank (bytes)."""
    time: TimeBreakdown | None
    """Predicted step time and its terms (seconds), MFU."""
    gpu_memory_gib: float
    """The study's GPU memory, after its ``gpu_memory_gib`` override."""
    fits: bool
    """Whether the predicted peak stays within ``search.memory_headroom`` of the GPU memory."""

    @property
    def valid(self) -> bool:
        """No framework rule is broken."""
        return not self.errors

    @property
    def fit_probability(self) -> float | None:
        """Chance that the peak stays within the GPU's memory, with the breakdown's stated sd
        (``MemoryBreakdown.sigma``: where its terms came from, ``tuner.models.uncertainty``)."""
        if self.memory is None:
            return None
        return fit_probability(self.memory.peak / GIB, self.gpu_memory_gib, self.memory.sigma)

    @property
    def memory_risk(self) -> bool:
        """Predicted to fit, yet at least 1% likely over the GPU's memory: not a sure fit
        (``tuner.space.probes.at_risk``)."""
        m = self.memory
        return self.fits and m is not None and at_risk(m.peak / GIB, self.gpu_memory_gib, m.sigma)

    def to_dict(self) -> dict[str, Any]:
        """The ``tune estimate --format json`` object (memory in GiB)."""
        return {
            "config": self.config.to_dict(),
            "valid": self.valid,
            "errors": list(self.errors),
            "memory": self.memory.to_dict() if self.memory else None,
            "gpu_memory_gib": self.gpu_memory_gib,
            "fits": self.fits,
            "fit_probability": self.fit_probability,
            "memory_risk": self.memory_risk,
            "time": self.time.to_dict() if self.time else None,
            "time_sigma": self.time.sigma if self.time else None,
            "step_band_s": list(band(self.time.step, self.time.sigma)) if self.time else None,
            "step_s": self.time.step if self.time else None,
            "mfu": self.time.mfu if self.time else None,
        }


def estimate(
    study: StudySpec | str,
    config: ParallelConfig | None = None,
    *,
    rates: Rates | None = None,
    terms: StackTerms | None = None,
    **settings: object,
) -> Estimate:
    """Validate one config of ``study`` and predict its memory and step time.

    Give a :class:`ParallelConfig`, or knobs as ``tune estimate --set`` takes them (``tp=8,
    pp=4, sp=True, recompute="selective"``); knobs left out take the first value of the study's
    space and DP follows from the world size. ``rates``: the cluster's measured rates
    (``tuner.profile.rates.study_rates``); the catalog's when None. ``terms``: what the
    framework probe measured (``tuner.profile.stack_terms.study_terms``); the catalog's when None.
    """
    spec = study_spec(study)
    if config is not None and settings:
        raise TypeError("give a ParallelConfig or knob settings, not both")
    if config is None:
        items = [
            f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()
        ]
        config = config_from_settings(spec, items)
    gpu = study_gpu(spec)
    errors = tuple(e.message for e in study_violations(config, spec))
    memory = time = None
    if not errors:
        memory = estimate_memory(spec.model, config, gpu, spec.framework,
                                 spec.training.precision, terms=terms)  # fmt: skip
        time = estimate_time(spec.model, spec.training, config, gpu, spec.cluster.gpus_per_node,
                             spec.framework, rates, terms=terms)  # fmt: skip
    return Estimate(
        config=config, errors=errors, memory=memory, time=time, gpu_memory_gib=gpu.memory_gib,
        fits=memory is not None and fits(memory, gpu, spec.search.memory_headroom),
    )  # fmt: skip


def run(
    study: StudySpec | str, *, n_trials: int | None = None, results: str = "results",
    storage: str | None = None, force: bool = False,
) -> Summary:  # fmt: skip
    """Search, as ``tune run`` does: launch short real runs until the budget is spent.

    ``n_trials`` overrides ``search.n_trials``; ``storage`` is an SQLAlchemy URL or journal file
    (default: ``<results>/<study>/study.db``); ``force`` resumes a study whose file changed. Run
    again to resume. Ctrl-C (SIGINT), SIGTERM or SIGHUP cancels the running trials and returns.
    Raises a :class:`~tuner.errors.TunerError` for a bad study or storage.
    """
    from tuner.study.build import build_loop
    from tuner.study.signals import stop_on_signals

    spec = study_spec(study)
    loop = build_loop(spec, storage=storage, results=results, force=force, n_trials=n_trials)
    try:
        with stop_on_signals(loop):
            return loop.run()
    finally:
        loop.executor.close()


def best(
    study: StudySpec | str, *, trial: int | None = None, storage: str | None = None,
    results: str = "results",
) -> TrialRecord:  # fmt: skip
    """The fastest measured trial of ``study`` (or trial number ``trial``), as ``tune best``
    shows it: its ``config``, ``trial`` number, ``measured`` and ``predicted`` figures, and
    ``export(kind)`` for its full run (``script``, ``sbatch``, ``args``, ``ds-config``).

    A :class:`~tuner.errors.StudyError` if nothing was measured yet; a
    :class:`~tuner.errors.ConfigError` if ``trial`` measured nothing.
    """
    from tuner.report.export import trial_record

    return trial_record(study_spec(study), trial, storage=storage, results=results)
