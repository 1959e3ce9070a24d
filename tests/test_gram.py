"""tuner.search.gram: the rows' posterior from the candidates' kept products is the rows'
posterior, and the model sampler's beliefs and choices with it are the ones without."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_ranking import STUDY, _same, _study_with_history
from tuner.search import gram as gram_module
from tuner.search.gram import Gram, GramPosterior
from tuner.search.ranking import RowPosterior, covariance, loo_residuals
from tuner.search.sampler import ModelGuidedSampler
from tuner.spec.file import study_from_mapping


def test_a_fit_from_the_kept_products_is_the_rows_fit() -> None:
    rng = np.random.default_rng(3)
    n_cand, features = 120, 50
    precision = 1.0 / np.square(rng.uniform(0.1, 0.5, features))
    x = np.c_[np.ones(n_cand), rng.integers(0, 2, size=(n_cand, features - 1))].astype(float)
    gram = Gram(x, precision)
    for rows in ([5, 17, 3], [5, 17, 3, 40, 41, 99, 0], list(range(0, 90, 3))):
        y = rng.normal(0, 0.3, len(rows))
        noise = rng.uniform(0.02, 0.1, len(rows))
        assert gram.fits(rows)
        kept = gram.fit(rows, y, noise)
        plain = RowPosterior(precision, x[rows], y, noise)
        z = [1, 5, 60, 119, 17]
        for a, b in zip(kept.predict_rows(z), plain.predict(x[z]), strict=True):
            assert np.allclose(a, b, rtol=1e-10, atol=1e-12)
        for a, b in zip(kept.predict(x[z]), plain.predict(x[z]), strict=True):
            assert np.allclose(a, b, rtol=1e-10, atol=1e-12)
        assert np.allclose(kept.mean, plain.mean, rtol=1e-10, atol=1e-12)
        assert np.allclose(covariance(kept, x[z]), covariance(plain, x[z]), atol=1e-12)
        assert np.allclose(loo_residuals(kept, x[rows], y, noise, len(rows)),
                           loo_residuals(plain, x[rows], y, noise, len(rows)))  # fmt: skip
    assert not gram.fits(list(range(features)))  # as many rows as features: the weights' form


def test_columns_are_computed_once_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.eye(6)
    gram = Gram(x, np.ones(6))
    gram.block([1, 2])
    first = gram._columns[1]
    gram.block([2, 1, 3])
    assert gram._columns[1] is first and sorted(gram._columns) == [1, 2, 3]
    monkeypatch.setattr(gram_module, "MAX_KEPT", 4 * 6)  # four columns of six candidates
    assert gram.fits([1, 2, 3, 4]) and not gram.fits([1, 4, 5])


def test_the_samplers_belief_and_choice_are_the_ones_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = study_from_mapping(STUDY)
    study = _study_with_history(s)
    trials = study.get_trials(deepcopy=False)
    used: list[bool] = []
    real = Gram.fit

    def fit(self: Gram, *a: object, **k: object) -> GramPosterior:
        used.append(True)
        return real(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(Gram, "fit", fit)
    kept = ModelGuidedSampler(s, seed=0)
    with_gram = kept.belief(trials), kept.choose(trials), kept.chance_to_beat(trials, 0.02)
    assert used and isinstance(with_gram[0].fitted if with_gram[0] else None, GramPosterior)
    monkeypatch.setattr(Gram, "fits", lambda self, rows: False)
    plain = ModelGuidedSampler(s, seed=0)
    without = plain.belief(trials), plain.choose(trials), plain.chance_to_beat(trials, 0.02)
    _same(with_gram[0], without[0])
    assert with_gram[1] == without[1]
    assert with_gram[2] is not None and without[2] is not None
    assert with_gram[2][0] == pytest.approx(without[2][0], rel=1e-9)
    assert with_gram[2][1] == without[2][1]
