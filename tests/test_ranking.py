"""The model sampler's re-ranking after a measurement (tuner.search.ranking): the posterior kept
in the rows' space is the full fit's, and the sampler's beliefs and choices with it equal a full
recompute's (a new enumeration and the weight-space fit)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import numpy as np
import optuna
import pytest

from tuner.calibrate import correction
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import GIB
from tuner.outcome import Outcome
from tuner.search import fold as fold_module
from tuner.search import sampler as sampler_module
from tuner.search.ranking import (
    PRIOR_WEIGHT,
    RowPosterior,
    believe,
    correlation,
    covariance,
    cross_covariance,
    fit,
    fit_memory,
    loo_correlation_sum,
    loo_residuals,
    loo_scale,
    loo_z,
)
from tuner.search.sampler import ModelGuidedSampler
from tuner.search.value import Belief, chance, joint_chance
from tuner.space.enumerate import SharedSpace, enumerate_space
from tuner.space.trials import config_from_params, distributions
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec

STUDY: dict[str, Any] = {
    "name": "rerank",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "a100-40gb", "gpus_per_node": 8, "num_nodes": 2, "executor": "local"},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt"},
    "space": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2, 4],
              "recompute": ["none", "selective", "full"], "sequence_parallel": [True, False],
              "distributed_optimizer": [True, False]},
    "search": {"sampler": "model", "seed": 0},
}  # fmt: skip


def _random_rows(
    rows: int, rng: np.random.Generator, features: int = 40
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A random prior precision, ``rows`` one-hot rows with an intercept, their log ratios and
    per-row noise (as saved observations have): fewer rows than features fits in the rows'
    form, more in the weights'."""
    precision = 1.0 / np.square(rng.uniform(0.1, 0.5, features))
    x = np.c_[np.ones(rows), rng.integers(0, 2, size=(rows, features - 1))].astype(float)
    y = rng.normal(0, 0.3, rows)
    noise = rng.uniform(0.02, 0.1, rows)
    return precision, x, y, noise


def test_the_rows_posterior_is_the_weights_posterior() -> None:
    rng = np.random.default_rng(3)
    precision, x, y, noise = _random_rows(9, rng)
    z = np.c_[np.ones(50), rng.integers(0, 2, size=(50, len(precision) - 1))].astype(float)
    full = correction.fit(precision, x, y, noise)
    rows_form = fit(precision, x, y, noise)
    assert isinstance(rows_form, RowPosterior)
    assert np.allclose(rows_form.mean, full.mean, rtol=1e-9, atol=1e-12)
    for a, b in zip(rows_form.predict(z), full.predict(z), strict=True):
        assert np.allclose(a, b, rtol=1e-8, atol=1e-12)
    # the joint belief: one covariance in either form, its diagonal the predicted variance
    cov = covariance(rows_form, z)
    assert np.allclose(cov, covariance(full, z), rtol=1e-7, atol=1e-10)
    assert np.allclose(np.sqrt(np.diag(cov)), full.predict(z)[1], rtol=1e-7)
    # one column of it, against one row (the incumbent's), without the N x N matrix
    for post in (rows_form, full):
        assert np.allclose(cross_covariance(post, z, z[7]), cov[:, 7], rtol=1e-7, atol=1e-10)
    # at least as many rows as features: the weights' form itself
    many = np.r_[x, z]
    assert isinstance(fit(precision, many, rng.normal(size=len(many)), 0.03), correction.Posterior)


def _study_with_history(s: StudySpec) -> optuna.Study:
    """Eight measured trials (two of them OOMs) and two still running, proposed by the sampler
    with the rows' posterior; a made-up truth that the model gets wrong on tp and pp."""
    viable = {c.config.key(): c for c in enumerate_space(s).viable}
    study = optuna.create_study(sampler=ModelGuidedSampler(s, seed=0))
    for n in range(10):
        trial = study.ask(distributions(s))
        config = config_from_params(s, trial.params)
        trial.set_user_attr("key", config.key())
        trial.set_user_attr("config", dataclasses.asdict(config))
        if n >= 8:
            continue  # running
        cand = viable[config.key()]
        peak = cand.memory.peak / GIB
        if n in (2, 5):
            trial.set_user_attr("outcome", str(Outcome.OOM))
            trial.set_user_attr("predicted_peak_gib", peak)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        trial.set_user_attr("outcome", str(Outcome.OK))
        trial.set_user_attr("peak_memory_gib", 1.1 * cand.memory.allocated / GIB)
        trial.set_user_attr("predicted_allocated_gib", cand.memory.allocated / GIB)
        assert cand.time is not None
        study.tell(trial, cand.time.step * 1.4 ** math.log2(config.tp) * (0.7 if config.pp > 1
                                                                           else 1.0))  # fmt: skip
    return study


