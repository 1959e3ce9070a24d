"""The rows' posterior over the model sampler's own candidates, from their kept products.

A fit in the rows' space (:class:`tuner.search.ranking.RowPosterior`) and its predictions for
the ``N`` open candidates cost ``z S X^T``: ``N x F x n`` multiply-adds per prediction (``F``,
the features: 400 for gpt-70b; ``n``, the measured and running configs), three predictions an
ask. When every row of the fit is itself a candidate (no saved observation of another study
among them: the usual case), ``z S X^T`` is a block of the candidates' Gram matrix
``G = X S X^T``, and so is ``X S X^T`` of the fit. :class:`Gram` keeps ``G``'s columns, each
computed the first time a candidate is a row of a fit (a measured or running config: at most
one new column a decision), so a fit gathers its ``n x n`` block and a prediction its
``N x n`` block; what is left is ``K^-1`` (``n^3``) and the predictive variance (``N n^2``).

The same posterior: the same formulas (Rasmussen and Williams 2006, eqs. 2.25-2.26), with each
entry of ``X S X^T`` summed once for every fit instead of again in each; the figures agree with
:class:`~tuner.search.ranking.RowPosterior`'s to rounding (``tests/test_gram.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tuner.search.ranking import RowPosterior

MAX_KEPT = 1 << 24
"""At most this many kept Gram entries (128 MiB of float64): past it (a space of 10^5 configs
with hundreds measured) a fit is the plain rows' one."""


class Gram:
    """The candidates' ``X S X^T`` (rows ``x``, prior precisions ``prior_precision``), kept
    column by column."""

    def __init__(self, x: np.ndarray, prior_precision: np.ndarray) -> None:
        self.x = x
        self.prior_precision = prior_precision
        self._prior_var = 1.0 / prior_precision
        self._xs = x * self._prior_var
        self._diag = np.square(x) @ self._prior_var  # z S z^T of each candidate
        self._columns: dict[int, np.ndarray] = {}

    def fits(self, rows: Sequence[int]) -> bool:
        """Whether a fit on candidates ``rows`` is kept here: fewer rows than features (else
        the weights' form is cheaper) and room for their columns."""
        new = len(set(rows) - self._columns.keys())
        return len(rows) < len(self.prior_precision) and (
            (len(self._columns) + new) * len(self.x) <= MAX_KEPT
        )  # fmt: skip

    def block(self, rows: Sequence[int]) -> np.ndarray:
        """``X S X_rows^T``: the columns of ``rows`` (``N x len(rows)``)."""
        missing = [j for j in dict.fromkeys(rows) if j not in self._columns]
        if missing:
            new = self.x @ self._xs[missing].T
            for k, j in enumerate(missing):
                self._columns[j] = new[:, k].copy()
        if not rows:
            return np.zeros((len(self.x), 0))
        return np.column_stack([self._columns[j] for j in rows])

    def fit(self, rows: Sequence[int], y: np.ndarray, noise: float | np.ndarray) -> GramPosterior:
        """The rows' posterior of candidates ``rows`` measured at ``y`` (:meth:`fits` first)."""
        return GramPosterior(self, list(rows), y, noise)


class GramPosterior(RowPosterior):
    """A :class:`~tuner.search.ranking.RowPosterior` whose rows are candidates of ``gram``;
    :meth:`predict_rows` predicts candidates from the kept products."""

    def __init__(self, gram: Gram, rows: list[int], y: np.ndarray,
                 noise: float | np.ndarray) -> None:  # fmt: skip
        self._gram = gram
        self.rows = rows
        self._block = gram.block(rows)
        self._prior_var = gram._prior_var
        self._xs = gram._xs[rows]
        self._solve(self._block[rows], y, noise)

    def predict_rows(self, z: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`predict` of candidates ``z`` (their indices)."""
        a = self._block[z]  # z S X^T
        mu = a @ self.alpha
        var = self._gram._diag[z] - ((a @ self._k_inv) * a).sum(axis=1)
        return mu, np.sqrt(np.maximum(var, 1e-12))
