"""What one launch is expected to teach the choice of the config to train with, over every
config its measurement moves: the knowledge gradient of correlated beliefs.

The model sampler's belief about the configs is correlated (:mod:`tuner.search.ranking`): they
share knob values and pairs of them, so one measurement moves the believed step time of every
config that shares its values. A launch is worth what it is expected to improve the config the
training run would use once it is measured, whichever config that turns out to be: the
measured one, the incumbent, or a third config the measurement moved past both. Frazier,
Powell and Dayanik (INFORMS J. Computing 21(4), 2009) give that value exactly for Gaussian
beliefs: measuring config ``x`` moves every config ``j``'s mean by ``b_j Z`` for one standard
draw ``Z``, ``b_j = cov(j, x) / sqrt(var(x) + noise^2)``, and the value is
``E max_j (a_j + b_j Z) - max_j a_j`` (``a_j``, the believed value today): the mean of the upper
envelope of lines in ``Z``, a sum over its segments (their algorithm 1).

With the belief's width learned from few misses (Student's t, :class:`~tuner.search.value.
Belief`) the draw is Student's t with the belief's degrees of freedom, and each segment's
partial expectation is that of the t (``int t f(t) dt = -(dof + t^2) / (dof - 1) f(t)``, the
same kernel :func:`~tuner.search.value.improvement` reads). With two lines (a config and the
incumbent) the value is :func:`~tuner.search.value.improvement` of their gap, which stop rule 2
reads (:func:`~tuner.search.value.lookahead_spread`): the value here is never below it when
the incumbent is the best believed, and it adds what the launch teaches about the configs it
is correlated with.

Expected improvement of the launched config's own figure (what the sampler ranked by before)
counts neither: it values a config whose doubt is its own (a knob value nobody measured) the
same as one whose measurement would also settle a dozen others, and counts the run-to-run
noise of the figure as gain.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from tuner.search.ranking import Post, covariance, cross_covariance
from tuner.search.value import (
    JOINT_CONTENDERS,
    NEGLIGIBLE_CHANCE,
    Belief,
    chance,
    improvement,
    student_cdf,
    student_pdf,
)

NEGLIGIBLE_GAIN = 1e-7
"""The most the lines :func:`knowledge_gradient` leaves out may add to a launch's value, in log
step time (a ten-millionth of the step; stop rule 2 asks for 0.5 % by default): a line whose
gap to the leading line's is not expected to close by more than its share of this is never
on top often enough to matter, and skipping it keeps an ask cheap with hundreds of
contenders."""


def partial_kernel(z: np.ndarray, dof: int | None) -> np.ndarray:
    """``g(z)`` with ``int_lo^hi t f(t) dt = g(lo) - g(hi)`` for the standard normal (``phi``)
    or Student's t with ``dof`` degrees of freedom (``(dof + z^2) / (dof - 1) f(z)``)."""
    f = student_pdf(z, dof)
    if dof is None:
        return f
    return np.asarray((dof + np.square(z)) / (dof - 1) * f)


def envelope_mean(a: np.ndarray, b: np.ndarray, dof: int | None) -> float:
    """``E max_j (a_j + b_j T)`` for ``T`` standard normal (``dof`` None) or Student's t with
    ``dof`` degrees of freedom: the lines sorted by slope, those never on top dropped, and the
    envelope's segments between its breakpoints summed (Frazier, Powell and Dayanik 2009,
    algorithm 1)."""
    order = np.lexsort((a, b))  # by slope, then by intercept: of equal slopes the last wins
    keep, cuts = _upper_envelope(order.tolist(), a.tolist(), b.tolist())
    lo = np.array(cuts)
    hi = np.append(lo[1:], math.inf)
    inner_lo, inner_hi = np.isfinite(lo), np.isfinite(hi)
    lo0, hi0 = np.where(inner_lo, lo, 0.0), np.where(inner_hi, hi, 0.0)
    mass = (np.where(inner_hi, student_cdf(hi0, dof), 1.0)
            - np.where(inner_lo, student_cdf(lo0, dof), 0.0))  # fmt: skip
    slope = (np.where(inner_lo, partial_kernel(lo0, dof), 0.0)
             - np.where(inner_hi, partial_kernel(hi0, dof), 0.0))  # fmt: skip
    return float(np.sum(a[keep] * mass + b[keep] * slope))