def _same(a: Belief | None, b: Belief | None) -> None:
    assert a is not None and b is not None
    assert a.open_ == b.open_
    assert np.allclose(a.mu, b.mu, rtol=1e-9, atol=1e-12)
    assert np.allclose(a.sd, b.sd, rtol=1e-6, atol=1e-9)
    assert a.best == b.best
    assert a.scale is not None and b.scale == pytest.approx(a.scale, rel=1e-6)


def test_the_incremental_ranking_equals_a_full_recompute(monkeypatch: pytest.MonkeyPatch) -> None:
    s = study_from_mapping(STUDY)
    study = _study_with_history(s)
    trials = study.get_trials(deepcopy=False)
    kept = study.sampler
    assert isinstance(kept, ModelGuidedSampler)
    incremental = kept.belief(trials), kept.choose(trials), kept.chance_to_beat(trials, 0.02)
    # from scratch: a new enumeration, every fit in the weights' space
    monkeypatch.setattr(sampler_module, "fit", correction.fit)
    monkeypatch.setattr(fold_module, "fit_memory",
                        lambda *a: correction.lift_ooms(correction.fit, *a))  # fmt: skip
    fresh = ModelGuidedSampler(s, seed=0)
    full = fresh.belief(trials), fresh.choose(trials), fresh.chance_to_beat(trials, 0.02)
    _same(incremental[0], full[0])
    assert isinstance(incremental[1], ParallelConfig) and incremental[1] == full[1]
    assert incremental[2] is not None and full[2] is not None
    assert incremental[2][0] == pytest.approx(full[2][0], rel=1e-6)
    assert incremental[2][1] == full[2][1]


def test_the_space_is_enumerated_once_whatever_is_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    real = SharedSpace.report

    def counted(self: SharedSpace) -> Any:
        calls.append(self._report is None)
        return real(self)

    monkeypatch.setattr(SharedSpace, "report", counted)
    s = study_from_mapping(STUDY)
    study = _study_with_history(s)
    assert len(study.trials) == 10
    assert calls == [True]  # enumerated for the first ask, never again


