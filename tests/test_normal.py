"""The weights' form of the correction kept from fit to fit (tuner.search.normal): a covariance
updated by added rows equals the refit's, kept predictions equal fresh ones, and the model
sampler's beliefs and choices with them equal those refitted from scratch at every ask."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import optuna
import pytest

from tests.test_ranking import STUDY as RANKING_STUDY
from tuner.calibrate import correction
from tuner.models.memory.estimate import GIB
from tuner.outcome import Outcome
from tuner.search import fold as fold_module
from tuner.search import normal, ranking
from tuner.search import sampler as sampler_module
from tuner.search.gram import Gram
from tuner.search.sampler import ModelGuidedSampler
from tuner.search.value import pick
from tuner.space.enumerate import enumerate_space
from tuner.space.trials import config_from_params, distributions
from tuner.spec.file import study_from_mapping

T = TypeVar("T")


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    normal.forget()
    yield
    normal.forget()


def _rows(rows: int, rng: np.random.Generator, features: int = 30) -> np.ndarray:
    return np.c_[np.ones(rows), rng.integers(0, 2, size=(rows, features - 1))].astype(float)


def _counted(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of ``normal.<name>``."""
    calls: list[int] = []
    real = getattr(normal, name)

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(normal, name, counted)
    return calls


def _same_fit(post: correction.Posterior, precision: np.ndarray, x: np.ndarray, y: np.ndarray,
              noise: np.ndarray) -> None:  # fmt: skip
    refit = correction.fit(precision, x, y, noise)
    assert np.allclose(post.cov, refit.cov, rtol=1e-9, atol=1e-12)
    assert np.allclose(post.mean, refit.mean, rtol=1e-9, atol=1e-12)


