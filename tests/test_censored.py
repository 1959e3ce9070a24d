"""An OOM is a censored observation of its config's peak: the memory fit's posterior under it
is the one-sided likelihood's, moment-matched (tuner.calibrate.correction.lift_ooms)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.calibrate import correction


def tilted_moments(prior_sd: float, bound: float, noise: float) -> tuple[float, float]:
    """Mean and sd of ``f ~ N(0, prior_sd^2)`` given ``f + e >= bound``, ``e ~ N(0, noise^2)``,
    by quadrature on a fine grid (no closed form used)."""
    f = np.linspace(-8 * prior_sd, 8 * prior_sd, 200_001)
    like = 0.5 * (1 + np.vectorize(math.erf)((f - bound) / (noise * math.sqrt(2))))
    weight = np.exp(-0.5 * (f / prior_sd) ** 2) * like
    mean = float(np.sum(f * weight) / np.sum(weight))
    var = float(np.sum((f - mean) ** 2 * weight) / np.sum(weight))
    return mean, math.sqrt(var)


@pytest.mark.parametrize(("prior_sd", "bound"), [(1.0, 0.096), (0.3, 0.35), (0.2, -0.1)])
def test_one_oom_gives_the_censored_posterior(prior_sd: float, bound: float) -> None:
    """One shared factor, one OOM: the fit's mean and sd of the factor are those of the exact
    posterior under the one-sided likelihood. (Lifting the bound above the fit and reading it
    as a peak measured there gave an sd of about the peak noise: a bound read as a measurement.)"""
    noise = 0.05
    x = np.ones((1, 1))
    post = correction.lift_ooms(correction.fit, np.array([1 / prior_sd**2]), x,
                                np.array([bound]), np.array([True]), noise)  # fmt: skip
    mu, sd = post.predict(x)
    want_mu, want_sd = tilted_moments(prior_sd, bound, noise)
    assert mu[0] == pytest.approx(want_mu, abs=2e-3)
    assert sd[0] == pytest.approx(want_sd, rel=2e-2)
    assert sd[0] > 2 * noise  # a bound leaves the factor open above it


def test_a_measured_peak_outweighs_an_oom_bound_below_it() -> None:
    """An OOM bound below a measured peak of the same config says almost nothing more: the fit
    stays at the peak."""
    x = np.ones((2, 1))
    post = correction.lift_ooms(correction.fit, np.array([1.0]), x, np.array([0.3, 0.0]),
                                np.array([False, True]), 0.05)  # fmt: skip
    mu, _ = post.predict(x[:1])
    assert mu[0] == pytest.approx(0.3, abs=5e-3)
