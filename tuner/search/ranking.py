"""The model sampler's ranking after a measurement, without redoing the first one's work.

The first ranking enumerates the space and estimates every config (seconds for thousands of
configs); the model sampler keeps what it read then, once, as arrays over the admitted configs
(:meth:`tuner.search.sampler.ModelGuidedSampler._candidates`: predicted log step, peak and
allocated memory, feature rows), and never enumerates or estimates again. After a measurement
only the correction changes: a Bayesian linear regression (:mod:`tuner.calibrate.correction`)
refitted on the ``n`` measured rows and applied to the ``N`` cached rows.

Fitted the usual way, that costs an inverse of the ``F x F`` precision matrix (``F``, the
features: the knob values and their pairs, hundreds to thousands) per fit, and ``N F^2`` to
apply it; the sampler fits a dozen times per ask (time, the running configs' believed values,
the memory fit's OOM passes, one leave-one-out fit per measured config), which made an ask
after twelve measurements of gpt-70b cost about as much as the first enumeration. Here the same
posterior is written in the rows' space (the weight-space and function-space forms of Gaussian
process regression are one posterior, Rasmussen and Williams, *Gaussian Processes for Machine
Learning*, 2006, sections 2.1-2.2): with the prior covariance ``S`` (diagonal) and the noise
``D``,

    K = X S X^T + D                      (n x n)
    mean(z) = z S X^T K^-1 y
    var(z)  = z S z^T - (z S X^T) K^-1 (X S z^T)

so a fit inverts an ``n x n`` matrix and ranking ``N`` configs costs ``N F n``: a refit is
proportional to the measurements made, not to the size of the feature space squared. While
there are at least as many rows as features the weight-space form is cheaper and is used. Both
forms give one posterior; ``tests/test_ranking.py`` checks the sampler's beliefs and choices
equal with either.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from tuner.calibrate.correction import Posterior, lift_ooms
from tuner.search import normal
from tuner.search.content import content


class RowPosterior:
    """The posterior of the correction weights kept in the rows' space (module docstring);
    ``predict`` gives what :meth:`Posterior.predict` gives for the same fit."""

    def __init__(
        self, prior_precision: np.ndarray, x: np.ndarray, y: np.ndarray,
        noise: float | np.ndarray,
    ) -> None:  # fmt: skip
        self._prior_var = 1.0 / prior_precision
        self._xs = x * self._prior_var  # X S
        self._solve(self._xs @ x.T, y, noise)

    def _solve(self, xsx: np.ndarray, y: np.ndarray, noise: float | np.ndarray) -> None:
        """The fit from ``X S X^T`` (``xsx``), with ``_prior_var`` and ``_xs`` set."""
        variance = np.broadcast_to(np.square(np.asarray(noise, dtype=float)), y.shape)
        k = xsx + np.diag(variance)
        self._k_inv = np.linalg.inv(k)
        self.alpha = self._k_inv @ y
        """``K^-1 y``: with ``K^-1``'s diagonal, each row's leave-one-out residual."""
        self.mean = self._xs.T @ self.alpha
        """The posterior mean of the weights (as :attr:`Posterior.mean`)."""

    def predict(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the correction for the rows of ``z``."""
        mu = z @ self.mean
        a = z @ self._xs.T  # z S X^T
        var = np.square(z) @ self._prior_var - ((a @ self._k_inv) * a).sum(axis=1)
        return mu, np.sqrt(np.maximum(var, 1e-12))


def covariance(post: Posterior | RowPosterior, z: np.ndarray) -> np.ndarray:
    """The posterior covariance of the correction between the rows of ``z`` (``predict``'s sd
    is the square root of its diagonal): configs that share measured knob values move together.
    In the rows' space ``z S z^T - (z S X^T) K^-1 (X S z^T)``; in the weights' ``z C z^T``."""
    if isinstance(post, RowPosterior):
        a = z @ post._xs.T
        return np.asarray((z * post._prior_var) @ z.T - a @ post._k_inv @ a.T)
    return np.asarray(z @ post.cov @ z.T)


def cross_covariance(post: Posterior | RowPosterior, z: np.ndarray, z0: np.ndarray) -> np.ndarray:
    """The posterior covariance of the correction between each row of ``z`` and the one row
    ``z0`` (one column of :func:`covariance`, without the ``N x N`` matrix)."""
    if isinstance(post, RowPosterior):
        a, a0 = z @ post._xs.T, post._xs @ z0
        return np.asarray((z * post._prior_var) @ z0 - a @ (post._k_inv @ a0))
    return np.asarray(z @ (post.cov @ z0))


