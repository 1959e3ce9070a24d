"""The report's parameter importances figure is Optuna's (``plot_param_importances`` with its
default evaluator, PED-ANOVA), the same JSON, on studies with regimes of every kind."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import optuna
import pytest
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState, create_trial

from tuner.report import importances as I

pytestmark = pytest.mark.filterwarnings("ignore")  # Optuna's warnings of small regimes


def _target(t: FrozenTrial) -> float:
    """Lower is better, as the report's; not finite for an infinite value (left out)."""
    return -1.0 / float(t.value) if math.isfinite(float(t.value)) else math.nan


def _trials(n: int, seed: int) -> list[FrozenTrial]:
    """``n`` completed trials with: a knob whose distribution changes part-way (two regimes,
    one of a single trial now and then), equal distributions as separate objects (one
    regime), a knob some trials lack (the regime without it), one of a single choice, an
    integer and a float knob, ties and infinite values."""
    rng = random.Random(seed)
    shared = CategoricalDistribution([1, 2, 4, 8])
    trials = []
    for i in range(n):
        dists: dict[str, BaseDistribution] = {
            "tp": shared if i % 3 else CategoricalDistribution([1, 2, 4, 8]),  # equal, apart
            "pp": CategoricalDistribution([1, 2] if i < n // 2 else [1, 2, 4]),
            "one": CategoricalDistribution(["x"]),
            "mbs": IntDistribution(1, 8),
            "lr": FloatDistribution(1e-4, 1e-2, log=True),
        }
        if i == n - 1:
            dists["pp"] = CategoricalDistribution([1, 2, 4, 8, 16])  # a regime of one trial
        if i % 4 == 0:
            dists["vp"] = CategoricalDistribution([1, 2])
        params = {
            k: (rng.choice(d.choices) if isinstance(d, CategoricalDistribution)
                else rng.randint(1, 8) if isinstance(d, IntDistribution)
                else 10 ** rng.uniform(-4, -2))
            for k, d in dists.items()
        }  # fmt: skip
        value = rng.choice([1.0, 2.0, 3.0]) if i % 5 == 0 else rng.uniform(0.5, 4.0)
        if i % 17 == 16:
            value = math.inf
        trials.append(create_trial(state=TrialState.COMPLETE, value=value, params=params,
                                   distributions=dists))  # fmt: skip
    return trials


def _study(trials: list[FrozenTrial]) -> optuna.Study:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    study.add_trials(trials)
    return study


PARAMS = [["tp", "pp", "one", "mbs", "lr", "vp"], ["pp", "tp"], ["one"]]


@pytest.mark.parametrize(("n", "seed"), [(12, 0), (40, 1), (300, 2), (301, 3)])
@pytest.mark.parametrize("params", PARAMS)
def test_the_importances_are_optunas_figure(n: int, seed: int, params: list[str]) -> None:
    study = _study(_trials(n, seed))
    want = I._optunas(study, params, _target, "tokens/s/GPU").to_json()
    assert I.plot_param_importances(study, params, _target, "tokens/s/GPU").to_json() == want


def test_the_regimes_are_optunas_in_its_order() -> None:
    from optuna.importance._ped_anova.evaluator import _partition_by_regime

    trials = _trials(120, 4)
    params = ["tp", "pp", "one", "vp"]
    ours = I._regimes(params, trials)
    place = {id(t): i for i, t in enumerate(trials)}
    for param in params:
        theirs = _partition_by_regime(param, trials, 2)
        assert list(ours[param]) == list(theirs)  # the same distributions, in its order
        assert [sorted(m) for m in ours[param].values()] == [
            [place[id(t)] for t in ts] for ts in theirs.values()]  # fmt: skip
    assert len(ours["pp"]) == 2 and len(ours["tp"]) == 1 and None in ours["vp"]


def test_what_it_does_not_cover_is_drawn_by_optuna(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Optuna version, fewer than two finite targets, no parameters: Optuna's own
    figure; a parameter no trial has: Optuna's error."""
    assert optuna.__version__.startswith(I.CHECKED)  # else the comparisons above compare nothing
    calls: list[int] = []
    optunas = I._optunas

    def counted(study: optuna.Study, params: list[str], target: Callable[[FrozenTrial], float],
                name: str) -> object:  # fmt: skip
        calls.append(1)
        return optunas(study, params, target, name)

    monkeypatch.setattr(I, "_optunas", counted)
    study = _study(_trials(40, 5))
    I.plot_param_importances(study, ["tp"], _target, "t")
    assert calls == []
    I.plot_param_importances(_study(_trials(40, 5)[15:17]), ["tp"], _target, "t")  # one inf
    assert calls == [1]
    with pytest.raises(ValueError, match="Missing parameters"):
        I.plot_param_importances(study, ["tp", "nothing"], _target, "t")
    assert I.plot_param_importances(study, [], _target, "t").data == ()  # no bars, as Optuna
    assert len(calls) == 3
    monkeypatch.setattr(I, "CHECKED", "0.0.")
    I.plot_param_importances(study, ["tp"], _target, "t")
    assert len(calls) == 4
