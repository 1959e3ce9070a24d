"""Every sampler a study may use, by ``search.sampler``: the model sampler
(:class:`tuner.search.sampler.ModelGuidedSampler`, the default) and Optuna's own."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.calibrate.store import Observation
from tuner.errors import StudyError
from tuner.models.rates import Rates
from tuner.search.sampler import ModelGuidedSampler
from tuner.space.enumerate import SharedSpace
from tuner.space.trials import distributions
from tuner.spec.study import StudySpec


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its ``study.stop()`` once the grid is visited: that works
    inside ``study.optimize`` only and raises under ask/tell. The loop checks exhaustion."""

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
        values: Sequence[float] | None,
    ) -> None:  # fmt: skip
        return None


def make_sampler(
    spec: StudySpec, history: Sequence[Observation] = (), rates: Rates | None = None,
    space: SharedSpace | None = None,
) -> optuna.samplers.BaseSampler:  # fmt: skip
    """model (the default: :mod:`tuner.search.sampler`, starting from the cluster's saved
    ``history`` and reading ``space``, the loop's shared enumeration), tpe (multivariate, constant
    liar for parallel trials), gp, random or grid."""
    s = spec.search
    if s.sampler == "model":
        return ModelGuidedSampler(spec, seed=s.seed, history=history, rates=rates, space=space)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.sampler == "grid":
        grid = {
            k: list(d.choices)
            for k, d in distributions(spec).items()
            if isinstance(d, CategoricalDistribution)
        }
        return _GridSampler(grid, seed=s.seed)
    if s.sampler == "gp":
        try:
            import torch  # noqa: F401  # Optuna's GP sampler runs on torch
        except ImportError:
            raise StudyError(
                "search.sampler 'gp' needs torch and scipy (pip install 'paratune[gp]'); "
                "the default 'model' sampler does not"
            ) from None
        return optuna.samplers.GPSampler(seed=s.seed)
    with warnings.catch_warnings():  # group=True is experimental in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            multivariate=True, group=True, constant_liar=True, seed=s.seed, n_startup_trials=5
        )