def correlation(post: Posterior | RowPosterior, z: np.ndarray, noise: float) -> np.ndarray:
    """The correlation of the rows of ``z``'s log step times *against the best measured one*:
    :func:`covariance`, plus the run-to-run ``noise`` once, the same draw for every row.

    A config's predictive sd (:meth:`~tuner.search.value.Belief.spread`) carries the noise
    because the best it is compared with is a measurement: the difference of an untried
    config's true step time and the best's measured one is the correction's doubt plus the
    best's measurement error. That error is one number, shared by every comparison with the
    same best; an untried config's true step time has no run-to-run noise of its own. Drawn
    independently per config, the noise of 256 configs would count a lucky measurement's
    chance 256 times (at a 3 % noise, 256 well-known configs each 6 % slower than the best
    would together "beat it by 1 %" nine times in ten), none of them a real gain. Each
    config's own chance is the same either way (the diagonal is unchanged), and doubts the
    correction holds apart (knob values not measured yet) still add up."""
    cov = covariance(post, z) + noise**2
    sd = np.sqrt(np.clip(np.diag(cov), 1e-24, None))
    return np.asarray(cov / np.outer(sd, sd))


FITS_KEPT = 6
"""How many recent fits :func:`fit` and :func:`fit_memory` keep (each a few MiB at most: the
``F x F`` covariance, or the rows' ``n x F`` and ``n x n`` matrices): an ask makes three (the
memory fit, the time fit, the time fit with the running configs believed), so the last two
asks'."""

_fits: OrderedDict[tuple[object, ...], Posterior | RowPosterior] = OrderedDict()
_fits_lock = threading.Lock()

Post = Posterior | RowPosterior


def _kept(kind: str, arrays: tuple[np.ndarray | float, ...], compute: Callable[[], Post]) -> Post:
    """``compute()``, or the posterior it gave for the same ``kind`` and the same ``arrays``
    (exact contents: shapes and bytes) among the last :data:`FITS_KEPT`.

    A fit is a pure function of its arrays, so the same object (the same numbers bit for bit)
    is returned for the same inputs, never recomputed. An ask refits what an earlier one fitted
    whenever nothing new was measured in between (the memory fit with its OOM passes, the time
    fit: with thousands of trials most finished ones re-measure a config, and only a config's
    first measurement is a row), and the leave-one-out width refits the ask's own time fit
    (:func:`loo_scale`). Callers only read a posterior."""
    parts = [np.asarray(a, dtype=float) for a in arrays]
    # the large arrays' bytes as kept objects, whose hash Python computed once
    key = (kind, tuple(a.shape for a in parts), *(content(a) for a in parts))
    with _fits_lock:
        post = _fits.get(key)
        if post is not None:
            _fits.move_to_end(key)
            return post
    post = compute()
    with _fits_lock:
        _fits[key] = post
        while len(_fits) > FITS_KEPT:
            _fits.popitem(last=False)
    return post


def fit(
    prior_precision: np.ndarray, x: np.ndarray, y: np.ndarray, noise: float | np.ndarray
) -> Posterior | RowPosterior:
    """:func:`tuner.calibrate.correction.fit`'s posterior, in whichever form is cheaper: the
    rows' (fewer rows than features: the usual case in a study) or the weights'; a recent fit of
    the same arrays is returned as it is (:func:`_kept`)."""

    return _kept("fit", (prior_precision, x, y, noise),
                 lambda: _fit_now(prior_precision, x, y, noise))  # fmt: skip


def _fit_now(
    prior_precision: np.ndarray, x: np.ndarray, y: np.ndarray, noise: float | np.ndarray
) -> Posterior | RowPosterior:
    """:func:`fit` without keeping it (the memory fit's passes: only their last is kept)."""
    if len(y) < len(prior_precision):
        return RowPosterior(prior_precision, x, y, noise)
    return normal.fit(prior_precision, x, y, noise)  # kept from the last fit (rows added)


def believe(post: Posterior, xb: np.ndarray, noise: float) -> Posterior:
    """``post`` (the weights' form) refitted with the rows ``xb`` added, each measured at its
    posterior mean with sd ``noise``: how the model sampler counts the configs running now.

    Such rows leave the mean where it is: conditioning on ``y_b = B m`` moves it by
    ``C B^T M^-1 (y_b - B m) = 0`` (``M = D + B C B^T``), and shrink the covariance by the
    rank-``b`` (Woodbury) update ``C - (B C)^T M^-1 (B C)`` (Rasmussen and Williams 2006,
    eq. 2.8 and appendix A.3, with ``b`` new rows). That is ``F^2 b`` work instead of a refit's
    ``n F^2 + F^3``: with thousands of trials (``n`` measured configs past the ``F``
    features) the refit's inverse was most of an ask."""
    return Posterior(post.mean, normal.add_rows(post.cov, xb, np.full(len(xb), float(noise) ** 2)))


