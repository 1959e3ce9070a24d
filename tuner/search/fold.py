"""The cluster's saved calibration folded into the model sampler's prior, once per sampler.

The saved observations of earlier studies on the cluster (:mod:`tuner.search.saved`) enter the
sampler's corrections as extra rows of each fit. With a calibration of another study of the same
setup (nothing of it is this study's own trials) that is every observation, ~10^4 rows, gathered,
hashed and multiplied on every ask although they never change: about 200 ms an ask.

Conditioning a Gaussian on data in two batches is conditioning on both at once (Bayes' rule
applied twice; Rasmussen and Williams, *Gaussian Processes for Machine Learning*, 2006, eq. 2.8
read with the first batch's posterior as the prior). So the saved rows ``X_s`` (noise precisions
``W_s``, values ``y_s``) are folded once into a Gaussian prior on the weights,

    P0 = S^-1 + X_s^T W_s X_s          m0 = P0^-1 X_s^T W_s y_s

and the study's own rows are fitted against it. The sampler's fits take a diagonal prior
centred on zero (the rows' space of :mod:`tuner.search.ranking`, the kept Gram products of
:mod:`tuner.search.gram`, the weights' form of :mod:`tuner.search.normal`), so the folded prior
is written in coordinates where it is one: with ``P0 = R R^T`` (Cholesky) and ``L = R^-T``
(``L L^T = P0^-1``), the weights are ``w = m0 + L u`` with ``u ~ N(0, I)``, and a row ``z``
predicts ``z w = z m0 + (z L) u``. A :class:`Basis` holds the candidates' rows ``X L``, each
one's prior mean ``X m0`` (its offset) and the identity prior: a fit subtracts the offsets from
its values and adds them back to its predictions; every variance and covariance is the one of
the fit with every row (the same posterior, up to rounding: ``tests/test_fold.py``).

Saved out-of-memory rows are not folded: they only bound their ratio from below, and the memory
fit lifts them above its current fit in passes (:func:`tuner.calibrate.correction.lift_ooms`),
which depends on the study's own rows. They stay rows of each fit, written in the same
coordinates (:meth:`Basis.rows`); they are few.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from tuner.calibrate.correction import (
    TIME_CHOICES,
    Features,
    Posterior,
    Prior,
    choose_time,
    lift_ooms,
)
from tuner.calibrate.store import Observation
from tuner.search.gram import Gram, GramPosterior
from tuner.search.normal import predict_rows
from tuner.search.ranking import RowPosterior, fit_memory
from tuner.search.saved import Saved


@dataclasses.dataclass(frozen=True, eq=False)
class Basis:
    """The candidates' feature rows ``x`` in the coordinates their fits take (a diagonal
    ``precision``, zero mean), each candidate's prior mean ``offset``, the kept products
    ``gram``; ``factor`` and ``mean`` (``L`` and ``m0``) when saved rows were folded in."""

    x: np.ndarray
    precision: np.ndarray
    offset: np.ndarray
    gram: Gram
    factor: np.ndarray | None = None
    mean: np.ndarray | None = None

    @property
    def folded(self) -> bool:
        """Whether saved rows were folded into the prior (a fit of no row predicts then)."""
        return self.factor is not None

    def rows(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``raw`` of the plain features (not candidates) in these coordinates, and their
        prior means (subtracted from their values)."""
        if self.factor is None or self.mean is None:
            return raw, np.zeros(len(raw))
        return raw @ self.factor, raw @ self.mean


def plain(x: np.ndarray, precision: np.ndarray) -> Basis:
    """The candidates ``x`` under the diagonal prior ``precision``: nothing folded."""
    return Basis(x, precision, np.zeros(len(x)), Gram(x, precision))