def test_added_rows_update_the_covariance_to_the_refits(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    precision = 1.0 / np.square(rng.uniform(0.1, 0.5, 30))
    x, noise = _rows(120, rng), rng.uniform(0.02, 0.1, 120)
    x[60] = x[10]  # a config measured twice: the same row, twice
    noise[60] = noise[10]
    refits, updates = _counted(monkeypatch, "refit"), _counted(monkeypatch, "add_rows")
    n = 40
    first = normal.fit(precision, x[:n], rng.normal(0, 0.3, n), noise[:n])
    assert len(refits) == 1
    for step in (1, 3, 1, 5, 2):  # a few new rows at a time, each ask
        n += step
        y = rng.normal(0, 0.3, n)
        post = normal.fit(precision, x[:n], y, noise[:n])
        _same_fit(post, precision, x[:n], y, noise[:n])
    assert len(refits) == 1 and len(updates) == 5
    # the same rows in another order, only y moved (an OOM pass): the covariance as it was
    order = rng.permutation(n)
    y = rng.normal(0, 0.3, n)
    again = normal.fit(precision, x[order], y[order], noise[order])
    assert again.cov is post.cov
    _same_fit(again, precision, x[order], y[order], noise[order])
    assert first.cov is not post.cov
    # a row gone, or another noise for one: refitted afresh
    normal.fit(precision, x[1:n], y[1:], noise[1:n])
    assert len(refits) == 2
    changed = noise[:n].copy()
    changed[3] *= 2
    _same_fit(normal.fit(precision, x[:n], y, changed), precision, x[:n], y, changed)
    assert len(refits) == 3
    # many rows at once: a refit (the update would cost as much)
    normal.fit(precision, x, rng.normal(0, 0.3, len(x)), noise)
    assert len(refits) == 4


def test_updates_in_a_row_are_refreshed(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    precision = 1.0 / np.square(rng.uniform(0.1, 0.5, 30))
    x, noise = _rows(40 + normal.REFRESH + 2, rng), rng.uniform(0.02, 0.1, 40 + normal.REFRESH + 2)
    refits = _counted(monkeypatch, "refit")
    for n in range(40, len(x) + 1):
        y = rng.normal(0, 0.3, n)
        _same_fit(normal.fit(precision, x[:n], y, noise[:n]), precision, x[:n], y, noise[:n])
    assert len(refits) == 2  # the first, and once REFRESH updates were made


def test_kept_predictions_are_the_posteriors_each_row_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(7)
    precision = 1.0 / np.square(rng.uniform(0.1, 0.5, 30))
    x, z = _rows(50, rng), _rows(80, rng)
    post = normal.fit(precision, x, rng.normal(0, 0.3, 50), 0.03)
    rows = [5, 2, 70, 2, 11]
    for got, want in zip(normal.predict_rows(post, z, rows), post.predict(z[rows]), strict=True):
        assert np.allclose(got, want, rtol=1e-12, atol=1e-15)
    kept = normal._rows_of(post, z, np.asarray(rows))
    assert kept.done.sum() == 4
    normal.predict_rows(post, z, [70, 1])
    assert kept.done.sum() == 5
    # the running configs believed: the same posterior and predictions as ranking.believe's
    believed, open_ = [3, 9, 9, 40], [0, 1, 2, 50, 79]
    new, mu, sd = normal.believe_rows(post, z, believed, open_, 0.03)
    plain = ranking.believe(post, z[believed], 0.03)
    assert np.allclose(new.cov, plain.cov, rtol=1e-12, atol=1e-15)
    for got, want in zip((mu, sd), plain.predict(z[open_]), strict=True):
        assert np.allclose(got, want, rtol=1e-9, atol=1e-12)
    monkeypatch.setattr(normal, "MAX_KEPT_PRODUCTS", 10)  # a huge space: nothing but mu, var
    other = normal.fit(precision, x, rng.normal(0, 0.3, 50), 0.03)
    _, mu2, sd2 = normal.believe_rows(other, z, believed, open_, 0.03)
    for got, want in zip((mu2, sd2), ranking.believe(other, z[believed], 0.03).predict(z[open_]),
                         strict=True):  # fmt: skip
        assert np.allclose(got, want, rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- the sampler

STUDY: dict[str, Any] = {**RANKING_STUDY, "name": "kept"}
"""test_ranking's re-ranking study: a space past as many measured configs as features."""


def _plain_believe(
    post: correction.Posterior, x: np.ndarray, believed: list[int], rows: list[int], noise: float
) -> tuple[Any, np.ndarray, np.ndarray]:
    new = ranking.believe(post, x[believed], noise)
    return (new, *new.predict(x[rows]))


def _afresh(fn: Callable[[], T]) -> T:
    """``fn()`` computed as before anything was kept: every fit a refit
    (:func:`tuner.calibrate.correction.fit`), every prediction and belief from the covariance;
    the kept state put back after."""
    kept = (dict(normal._states), dict(normal._predicted), dict(ranking._fits),
            list(ranking._scaled))  # fmt: skip
    for cache in (normal._states, normal._predicted, ranking._fits):
        cache.clear()
    ranking._scaled.clear()
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(ranking, "_fit_now", correction.fit)
            m.setattr(sampler_module, "believe_rows", _plain_believe)
            m.setattr(fold_module, "predict_rows",
                      lambda post, x, rows: post.predict(x[rows]))  # fmt: skip
            return fn()
    finally:
        for cache, was in zip((normal._states, normal._predicted, ranking._fits), kept,
                              strict=False):  # fmt: skip
            cache.clear()
            cache.update(was)  # type: ignore[arg-type]
        ranking._scaled[:] = kept[3]


def test_the_samplers_beliefs_and_choices_are_a_refits_at_every_ask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Thirty asks, each after one more measurement (some OOMs) with eight running: every fit
    in the weights' form (the form past as many measured configs as features), kept and
    updated between asks; at each ask the belief and the choice equal a refit's."""
    monkeypatch.setattr(Gram, "fits", lambda self, rows: False)
    monkeypatch.setattr(ranking, "_fit_now", normal.fit)
    updates = _counted(monkeypatch, "add_rows")
    s = study_from_mapping(STUDY)
    viable = {c.config.key(): c for c in enumerate_space(s).viable}
    sampler = ModelGuidedSampler(s, seed=0)
    study = optuna.create_study(sampler=sampler)
    running: list[optuna.Trial] = []
    picks = 0
    for n in range(38):
        trials = study.get_trials(deepcopy=False)
        kept = sampler.belief(trials)
        fresh = _afresh(lambda t=trials: sampler.belief(t))  # type: ignore[misc]
        if kept is not None and fresh is not None and kept.best is not None:
            assert kept.open_ == fresh.open_
            assert np.allclose(kept.mu, fresh.mu, rtol=1e-9, atol=1e-12)
            assert np.allclose(kept.sd, fresh.sd, rtol=1e-9, atol=1e-12)
            assert (kept.scale is None) == (fresh.scale is None)
            assert (kept.scale or 0.0) == pytest.approx(fresh.scale or 0.0, rel=1e-9)
            chosen = [
                pick(b.mu, b.spread(0.03), b.spread(0.03), sampler.launch_node_hours(b),
                     b.best, b.dof)[0].index
                for b in (kept, fresh)
            ]  # fmt: skip
            assert chosen[0] == chosen[1]
            picks += 1
        trial = study.ask(distributions(s))
        config = config_from_params(s, trial.params)
        trial.set_user_attr("key", config.key())
        trial.set_user_attr("config", dataclasses.asdict(config))
        running.append(trial)
        if len(running) <= 8:
            continue
        trial = running.pop(0)
        cand = viable[str(trial.user_attrs["key"])]
        if n % 7 == 3:
            trial.set_user_attr("outcome", str(Outcome.OOM))
            trial.set_user_attr("predicted_peak_gib", cand.memory.peak / GIB)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        c = config_from_params(s, trial.params)
        trial.set_user_attr("outcome", str(Outcome.OK))
        trial.set_user_attr("peak_memory_gib", (1.05 + 0.01 * n) * cand.memory.allocated / GIB)
        trial.set_user_attr("predicted_allocated_gib", cand.memory.allocated / GIB)
        assert cand.time is not None
        study.tell(trial, cand.time.step * 1.4 ** math.log2(c.tp) * (0.7 if c.pp > 1 else 1.0)
                   * (1.0 + 0.02 * math.sin(n)))  # fmt: skip
    assert picks >= 20 and len(updates) >= 20  # the kept path was taken, and compared