def fit_memory(
    precision: np.ndarray, x: np.ndarray, y: np.ndarray, bound: np.ndarray,
    noise: float | np.ndarray,
) -> Posterior | RowPosterior:  # fmt: skip
    """:func:`tuner.calibrate.correction.fit_memory` under the prior ``precision`` (the
    features' memory precision, or the identity of a folded prior: :mod:`tuner.search.fold`)
    with each fit by :func:`fit`; a recent fit of the same arrays, OOM passes included, is
    returned as it is (:func:`_kept`)."""
    return _kept("memory", (precision, x, y, bound, noise),
                 lambda: lift_ooms(_fit_now, precision, x, y, bound, noise))  # fmt: skip


def loo_residuals(
    post: Posterior | RowPosterior, x: np.ndarray, y: np.ndarray, noise: float | np.ndarray,
    rows: int,
) -> np.ndarray:  # fmt: skip
    """``y - mean`` of each of the first ``rows`` rows of the fit ``post`` (of ``x``, ``y``,
    ``noise``), the mean predicted by the same fit without that row, all from the one fit:
    removing row i rescales its residual by ``1 / (1 - h_i)``, ``h_i = var_i / noise_i^2``
    its leverage (the Sherman-Morrison update of the posterior; the leave-one-out identity
    of ridge regression, which a Gaussian prior is). One fit instead of ``rows`` refits. In
    the rows' space the same residual is ``(K^-1 y)_i / (K^-1)_ii`` (no difference of nearly
    equal numbers when a row has a leverage near 1)."""
    if isinstance(post, RowPosterior):
        return np.asarray(post.alpha[:rows] / np.diag(post._k_inv)[:rows])
    mu, _, kept = _leverage(post, x, noise, rows)
    return np.asarray((y[:rows] - mu) / kept)


