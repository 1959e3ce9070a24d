"""The weights' form of the correction's fit, kept from one fit to the next.

Past as many measured configs as features (``F``: 404 for gpt-70b's space; a long study measures
some 700 configs of it), the model sampler fits the correction in the weights' form
(:func:`tuner.calibrate.correction.fit`): the precision ``P = S^-1 + X^T W X`` (``S``, the
prior's diagonal covariance; ``W``, each row's noise precision) and its ``F x F`` inverse, the
posterior covariance ``C``. An ask fitted that afresh up to five times: the time fit, then the
memory fit and each of its out-of-memory passes. Yet from one ask to the next the rows change
little: a decision adds at most the few configs measured since, and the memory fit's passes
only lift the measured values of the OOM rows (``y``), never the rows themselves.

:func:`fit` keeps, per prior, the last fit's rows (as a multiset of row and weight) and ``C``:

- the same rows (another pass, or a re-measured config that only moved ``y``): ``C`` as it is;
  the mean ``C X^T W y`` is recomputed (``n F + F^2``);
- the same rows and ``b`` more: ``C`` updated by the rank-``b`` Woodbury identity (Rasmussen
  and Williams, *Gaussian Processes for Machine Learning*, 2006, appendix A.3)
  ``C' = C - (B C)^T (W_b^-1 + B C B^T)^-1 (B C)``, ``F^2 b`` work instead of the refit's
  ``n F^2 + F^3``;
- anything else (a row gone, another prior, many rows at once, or :data:`REFRESH` updates in a
  row): a refit, the same arithmetic as :func:`tuner.calibrate.correction.fit`.

An updated ``C`` equals the refit's up to rounding (``tests/test_normal.py``: to about 1e-9,
and the sampler's choices are the same); the refresh bounds how much rounding builds up.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter, OrderedDict

import numpy as np

from tuner.calibrate.correction import Posterior, noise_weights
from tuner.calibrate.correction import covariance as refit  # the fit's own inverse

REFRESH = 32
"""Rank updates in a row before the covariance is inverted afresh (bounding the rounding that
successive updates accumulate)."""

MAX_UPDATE_SHARE = 0.25
"""At most this share of ``F`` new rows is added by an update; more: a refit (the update's
``F^2 b`` then nears the refit's cost)."""

KEPT_PRIORS = 4
"""How many priors' fits are kept (the sampler has two: the time fit's and the memory fit's)."""


@dataclasses.dataclass(slots=True)
class _State:
    """The last fit under one prior: its rows (each row's features and weight, as bytes), the
    covariance, and how many rank updates it has had since it was inverted afresh."""

    rows: Counter[bytes]
    cov: np.ndarray
    updates: int


_states: OrderedDict[bytes, _State] = OrderedDict()
_lock = threading.Lock()


def _row_keys(x: np.ndarray, w: np.ndarray) -> list[bytes]:
    return [row.tobytes() + weight.tobytes() for row, weight in zip(x, w, strict=True)]


def add_rows(
    cov: np.ndarray, xb: np.ndarray, variance: np.ndarray, bc: np.ndarray | None = None
) -> np.ndarray:
    """``cov`` (a posterior covariance) with the rows ``xb`` of noise variances ``variance``
    added (the module docstring's Woodbury update), symmetrised; ``bc``: ``xb @ cov`` when
    the caller has it."""
    bc = xb @ cov if bc is None else bc
    m = bc @ xb.T + np.diag(variance)
    new = cov - bc.T @ np.linalg.solve(m, bc)
    return np.asarray((new + new.T) / 2.0)


def _covariance(prior_precision: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The posterior covariance of rows ``x`` (weights ``w``), from the last fit under the same
    prior where the rows allow it; that fit replaced by this one."""
    prior = prior_precision.tobytes()
    keys = _row_keys(x, w)
    rows = Counter(keys)
    with _lock:
        state = _states.get(prior)
    cov: np.ndarray | None = None
    updates = 0
    if state is not None and state.rows == rows:
        cov, updates = state.cov, state.updates
    elif state is not None and not state.rows - rows and state.updates < REFRESH:
        extra = rows - state.rows
        if sum(extra.values()) <= MAX_UPDATE_SHARE * len(prior_precision):
            picked = []
            for i, k in enumerate(keys):
                if extra[k] > 0:
                    extra[k] -= 1
                    picked.append(i)
            cov, updates = add_rows(state.cov, x[picked], 1.0 / w[picked]), state.updates + 1
    if cov is None:
        cov = refit(prior_precision, x, w)
    with _lock:
        _states[prior] = _State(rows, cov, updates)
        _states.move_to_end(prior)
        while len(_states) > KEPT_PRIORS:
            _states.popitem(last=False)
    return cov


def fit(
    prior_precision: np.ndarray, x: np.ndarray, y: np.ndarray, noise: float | np.ndarray
) -> Posterior:
    """:func:`tuner.calibrate.correction.fit`'s posterior, its covariance kept or updated from
    the last fit under the same prior (module docstring)."""
    w = noise_weights(y, noise)
    cov = _covariance(prior_precision, x, w)
    return Posterior(cov @ (x.T @ (y * w)), cov)


def forget() -> None:
    """Drop every kept fit (tests: a fresh start)."""
    with _lock:
        _states.clear()


# ----------------------------------------------------------------------------- predictions

KEPT_PREDICTIONS = 4
"""How many fits' predictions of the candidates are kept (:func:`predict_rows`)."""

MAX_KEPT_PRODUCTS = 1 << 22
"""At most this many entries (32 MiB of float64) of one fit's kept ``z C`` rows; past it (a space
of 10^5 configs) only the means and variances are kept."""


@dataclasses.dataclass(slots=True)
class _Predicted:
    """One fit's predictions of the rows of ``x`` computed so far (``done``)."""

    post: Posterior
    x: np.ndarray
    mu: np.ndarray
    var: np.ndarray
    done: np.ndarray
    zc: np.ndarray | None  # each done row's z C, when kept


_predicted: OrderedDict[tuple[int, int], _Predicted] = OrderedDict()


def _rows_of(post: Posterior, x: np.ndarray, rows: np.ndarray) -> _Predicted:
    """``post``'s kept predictions of ``x``, with ``rows`` computed (each row once per fit)."""
    key = (id(post), id(x))
    with _lock:
        kept = _predicted.get(key)
        if kept is None or kept.post is not post or kept.x is not x:
            n = len(x)
            zc = np.empty_like(x) if x.size <= MAX_KEPT_PRODUCTS else None
            kept = _Predicted(post, x, np.empty(n), np.empty(n), np.zeros(n, dtype=bool), zc)
            _predicted[key] = kept
        _predicted.move_to_end(key)
        while len(_predicted) > KEPT_PREDICTIONS:
            _predicted.popitem(last=False)
        missing = rows[~kept.done[rows]]
        if len(missing):
            missing = np.unique(missing)
            z = x[missing]
            zc = z @ post.cov
            kept.mu[missing] = z @ post.mean
            kept.var[missing] = (zc * z).sum(axis=1)
            if kept.zc is not None:
                kept.zc[missing] = zc
            kept.done[missing] = True
    return kept


def predict_rows(post: Posterior, x: np.ndarray, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``post.predict(x[rows])``, each row of ``x`` predicted once per fit: an ask predicts the
    open configs under the same fit as the last ask whenever nothing new was measured (the fits
    are kept: :func:`tuner.search.ranking.fit`), less the one it launched."""
    idx = np.asarray(rows, dtype=int)
    kept = _rows_of(post, x, idx)
    return kept.mu[idx], np.sqrt(np.maximum(kept.var[idx], 1e-12))


def believe_rows(
    post: Posterior, x: np.ndarray, believed: list[int], rows: list[int], noise: float
) -> tuple[Posterior, np.ndarray, np.ndarray]:
    """:func:`tuner.search.ranking.believe` (``post`` with the candidates ``believed`` counted
    as measured at its mean), and its prediction of the candidates ``rows``, from ``post``'s
    kept ``z C`` rows: the mean does not move, and each variance shrinks by
    ``a M^-1 a^T`` (``a = z C B^T``, ``M = W_b^-1 + B C B^T``), ``N F b`` work instead of
    ``N F^2``."""
    b, idx = np.asarray(believed, dtype=int), np.asarray(rows, dtype=int)
    kept = _rows_of(post, x, np.concatenate([b, idx]))
    xb, zc = x[b], kept.zc
    variance = np.full(len(b), float(noise) ** 2)
    new = Posterior(post.mean, add_rows(post.cov, xb, variance, None if zc is None else zc[b]))
    if zc is None:
        mu, sd = new.predict(x[idx])
        return new, mu, sd
    m = zc[b] @ xb.T + np.diag(variance)
    a = zc[idx] @ xb.T
    var = kept.var[idx] - ((a @ np.linalg.inv(m)) * a).sum(axis=1)
    return new, kept.mu[idx], np.sqrt(np.maximum(var, 1e-12))