def knowledge_gradient(
    value: np.ndarray, cov: np.ndarray, launches: np.ndarray, noise: float, scale: float,
    dof: int | None,
) -> np.ndarray:  # fmt: skip
    """For each alternative ``launches[k]``: how much measuring it is expected to raise the
    best believed ``value`` (higher is better) of all the alternatives, ``cov`` their posterior
    covariance (the correction's, no run-to-run noise), ``noise`` the sd of one measured
    figure and ``scale`` the factor the study's leave-one-out misses put on the belief
    (:attr:`~tuner.search.value.Belief.scale`, on the correction and the noise alike, as
    :func:`~tuner.search.value.lookahead_spread`).

    Every launch at once, the same arithmetic as :func:`envelope_mean` on each launch's kept
    lines: the slopes and the bounds as one matrix, one sort by slope, the envelopes' walks on
    Python floats (numpy's scalars cost ten times as much a step), and every segment's mass
    and partial expectation in one array."""
    launches = np.asarray(launches, dtype=int)
    if not len(launches):
        return np.zeros(0)
    lead = int(np.argmax(value))
    top = float(value[lead])
    # column k: each line's slope when launches[k] is measured
    b = scale * cov[:, launches] / np.sqrt(cov[launches, launches] + noise**2)
    # A line can add to the envelope's mean at most what it adds over the leading line
    # alone, E (a_j + b_j T - a_lead - b_lead T)^+: the expected improvement of their gap.
    # Lines that could add less than NEGLIGIBLE_GAIN in all are left out. The bound is worked
    # out only where a moment's cruder bound leaves it open (Student's t's distribution
    # function is a sum of dof / 2 terms: with hundreds of degrees of freedom, most of an
    # ask's time), first per line at its widest spread over every launch (the bound grows
    # with the spread): most lines are out of all launches at the cost of one value each.
    spread = np.maximum(np.abs(b - b[lead]), 1e-12)
    need = NEGLIGIBLE_GAIN / len(value)
    lines = np.flatnonzero(_may_exceed(top - value, spread.max(axis=1), dof, need))
    gap = np.broadcast_to((top - value)[lines, None], (len(lines), len(launches)))
    spread = spread[lines]
    open_ = _may_exceed(gap, spread, dof, need)
    sub = np.zeros(gap.shape, dtype=bool)
    sub[open_] = improvement(gap[open_], spread[open_], 0.0, dof) > need
    kept = np.zeros(b.shape, dtype=bool)
    kept[lines] = sub
    kept[lead] = True
    # by slope, then by intercept (of equal slopes the last wins): lexsort is stable, so each
    # launch's kept lines come in the order a sort of them alone gives
    cols, rows = np.nonzero(kept.T)
    slopes = b[rows, cols]
    order = np.lexsort((value[rows], slopes, cols))
    cols, rows, slopes = cols[order], rows[order], slopes[order]
    bounds = np.searchsorted(cols, np.arange(len(launches) + 1)).tolist()
    a_list, row_list, slope_list = value.tolist(), rows.tolist(), slopes.tolist()
    keeps: list[list[int]] = []
    cuts: list[float] = []
    for k in range(len(launches)):
        span = slice(bounds[k], bounds[k + 1])
        b_k = dict(zip(row_list[span], slope_list[span], strict=True))
        keep, cut_k = _upper_envelope(row_list[span], a_list, b_k)
        keeps.append(keep)
        cuts.extend(cut_k)
    lo = np.array(cuts)
    ends = np.cumsum([len(keep) for keep in keeps])
    hi = np.append(lo[1:], math.inf)
    hi[ends - 1] = math.inf
    inner_lo, inner_hi = np.isfinite(lo), np.isfinite(hi)
    lo0 = np.where(inner_lo, lo, 0.0)
    # a finite end of a segment is where the next one takes over: each figure worked out once
    cdf, kernel = student_cdf(lo0, dof), partial_kernel(lo0, dof)
    mass = np.where(inner_hi, np.append(cdf[1:], 1.0), 1.0) - np.where(inner_lo, cdf, 0.0)
    slope = np.where(inner_lo, kernel, 0.0) - np.where(inner_hi, np.append(kernel[1:], 0.0), 0.0)
    rows = np.concatenate([np.asarray(keep, dtype=int) for keep in keeps])
    cols = np.repeat(np.arange(len(launches)), [len(keep) for keep in keeps])
    terms = value[rows] * mass + b[rows, cols] * slope
    out = np.zeros(len(launches))
    start = 0
    for k, end in enumerate(ends.tolist()):
        out[k] = max(float(np.add.reduce(terms[start:end])) - top, 0.0)  # np.sum's, alone
        start = end
    return out


SCREEN_MOMENTS = (2, 4, 8, 16, 32)
"""The absolute moments of the draw :func:`_may_exceed` bounds the expected improvement by."""