def _leverage(
    post: Posterior, x: np.ndarray, noise: float | np.ndarray, rows: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The weights' form's mean, noise variance and ``1 - h_i`` (``h_i = var_i / noise_i^2``,
    the leverage) of each of the first ``rows`` rows, from one prediction."""
    mu, sd = post.predict(x[:rows])
    noise_sq = np.broadcast_to(np.square(np.asarray(noise, dtype=float)), (len(x),))[:rows]
    return mu, noise_sq, 1.0 - np.square(sd) / noise_sq


def loo_sd(
    post: Posterior | RowPosterior, x: np.ndarray, noise: float | np.ndarray, rows: int
) -> np.ndarray:
    """The leave-one-out predictive sd of each of the first ``rows`` rows (the posterior's
    without that row, plus its noise), from the one fit: ``1 / sqrt((K^-1)_ii)`` in the rows'
    space (Rasmussen and Williams 2006, eq. 5.12), ``noise_i / sqrt(1 - h_i)`` in the
    weights'."""
    if isinstance(post, RowPosterior):
        return np.asarray(1.0 / np.sqrt(np.diag(post._k_inv)[:rows]))
    _, noise_sq, kept = _leverage(post, x, noise, rows)
    return np.asarray(np.sqrt(noise_sq / kept))


def loo_z(
    post: Posterior | RowPosterior, x: np.ndarray, y: np.ndarray, noise: float | np.ndarray,
    rows: int,
) -> np.ndarray:  # fmt: skip
    """Each of the first ``rows`` rows' leave-one-out residual (:func:`loo_residuals`) over
    its leave-one-out predictive sd (:func:`loo_sd`), the weights' form predicting the rows
    once for both."""
    if isinstance(post, RowPosterior):
        return np.asarray(loo_residuals(post, x, y, noise, rows) / loo_sd(post, x, noise, rows))
    mu, noise_sq, kept = _leverage(post, x, noise, rows)
    return np.asarray(((y[:rows] - mu) / kept) / np.sqrt(noise_sq / kept))


def loo_correlation_sum(
    post: Posterior | RowPosterior, x: np.ndarray, noise: float | np.ndarray, rows: int
) -> float:
    """``sum_ij R_ij^2`` of the correlation ``R`` of the first ``rows`` rows' standardised
    leave-one-out residuals (:func:`loo_z`) under the fit's own model. Those residuals are
    ``(K^-1 y)_i / sqrt((K^-1)_ii)``, so ``R`` is ``K^-1``'s block normalised to a unit
    diagonal (Rasmussen and Williams 2006, eq. 5.12: ``cov(K^-1 y) = K^-1``). In the weights'
    form ``K^-1 = D^-1 - D^-1 X C X^T D^-1`` (Woodbury; ``C`` the posterior covariance), and
    the sum is taken through ``F x F`` products, never the ``n x n`` matrix."""
    if isinstance(post, RowPosterior):
        k_inv = post._k_inv[:rows, :rows]
        d = np.diag(k_inv)
        return float(np.sum(np.square(k_inv) / np.outer(d, d)))
    noise_sq = np.broadcast_to(np.square(np.asarray(noise, dtype=float)), (len(x),))[:rows]
    u = x[:rows] / noise_sq[:, None]  # D^-1 X
    ucu = ((u @ post.cov) * u).sum(axis=1)  # (U C U^T)_ii
    d = 1.0 / noise_sq - ucu  # (K^-1)_ii
    p = 1.0 / (noise_sq * d)  # the diagonal part, normalised
    v = u / np.sqrt(d)[:, None]  # the normalised block is diag(p) - V C V^T
    cg = post.cov @ (v.T @ v)
    return float(np.sum(p**2) - 2.0 * np.sum(p * ucu / d) + np.sum(cg * cg.T))


PRIOR_WEIGHT = 1
"""How many held-out measurements the stated prior's width counts as in :func:`loo_scale`:
one (a unit-information prior, Kass and Wasserman 1995), so the study's own residuals outweigh
it from the second on, yet four lucky residuals cannot shrink the width to a quarter."""


def loo_scale(
    prior_precision: np.ndarray, x: np.ndarray, y: np.ndarray, noise: float | np.ndarray,
    rows: int, post: Posterior | RowPosterior | None = None,
) -> tuple[float, int]:  # fmt: skip
    """How wide the posterior predictive should be, as a factor of the stated prior's, and the
    degrees of freedom it is known with: from the first ``rows`` rows' standardised
    leave-one-out residuals ``z`` (:func:`loo_z`).

    Were the prior right, each ``z`` would have unit variance; a model that keeps being wrong
    by more than its prior says gets a factor above 1, one that is right more than it claims
    one below. The ``z`` are not independent: each config is predicted from the others, so
    they share what they are predicted from. With two configs and the wide intercept (an
    unknown offset shared by every config) each is the other's negative, one difference
    counted twice. Their sum of squares is a weighted sum of chi-squares, which Satterthwaite's
    approximation (Biometrics Bulletin 2(6), 1946) reads as ``mean(z^2)`` times a chi-square
    with ``m = rows^2 / sum_ij R_ij^2`` degrees of freedom (``R``, their correlation:
    :func:`loo_correlation_sum`; ``m = rows`` were they independent, 1 for two configs, about
    ``rows - 1`` with an unknown offset), rounded to a whole number and at least one. The
    factor's square has the conjugate scaled inverse-chi-square prior centred on 1 with
    :data:`PRIOR_WEIGHT` degrees of freedom, so its posterior is ``(PRIOR_WEIGHT + m
    mean(z^2)) / (PRIOR_WEIGHT + m)`` with ``PRIOR_WEIGHT + m`` degrees of freedom, and a
    config's log step time is Student's t with those (Gelman et al., Bayesian Data Analysis,
    3rd ed., section 3.3): a width learned from few residuals keeps heavy tails. Counting the
    ``z`` as independent (``m = rows``, as before) stated more certainty than the residuals
    hold: on simulated studies its 80 % interval for a known factor held it in 73 % of them
    (``tests/test_ranking.py``). Scaling the whole predictive covariance by one factor keeps
    its correlations (configs that share knob values with measured ones stay narrow).
    Choosing it by leave-one-out rather than by the marginal likelihood follows Rasmussen and
    Williams (2006, section 5.4.2): it judges the predictions themselves and holds up better
    when the model's form is wrong, which a correction of an analytical model is by
    construction. The rows after the first ``rows`` (the cluster's saved calibration) stay in
    every fit and are not scored. ``post``: that fit, when the caller has it."""
    post = fit(prior_precision, x, y, noise) if post is None else post
    parts = (prior_precision, x, np.asarray(y), np.asarray(noise, dtype=float))
    key = (rows, x.shape, *(content(a) for a in parts))  # large bytes: kept objects
    with _fits_lock:
        for kept_post, kept_key, kept in _scaled:
            if kept_post is post and kept_key == key:
                return kept
    z = loo_z(post, x, y, noise, rows)
    m = max(1, round(rows**2 / loo_correlation_sum(post, x, noise, rows)))
    dof = PRIOR_WEIGHT + m
    scaled = math.sqrt((PRIOR_WEIGHT + m * float(np.mean(np.square(z)))) / dof), dof
    with _fits_lock:
        _scaled[:] = [(post, key, scaled)]
    return scaled


_scaled: list[tuple[Posterior | RowPosterior, tuple[object, ...], tuple[float, int]]] = []
"""The last :func:`loo_scale`: its fit (the same object: :func:`fit` keeps fits), its other
inputs' bytes and its answer. An ask with nothing new measured scores the same fit again."""