@pytest.mark.parametrize("rows", [9, 60])  # the rows' form, the weights' form
def test_leave_one_out_residuals_equal_refits_without_each_row(rows: int) -> None:
    precision, x, y, noise = _random_rows(rows, np.random.default_rng(5))
    post = fit(precision, x, y, noise)
    assert isinstance(post, RowPosterior if rows < len(precision) else correction.Posterior)
    k = rows - 3  # the last rows stay in every fit (saved observations, believed configs)
    fast = loo_residuals(post, x, y, noise, k)
    slow = []
    for i in range(k):
        keep = np.arange(rows) != i
        without = correction.fit(precision, x[keep], y[keep], noise[keep])
        slow.append(y[i] - without.predict(x[i : i + 1])[0][0])
    assert np.allclose(fast, slow, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("rows", [9, 60])  # the rows' form, the weights' form
def test_standardised_leave_one_out_residuals_equal_refits(rows: int) -> None:
    precision, x, y, noise = _random_rows(rows, np.random.default_rng(7))
    post = fit(precision, x, y, noise)
    k = rows - 3
    fast = loo_z(post, x, y, noise, k)
    slow = []
    for i in range(k):
        keep = np.arange(rows) != i
        mu, sd = correction.fit(precision, x[keep], y[keep], noise[keep]).predict(x[i : i + 1])
        slow.append((y[i] - mu[0]) / math.hypot(sd[0], noise[i]))
    assert np.allclose(fast, slow, rtol=1e-6, atol=1e-9)
    # the prior's one pseudo-residual of unit size, then the k residuals, counted as the
    # independent ones they are worth (Satterthwaite: k^2 / sum R_ij^2, their correlation's)
    k_inv = np.linalg.inv((x / precision) @ x.T + np.diag(np.square(noise)))[:k, :k]
    r = k_inv / np.sqrt(np.outer(np.diag(k_inv), np.diag(k_inv)))
    assert loo_correlation_sum(post, x, noise, k) == pytest.approx(np.sum(np.square(r)))
    m = max(1, round(k**2 / np.sum(np.square(r))))
    assert 1 <= m < k  # the residuals share what they are predicted from
    scale, dof = loo_scale(precision, x, y, noise, k)
    assert dof == PRIOR_WEIGHT + m
    mean_sq = np.mean(np.square(slow))
    assert scale == pytest.approx(math.sqrt((PRIOR_WEIGHT + m * mean_sq) / dof))


def test_the_scale_follows_how_wrong_the_model_really_was() -> None:
    # residuals drawn from the prior itself score about 1; ten times wider, about 10
    rng = np.random.default_rng(3)
    rows, features = 200, 12
    prior_sd = 0.2
    precision = np.full(features, 1.0 / prior_sd**2)
    x = rng.integers(0, 2, size=(rows, features)).astype(float)
    noise = 0.03
    for width, expected in ((1.0, 1.0), (10.0, 10.0)):
        w = rng.normal(0, prior_sd * width, features)
        y = x @ w + rng.normal(0, noise * width, rows)
        assert loo_scale(precision, x, y, noise, rows)[0] == pytest.approx(expected, rel=0.25)


def _chi2_sf(q: float, dof: int) -> float:
    """P(chi-square with ``dof`` degrees of freedom > ``q``), from the regularised gamma
    function's series for integer ``dof`` (no scipy in the test)."""
    half = q / 2.0
    if dof % 2 == 0:
        term = total = 1.0
        for k in range(1, dof // 2):
            term *= half / k
            total += term
        return math.exp(-half) * total
    total = math.erfc(math.sqrt(half))
    term = math.exp(-half) / math.sqrt(math.pi * half) if half > 0 else 0.0
    for k in range(1, (dof + 1) // 2):
        term *= half / (k - 0.5)
        total += term
    return total


def test_the_scale_posterior_covers_a_known_factor_under_adaptive_choices() -> None:
    """Many simulated studies whose correction is the stated prior's times a factor ``c``
    drawn from the scale's own prior (scaled inverse chi-square, PRIOR_WEIGHT degrees of
    freedom, centred on 1). Each measures 5 configs: the model's fastest first, then each time
    the fastest by the corrected model (choices that depend on the figures, as the sampler's
    do). The posterior the scale states (scaled inverse chi-square with its degrees of
    freedom) must cover the true ``c^2`` about as often as it claims: its central 80 %
    interval in 80 +- 5 % of studies (82.2 % here: Satterthwaite's count, rounded, is a
    little cautious). Counting the five residuals as five independent ones, as the scale did
    before, covered it in 73 %: they share what they are predicted from."""
    rng = np.random.default_rng(0)
    knobs = (4, 3, 3)
    configs = list(itertools.product(*(range(k) for k in knobs)))
    x = np.array([[1.0] + [float(c[j] == v) for j, k in enumerate(knobs) for v in range(k)]
                  for c in configs])  # fmt: skip
    precision = 1.0 / np.square(np.r_[0.5, np.full(x.shape[1] - 1, 0.2)])
    noise, studies, inside = 0.03, 1000, 0
    for _ in range(studies):
        c2 = PRIOR_WEIGHT / rng.chisquare(PRIOR_WEIGHT)
        y = math.sqrt(c2) * (
            x @ rng.normal(0, 1 / np.sqrt(precision)) + rng.normal(0, noise, len(x))
        )
        predicted = rng.normal(0, 0.2, len(x))
        chosen = [int(np.argmin(predicted))]
        while len(chosen) < 5:
            mu, _ = fit(precision, x[chosen], y[chosen], noise).predict(x)
            believed = predicted + mu
            believed[chosen] = np.inf
            chosen.append(int(np.argmin(believed)))
        scale, dof = loo_scale(precision, x[chosen], y[chosen], noise, len(chosen))
        inside += 0.1 < _chi2_sf(dof * scale**2 / c2, dof) < 0.9
    assert inside / studies == pytest.approx(0.8, abs=0.05)  # 4 binomial sd


@pytest.mark.parametrize("known", [True, False])
def test_the_joint_chance_counts_the_bests_noise_once_and_open_doubts_apart(known: bool) -> None:
    """64 untried configs, each 6 % slower than the best by the corrected model. Each is
    compared with one measured best, so the run-to-run noise in their spreads is that one
    measurement's error, shared: where the correction knows every config (a tight prior on
    each one's own term), together they have the chance one has (drawn apart, 1 - 0.99^64,
    about half); where each keeps a doubt of its own (a wide prior), the doubts add up."""
    n, noise, best = 64, 0.03, 0.0
    own_sd = 1e-4 if known else 0.05
    precision = np.r_[1e8, np.full(n, 1 / own_sd**2)]  # a known intercept, one term per config
    x = np.c_[np.ones(2), np.zeros((2, n))]  # two measured configs: intercept only
    post = fit(precision, x, np.zeros(2), noise)
    z = np.c_[np.ones(n), np.eye(n)]
    corr = correlation(post, z, noise)
    assert np.allclose(np.diag(corr), 1.0)
    _, sd = post.predict(z)
    spread = np.sqrt(np.square(sd) + noise**2)
    mu = np.full(n, best + 0.06)
    one = float(chance(mu[:1], spread[:1], best, 0.01)[0])
    together = joint_chance(mu, spread, corr, best, 0.01)
    if known:
        assert 0.005 < one < 0.02
        assert together == pytest.approx(one, abs=0.006)  # not 1 - (1 - one) ** 64
    else:
        assert 0.08 < one < 0.15
        assert together > 4 * one


@pytest.mark.parametrize("rows", [9, 60])  # the rows' form, the weights' form
def test_a_kept_fit_is_the_fit_of_the_same_arrays_and_only_of_them(rows: int) -> None:
    precision, x, y, noise = _random_rows(rows, np.random.default_rng(11))
    post = fit(precision, x, y, noise)
    fresh = RowPosterior(precision, x, y, noise) if rows < 40 else correction.fit(
        precision, x, y, noise)  # fmt: skip
    z = x[: rows // 2] + 1.0
    (mu, sd), (mu0, sd0) = post.predict(z), fresh.predict(z)
    assert np.array_equal(mu, mu0) and np.array_equal(sd, sd0)
    # equal contents in other arrays: the same posterior, not recomputed
    assert fit(precision.copy(), x.copy(), y.copy(), noise.copy()) is post
    assert fit(precision, x, y, float(noise[0])) is not post  # one noise for every row
    y2 = y.copy()
    y2[-1] += 1e-9  # one row, a little
    other = fit(precision, x, y2, noise)
    assert other is not post and not np.array_equal(other.mean, post.mean)
    x2 = x.copy()
    x2[0, 1] = 1.0 - x2[0, 1]
    assert fit(precision, x2, y, noise) is not post
    bound = np.zeros(rows, dtype=bool)
    bound[0] = True  # the memory fit: its OOM passes kept as one fit, apart from the plain one
    lifted = fit_memory(precision, x, y, bound, noise)
    assert lifted is not post
    assert fit_memory(precision, x, y, bound, noise) is lifted
    unkept = correction.lift_ooms(correction.fit, precision, x, y, bound, noise)
    assert np.allclose(lifted.predict(z)[0], unkept.predict(z)[0], rtol=1e-9, atol=1e-12)


def test_believed_rows_are_a_refit_at_their_posterior_mean() -> None:
    precision, x, y, noise = _random_rows(60, np.random.default_rng(13))  # the weights' form
    post = fit(precision, x, y, noise)
    assert isinstance(post, correction.Posterior)
    xb = x[[3, 7, 7, 20]] + np.eye(4, x.shape[1], 5)  # four running configs, two alike
    yb, _ = post.predict(xb)
    refit = correction.fit(precision, np.vstack([x, xb]), np.r_[y, yb], np.r_[noise, [0.03] * 4])
    updated = believe(post, xb, 0.03)
    assert np.allclose(updated.mean, refit.mean, rtol=1e-9, atol=1e-12)
    assert np.allclose(updated.cov, refit.cov, rtol=1e-7, atol=1e-12)
    z = x[:10] * 0.5
    for a, b in zip(updated.predict(z), refit.predict(z), strict=True):
        assert np.allclose(a, b, rtol=1e-8, atol=1e-12)
    assert (updated.predict(xb)[1] < post.predict(xb)[1]).all()  # what runs is less in doubt