def _may_exceed(gap: np.ndarray, spread: np.ndarray, dof: int | None, need: float) -> np.ndarray:
    """Where ``improvement(gap, spread, 0, dof)`` (``E (spread T - gap)^+``, ``gap >= 0``) may
    exceed ``need``: everywhere but where a moment bound says it cannot. For ``t > u > 0``,
    ``t - u <= t^m / u^(m - 1)``, so ``E (T - u)^+ <= E|T|^m / (2 u^(m - 1))`` (half the mass
    above 0, by symmetry), for every even ``m`` below ``dof``; with ``u = gap / spread`` the
    improvement is at most ``E|T|^m spread^m / (2 gap^(m - 1))``. Ruled out only a millionth
    below ``need``, so that rounding never rules out a line the exact bound keeps."""
    moments = [m for m in SCREEN_MOMENTS if dof is None or m < dof]
    if not moments or need <= 0:
        return np.ones(gap.shape, dtype=bool)
    with np.errstate(divide="ignore"):
        log_gap, log_spread = np.log(gap), np.log(spread)
    least = np.full(gap.shape, math.inf)
    for m in moments:  # log E|T|^m: the normal's 2^(m/2) G((m+1)/2) / sqrt(pi), the t's
        log_moment = math.lgamma((m + 1) / 2) - 0.5 * math.log(math.pi)
        if dof is None:
            log_moment += m / 2 * math.log(2)
        else:  # dof^(m/2) G((m+1)/2) G((dof-m)/2) / (sqrt(pi) G(dof/2))
            log_moment += m / 2 * math.log(dof) + math.lgamma((dof - m) / 2) - math.lgamma(dof / 2)
        least = np.minimum(least, log_moment - math.log(2) + m * log_spread - (m - 1) * log_gap)
    return np.asarray(~(least <= math.log(need) + math.log1p(-1e-6)))


def _upper_envelope(order: list[int], a: Sequence[float], b: Mapping[int, float] | Sequence[float]
                    ) -> tuple[list[int], list[float]]:  # fmt: skip
    """The lines ``order`` (sorted by slope, then intercept) on the upper envelope of
    ``a_j + b_j z`` and where each takes over (the first: -inf): :func:`envelope_mean`'s walk."""
    keep: list[int] = []
    cuts: list[float] = []
    for i in order:
        if keep and b[i] == b[keep[-1]]:
            keep.pop()
            cuts.pop()
        cut = -math.inf
        while keep:
            cut = (a[keep[-1]] - a[i]) / (b[i] - b[keep[-1]])
            if cut > cuts[-1]:
                break
            keep.pop()
            cuts.pop()
            cut = -math.inf
        cuts.append(cut)
        keep.append(i)
    return keep, cuts


def launch_values(b: Belief, x: np.ndarray, spread: np.ndarray, noise: float) -> np.ndarray:
    """The knowledge gradient (in log step time: about the fraction of the step the run
    saves) of launching each of ``b``'s open configs, ``x`` every candidate's features and
    ``spread`` the open configs' :meth:`~tuner.search.value.Belief.spread`. The alternatives
    are the :data:`~tuner.search.value.JOINT_CONTENDERS` open configs likeliest to beat the
    best by 1 % and the incumbent at its measured figure; of them, only those with at least
    :data:`~tuner.search.value.NEGLIGIBLE_CHANCE` of it are valued (the others are never
    launched while one of those is left, :func:`~tuner.search.value.pick`), all of them when
    none is; the rest are valued at 0. Before anything was fitted: zeros."""
    if b.fitted is None or b.best is None:
        return np.zeros(len(b.open_))
    p = chance(b.mu, spread, b.best, dof=b.dof)
    top = np.argsort(-p, kind="stable")[:JOINT_CONTENDERS]
    value, cov = _alternatives(b.fitted, x, np.asarray(b.open_)[top], -b.mu[top], b)
    scale = 1.0 if b.scale is None else b.scale
    launches = np.flatnonzero(p[top] >= NEGLIGIBLE_CHANCE)  # the only ones pick may launch
    launches = launches if len(launches) else np.arange(len(top))
    out = np.zeros(len(b.open_))
    out[top[launches]] = knowledge_gradient(value, cov, launches, noise, scale, b.dof)
    return out


def _alternatives(post: Post, x: np.ndarray, rows: np.ndarray, value: np.ndarray, b: Belief
                  ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The believed ``value`` (minus the log step time) of candidates ``rows`` (of features
    ``x``) and the incumbent's at its measured figure, with their posterior covariance."""
    assert b.best is not None
    cov = covariance(post, x[rows])
    if b.incumbent is None:
        return value, cov
    z0 = x[b.incumbent]
    across = cross_covariance(post, x[rows], z0)
    own = float(covariance(post, z0[None, :])[0, 0])
    cov = np.block([[cov, across[:, None]], [across[None, :], np.array([[own]])]])
    return np.append(value, -b.best), cov
