"""tuner.search.fold: the saved calibration folded into the prior once gives the posterior of
the fit with every saved observation a row."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tests.test_calibration import observations, off_model, run, spec
from tuner.calibrate import correction
from tuner.calibrate.store import Observation, measured_startup_s
from tuner.search import fold
from tuner.search.ranking import RowPosterior, loo_scale
from tuner.search.sampler import ModelGuidedSampler


def test_a_folded_basis_fits_as_every_row_at_once() -> None:
    rng = np.random.default_rng(5)
    features, n_saved = 12, 40
    precision = rng.uniform(0.5, 4.0, features)
    x = rng.integers(0, 2, (30, features)).astype(float)
    x[:, 0] = 1.0
    saved = rng.integers(0, 2, (n_saved, features)).astype(float)
    ys, ns = rng.normal(0.1, 0.2, n_saved), rng.uniform(0.05, 0.3, n_saved)
    basis = fold.folded(x, precision, saved, ys, ns, fold.plain(x, precision))
    assert basis.folded and np.array_equal(basis.precision, np.ones(features))
    own = [3, 7, 11, 20]
    y = rng.normal(0.0, 0.2, len(own))
    full = correction.fit(precision, np.vstack([x[own], saved]), np.concatenate([y, ys]),
                          np.concatenate([np.full(len(own), 0.05), ns]))  # fmt: skip
    for post in (RowPosterior(basis.precision, basis.x[own], y - basis.offset[own], 0.05),
                 basis.gram.fit(own, y - basis.offset[own], 0.05)):  # fmt: skip
        mu, sd = post.predict(basis.x)
        mu_full, sd_full = full.predict(x)
        assert np.allclose(mu + basis.offset, mu_full, rtol=1e-9, atol=1e-10)
        assert np.allclose(sd, sd_full, rtol=1e-9, atol=1e-10)
    raw = rng.integers(0, 2, (3, features)).astype(float)  # rows that are not candidates
    xr, shift = basis.rows(raw)
    assert np.allclose(xr @ xr.T, raw @ np.linalg.inv(
        np.diag(precision) + saved.T @ (saved / ns[:, None] ** 2)) @ raw.T)  # fmt: skip
    assert np.allclose(shift, raw @ basis.mean)
    # broken: the saved rows' prior mean left out, the predictions are not the full fit's
    post = RowPosterior(basis.precision, basis.x[own], y, 0.05)
    assert not np.allclose(post.predict(basis.x)[0], full.predict(x)[0], atol=1e-3)


@pytest.fixture(scope="module")
def history() -> tuple[object, tuple[Observation, ...]]:
    """A study of 6 trials and a calibration of another study's 5 trials (one an OOM, saved
    twice: a bound, not folded) and 2 of the study's own."""
    s = spec()
    study, _, _ = run(s, off_model(s), 6, memory=lambda c: 20.0)
    other = run(spec("other"), off_model(s), 5, memory=lambda c: 22.0)[0]
    saved = observations(spec("other"), other)
    oom = dataclasses.replace(saved[-1], outcome="oom", measured_step_s=None)
    return study, (*observations(s, study)[:2], *saved[:-1], oom, oom)  # the OOM twice: one row


def _reference(sampler: ModelGuidedSampler, trials: list[object]) -> dict[str, object]:
    """The belief and the memory fit as a fit with every saved observation a row: the
    correction's plain weights' form (tuner.calibrate.correction)."""
    obs = sampler._observed.of(trials, sampler._gpu_gib)  # type: ignore[arg-type]
    index = {k: i for i, k in enumerate(sampler._keys)}
    past = sampler._past(trials)  # type: ignore[arg-type]
    seen = [index[k] for k in obs.measured]
    rows = [o for o in past if o.time_ratio]
    noise, fp = sampler._prior.noise, sampler._fingerprint
    x = np.vstack([sampler._x[seen], [sampler._features(o.parallel_config()) for o in rows]])
    y = np.concatenate([
        [math.log(obs.measured[sampler._keys[i]]) for i in seen] - sampler._log_pred[seen],
        [o.time_ratio for o in rows],
    ])  # fmt: skip
    sds = np.array([noise] * len(seen) + [math.hypot(noise, o.transfer_sd(fp)) for o in rows])
    post = correction.fit(sampler._precision, x, y, sds)
    mem = [o for o in past if o.memory_ratio]
    m = sampler._prior.memory_noise
    mseen = [(index[k], v) for k, v in obs.memory.items()]
    xm = np.vstack([sampler._xm[[i for i, _ in mseen]],
                    [sampler._features.memory_row(o.parallel_config(), o.activation_share)
                     for o in mem]])  # fmt: skip
    ym = np.array([v for _, v in mseen] + [o.memory_ratio for o in mem])
    oom_keys = {o.key() for o in obs.ooms.values()}
    bound = np.array([k in oom_keys for k in obs.memory] + [o.outcome == "oom" for o in mem])
    nm = np.array([m] * len(mseen) + [math.hypot(m, o.transfer_sd(fp)) for o in mem])
    memory = correction.lift_ooms(correction.fit, sampler._features.memory_precision, xm, ym,
                                  bound, nm)  # fmt: skip
    scale = loo_scale(sampler._precision, x, y, sds, len(seen)) if len(seen) >= 2 else None
    return {"time": post, "memory": memory, "scale": scale, "memory_args": (index, oom_keys)}