def folded(x: np.ndarray, precision: np.ndarray, saved: np.ndarray, y: np.ndarray,
           noise: np.ndarray, unfolded: Basis) -> Basis:  # fmt: skip
    """The candidates ``x`` under the prior ``precision`` conditioned on the rows ``saved``
    measured at ``y`` with sds ``noise`` (module docstring); ``unfolded`` when there are none."""
    if not len(saved):
        return unfolded
    w = 1.0 / np.square(noise)
    p0 = np.diag(precision) + saved.T @ (saved * w[:, None])
    r_inv = np.linalg.inv(np.linalg.cholesky(p0))  # P0^-1 = R^-T R^-1
    factor = r_inv.T
    mean = factor @ (r_inv @ (saved.T @ (y * w)))
    xt = x @ factor
    identity = np.ones(len(precision))
    return Basis(xt, identity, x @ mean, Gram(xt, identity), factor, mean)


def predict(post: Posterior | RowPosterior, x: np.ndarray,
            rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``post``'s prediction for candidates ``rows`` (of features ``x``), from the kept
    products when ``post`` was fitted on them."""
    if isinstance(post, GramPosterior):
        return post.predict_rows(rows)
    if isinstance(post, Posterior):
        return predict_rows(post, x, list(rows))
    return post.predict(x[list(rows)])


@dataclasses.dataclass(frozen=True, eq=False)
class Past:
    """What the sampler reads from one list of saved observations, made once for the list:
    the (time, memory) bases with them folded in, the saved OOMs (rows of the memory fit, not
    folded: plain features, ratios, sds), the keys of the configs that ran under the same
    memory setup (they fit) and the same setup's measured start-ups.

    Saved OOMs of one config (same features, ratio and sd: a long study ran out of memory on
    it again and again) are one row at ``sd / sqrt(count)``: ``k`` equal rows of variance
    ``s^2`` and one of variance ``s^2 / k`` have the same likelihood up to a constant, so the
    same posterior, and the memory fit lifts equal rows alike."""

    bases: tuple[Basis, Basis]
    oom_rows: np.ndarray
    oom_y: np.ndarray
    oom_noise: np.ndarray
    ran: frozenset[str] = frozenset()
    startups: tuple[float, ...] = ()


class Folds:
    """A sampler's :class:`Past` per list of saved observations (:meth:`Saved.past
    <tuner.search.saved.Saved.past>` answers the same list while the study's own trials among
    them do not change: usually once a run)."""

    def __init__(self, time: Basis, memory: Basis) -> None:
        none = np.zeros(0)
        self.plain = Past((time, memory), np.zeros((0, time.x.shape[1])), none, none)
        self._of: tuple[list[Observation], Past] | None = None
        self._median: tuple[tuple[object, object, int], float | None] | None = None

    def of(self, past: list[Observation], saved: Saved, features: Features, prior: Prior,
           setup: tuple[str, str]) -> Past:  # fmt: skip
        """What the saved observations ``past`` say to a sampler of ``setup`` (its setup and
        memory fingerprints): each observation with a measured step time a row of the time
        fit, each with a measured peak but an OOM one of the memory fit, at the sampler's
        noise widened by its transfer sd (a study of another setup: :meth:`Observation.
        transfer_sd`). The time rows enter as the correction their own leave-one-out picks
        (:func:`~tuner.calibrate.calibrated.choose_time`, as ``tune calibrate`` says): not at all
        when the model alone predicts them best, through the shared factor alone when that
        does."""
        if not past:
            return self.plain
        if self._of is not None and self._of[0] is past:
            return self._of[1]
        fingerprint, memory_setup = setup
        time, memory = self.plain.bases
        width = time.x.shape[1]
        t = [o for o in past if o.time_ratio]
        m = [o for o in past if o.memory_ratio and o.outcome != "oom"]
        xs = np.array([saved.row(o, features) for o in t]).reshape(len(t), width)
        xm = np.array([saved.memory_row(o, features) for o in m]).reshape(len(m), width)
        st, sm = (np.array([math.hypot(n, o.transfer_sd(fingerprint)) for o in obs])
                  for n, obs in ((prior.noise, t), (prior.memory_noise, m)))  # fmt: skip
        yt = np.array([o.time_ratio or 0.0 for o in t])
        if len(t):  # the correction their own leave-one-out picks (Corrector's rule)
            applied = choose_time(time.precision, xs, yt, st)[0].applied
            if applied == TIME_CHOICES[0]:
                xs, yt, st = xs[:0], yt[:0], st[:0]
            elif applied == TIME_CHOICES[1]:
                xs = np.hstack([xs[:, :1], np.zeros_like(xs[:, 1:])])
        ym = np.array([o.memory_ratio or 0.0 for o in m])
        ooms: dict[tuple[Any, ...], tuple[Observation, int]] = {}
        for o in past:
            if o.memory_ratio and o.outcome == "oom":
                same = (
                    saved.key(o),
                    o.activation_share,
                    o.memory_ratio,
                    o.transfer_sd(fingerprint),
                )
                ooms[same] = (o, ooms[same][1] + 1 if same in ooms else 1)
        rows = [saved.memory_row(o, features) for o, _ in ooms.values()]
        made = Past(
            (folded(time.x, time.precision, xs, yt, st, time),
             folded(memory.x, memory.precision, xm, ym, sm, memory)),
            np.array(rows).reshape(len(rows), width),
            np.array([o.memory_ratio or 0.0 for o, _ in ooms.values()]),
            np.array([math.hypot(prior.memory_noise, o.transfer_sd(fingerprint)) / math.sqrt(n)
                      for o, n in ooms.values()]),
            frozenset(saved.key(o) for o in past
                      if o.outcome == "ok" and o.memory_setup == memory_setup),
            tuple(o.startup_s for o in past if o.fingerprint == fingerprint and o.startup_s),
        )  # fmt: skip
        self._of = (past, made)
        return made

    def startup_s(self, past: Past, own: list[float]) -> float | None:
        """:func:`~tuner.calibrate.store.measured_startup_s` of ``past``'s start-ups and the
        study's ``own`` (a list that only grows, :meth:`Observed.startups <tuner.search.
        observed.Observed.startups>`): the median, taken again only when either changed."""
        key = (past, own, len(own))
        if self._median is None or self._median[0][0] is not past or (
                self._median[0][1] is not own or self._median[0][2] != len(own)):  # fmt: skip
            found = [*past.startups, *(s for s in own if s)]
            self._median = (key, float(statistics.median(found)) if found else None)
        return self._median[1]


def memory_fit(
    basis: Basis, seen: list[tuple[int, float]], oom: list[bool], extra: np.ndarray,
    extra_y: np.ndarray, noise: np.ndarray, open_: list[int],
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The memory correction's mean and sd for candidates ``open_``: fitted in ``basis`` on
    the candidates ``seen`` (index, measured log ratio; ``oom``: which only bound theirs) and
    the saved OOM rows ``extra`` (plain features, ratios ``extra_y``: bounds, not folded),
    sds ``noise`` (the seen ones', then the extra ones')."""
    xr, shift = basis.rows(extra)
    ids = [i for i, _ in seen]
    x = np.vstack([basis.x[ids], xr])
    y = np.concatenate([np.array([v for _, v in seen]) - basis.offset[ids], extra_y - shift])
    bound = np.array(oom + [True] * len(extra), dtype=bool)
    gram = basis.gram
    if not len(extra) and gram.fits(ids):  # every row a candidate: the kept products
        kept = lift_ooms(lambda _p, _x, y_, n_: gram.fit(ids, y_, n_),
                         basis.precision, x, y, bound, noise)  # fmt: skip
        mu, sd = kept.predict_rows(open_)
    else:
        mu, sd = predict(fit_memory(basis.precision, x, y, bound, noise), basis.x, open_)
    return mu + basis.offset[open_], sd
