"""Optuna's parameter importances figure, computed as Optuna computes it, with each trial's
target read once and the trials grouped by their distribution objects.

``optuna.visualization.plot_param_importances(study, params=..., target=...)`` with its default
evaluator (PED-ANOVA, :class:`optuna.importance.PedAnovaImportanceEvaluator`) reads every
trial's target three times and, per parameter, hashes every trial's distribution of it to
group the trials into regimes (``_partition_by_regime``): at 10,000 trials and eight
parameters, 67,000 hashes and 25,000 target calls, about half of its 0.17 s of CPU. Here the
targets are read once and the trials grouped by their distribution objects first (the report's
trials share one object per distribution), the objects then merged by equality as Optuna's
dictionary merges them, in the same order; each regime's divergence is Optuna's own
(``_compute_pearson_divergence``), so the importances are the same floats and the figure is
the same JSON. That is checked against the Optuna it was written from (:data:`CHECKED`); on
another version the figure is Optuna's own.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import optuna
import plotly.graph_objects as go
from optuna.distributions import BaseDistribution
from optuna.importance import PedAnovaImportanceEvaluator
from optuna.trial import FrozenTrial, TrialState

CHECKED = "5.1."
"""The Optuna version (prefix) whose ``plot_param_importances`` this module's figure is
(``tests/report/test_importances.py`` compares them); another draws through Optuna's."""


def plot_param_importances(
    study: optuna.Study, params: list[str], target: Callable[[FrozenTrial], float], name: str
) -> go.Figure:
    """``optuna.visualization.plot_param_importances(study, params=params, target=target,
    target_name=name)`` (PED-ANOVA; ``target``: lower is better), the same figure. Raises
    what Optuna's raises where it would (through Optuna's, on what this module does not
    cover: no parameters, fewer than two trials with a finite target)."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    values = [float(target(t)) for t in trials]
    kept = [i for i, v in enumerate(values) if math.isfinite(v)]
    known = {p for t in trials for p in t.distributions}
    covered = params and len(kept) > 1 and known >= set(params)
    if not optuna.__version__.startswith(CHECKED) or not covered:
        return _optunas(study, params, target, name)  # (it raises on a parameter unknown)
    shown = _normalised(_sorted(_ped_anova([trials[i] for i in kept],
                                           [values[i] for i in kept], params)))  # fmt: skip
    shown = dict(reversed(list(shown.items())))  # Optuna's bars: the most important on top
    every = study.get_trials(deepcopy=False)
    first = {p: next(t.distributions[p] for t in every if p in t.distributions) for p in shown}
    bar = go.Bar(
        x=list(shown.values()), y=list(shown), name=name,
        text=[f"{v:.2f}" if v >= 0.01 else "<0.01" for v in shown.values()],
        textposition="outside", cliponaxis=False, orientation="h",
        hovertemplate=[f"{p} ({first[p].__class__.__name__}): {v}<extra></extra>"
                       for p, v in shown.items()],
    )  # fmt: skip
    layout = go.Layout(title="Hyperparameter Importances",
                       xaxis={"title": "Hyperparameter Importance"},
                       yaxis={"title": "Hyperparameter"})  # fmt: skip
    return go.Figure([bar], layout)


def _optunas(
    study: optuna.Study, params: list[str], target: Callable[[FrozenTrial], float], name: str
) -> go.Figure:
    import optuna.visualization as ov

    with warnings.catch_warnings():  # the caller's target is lower-is-better already
        warnings.filterwarnings("ignore", message=".*low `target` values")
        return ov.plot_param_importances(study, target=target, params=params, target_name=name)


def _ped_anova(
    trials: Sequence[FrozenTrial], values: Sequence[float], params: list[str]
) -> dict[str, float]:
    """``PedAnovaImportanceEvaluator().evaluate`` (its defaults: the top 10 % against all
    trials, local) of ``trials`` with targets ``values``, unsorted and not normalised."""
    evaluator = PedAnovaImportanceEvaluator()
    loss = np.asarray(values)  # Optuna's _QuantileFilter, lower better
    cutoff_index = int(math.ceil(0.1 * loss.size)) - 1
    cutoff = float(np.partition(loss, cutoff_index)[cutoff_index])
    top = set(np.flatnonzero(loss <= cutoff).tolist())
    quantile = len(top) / len(trials)
    importances = dict.fromkeys(params, 0.0)
    for param, regimes in _regimes(params, trials).items():
        for dist, members in regimes.items():
            top_members = [trials[i] for i in members if i in top]
            if dist is not None and not dist.single() and top_members:
                importances[param] += (
                    (len(top_members) / len(top)) ** 2 / (len(members) / len(trials))
                    * evaluator._compute_pearson_divergence(
                        param, dist, target_trials=top_members,
                        region_trials=[trials[i] for i in members],
                    )
                )  # fmt: skip
    return {k: v * quantile**2 for k, v in importances.items()}


def _regimes(
    params: list[str], trials: Sequence[FrozenTrial], min_trials: int = 2
) -> dict[str, dict[BaseDistribution | None, list[int]]]:
    """Optuna's ``_partition_by_regime`` of each parameter: the trials (their places) by their
    distribution of it (None: without it), equal distributions one regime, in the order each
    first appears; regimes of fewer than ``min_trials`` left out (the order of the places in a
    regime is not Optuna's: its divergence counts them). The trials are grouped by the objects
    of their distributions first, so a distribution is hashed once per object, not per trial
    and parameter."""
    by_objects: dict[tuple[int, ...], tuple[tuple[BaseDistribution | None, ...], list[int]]] = {}
    for i, t in enumerate(trials):
        dists = tuple(map(t.distributions.get, params))
        if (group := by_objects.get(key := tuple(map(id, dists)))) is None:
            group = by_objects[key] = (dists, [])
        group[1].append(i)
    regimes: dict[str, dict[BaseDistribution | None, list[int]]] = {p: {} for p in params}
    for dists, members in by_objects.values():  # in the order each group first appears
        for param, dist in zip(params, dists, strict=True):
            regimes[param].setdefault(dist, []).extend(members)
    return {p: {d: m for d, m in by_dist.items() if len(m) >= min_trials}
            for p, by_dist in regimes.items()}  # fmt: skip


def _sorted(importances: dict[str, float]) -> dict[str, float]:
    """Optuna's ``_sort_dict_by_importance``: the most important first, ties in reverse."""
    return dict(reversed(sorted(importances.items(), key=lambda item: item[1])))


def _normalised(importances: dict[str, float]) -> dict[str, float]:
    """``get_param_importances``' normalisation: shares of the sum, equal shares of nothing."""
    total = sum(importances.values())
    if total == 0.0:
        return {p: 1.0 / len(importances) for p in importances}
    return {p: v / total for p, v in importances.items()}