@pytest.mark.parametrize("n", [0, 3, 6])
def test_the_samplers_folded_fits_are_the_row_by_row_ones(
    history: tuple[object, tuple[Observation, ...]], n: int
) -> None:
    study, saved = history
    s = spec()
    sampler = ModelGuidedSampler(s, history=saved)
    trials = study.get_trials(deepcopy=False)[:n]  # type: ignore[attr-defined]
    b = sampler.belief(trials)
    assert b is not None
    ref = _reference(sampler, trials)
    mu, sd = ref["time"].predict(sampler._x[b.open_])  # type: ignore[attr-defined]
    assert np.allclose(b.mu - sampler._log_pred[b.open_], mu, rtol=1e-8, atol=1e-10)
    assert np.allclose(b.sd, sd, rtol=1e-8, atol=1e-10)
    if ref["scale"] is not None:
        assert b.scale == pytest.approx(ref["scale"][0], rel=1e-8)  # type: ignore[index]
        assert b.dof == ref["scale"][1]  # type: ignore[index]
    every = list(range(len(sampler._keys)))
    index, oom_keys = ref["memory_args"]  # type: ignore[misc]
    obs = sampler._observed.of(trials, sampler._gpu_gib)
    fitted = sampler._memory_fit(every, obs.memory, index, oom_keys, sampler._past(trials))
    assert fitted is not None
    mu_m, sd_m = ref["memory"].predict(sampler._xm)  # type: ignore[attr-defined]
    assert np.allclose(fitted[0], mu_m, rtol=1e-8, atol=1e-10)
    assert np.allclose(fitted[1], sd_m, rtol=1e-8, atol=1e-10)
    # the saved calibration was folded and moved the prior (not a comparison of two priors)
    time, memory = sampler._folded(sampler._past(trials)).bases
    assert time.folded and memory.folded
    assert np.abs(time.offset).max() > 1e-2 and np.abs(memory.offset).max() > 1e-2


def test_the_saved_rows_are_folded_once_per_list(
    history: tuple[object, tuple[Observation, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    study, saved = history
    calls: list[int] = []
    real = fold.folded

    def counted(*a: object) -> fold.Basis:
        calls.append(len(a[2]))  # type: ignore[arg-type]
        return real(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(fold, "folded", counted)
    sampler = ModelGuidedSampler(spec(), history=saved)
    trials = study.get_trials(deepcopy=False)  # type: ignore[attr-defined]
    for n in (4, 5, 6, 6):  # the two own observations are among the first trials: one list
        sampler.choose(trials[:n])
    past = sampler._past(trials)
    timed = [o for o in past if o.time_ratio]
    peaks = [o for o in past if o.memory_ratio and o.outcome != "oom"]  # the OOM stays a row
    assert calls == [len(timed), len(peaks)] and all(calls)  # the time and memory rows, once


def test_a_seeded_study_asks_the_same_configs_with_nothing_kept(
    history: tuple[object, tuple[Observation, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same asks of a seeded study, with what is kept per list of saved observations
    (the folds, the OOMs, the configs that ran, the start-ups' median) made afresh each ask."""
    _, saved = history
    s = spec("third")
    kept = run(s, off_model(s), 8, past=saved, memory=lambda c: 21.0)[1]
    real_of, real_startup = fold.Folds.of, fold.Folds.startup_s

    def of(self: fold.Folds, *a: object) -> fold.Past:
        self._of = None
        return real_of(self, *a)  # type: ignore[arg-type]

    def startup_s(self: fold.Folds, *a: object) -> float | None:
        self._median = None
        return real_startup(self, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(fold.Folds, "of", of)
    monkeypatch.setattr(fold.Folds, "startup_s", startup_s)
    fresh = run(s, off_model(s), 8, past=saved, memory=lambda c: 21.0)[1]
    assert len(kept) == 8 and [c.key() for c in kept] == [c.key() for c in fresh]


def test_the_kept_start_up_median_is_the_fresh_one() -> None:
    x, precision = np.eye(3), np.ones(3)
    folds = fold.Folds(fold.plain(x, precision), fold.plain(x, precision))
    past = dataclasses.replace(folds.plain, startups=(40.0, 50.0))
    other = dataclasses.replace(folds.plain, startups=(90.0,))
    own: list[float] = []
    for value in (None, 10.0, 20.0, 300.0, 0.0):
        for p in (past, other, past):
            assert folds.startup_s(p, own) == measured_startup_s(
                [], "f", [*p.startups, *own]
            )  # fmt: skip
        own.append(value)  # type: ignore[arg-type]  # a trial without a start-up: None
    assert folds.startup_s(folds.plain, []) is None
