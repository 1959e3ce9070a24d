"""Leave-one-source-out figures shared by memory_accuracy.py and time_accuracy.py.

A *term* of a model was developed on some sources (the data in ``benchmarks/data/*_terms.csv``
says which, with the commit that introduced it); a source's *held-out* prediction leaves out the
terms developed on it (subtracts their part of the predicted figure). Per source the tables print
n, the median and largest |error| in sample and held out, and the share of held-out rows inside
the stated 90% band, whose group sds are fitted (maximum likelihood, widened by a split-conformal
factor where the fit's own rows fall short of 90%) on the *other* sources' held-out residuals:
the band a new stack would have been given. With ``between`` (the step time) the rows of one
source are not taken as independent: a stack's own bias (its kernels' and libraries' versions,
clocks, a cluster-wide effect) is shared by all its rows, so the group sds are fitted on the
rows' deviations from their source's mean and a between-source sd (:func:`between_source_sd`)
is added in quadrature. Per term they print its effect
on the sources it was not developed on (median |error| with and without it): a term that makes
them worse is reported, never silently dropped.
"""

from __future__ import annotations

import csv
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import minimize
from scipy.stats import norm
from scipy.stats import t as student_t

from tuner.models.uncertainty import BAND_LEVEL, Z_BAND


@dataclass(frozen=True)
class Term:
    """One model term and where it was developed (a row of ``*_terms.csv``)."""

    name: str
    developed_on: tuple[str, ...]
    evidence: str


def load_terms(path: Path) -> list[Term]:
    """The terms table: ``term``, ``developed_on`` (sources, ``;``-separated, empty: none of the
    measured sources), ``evidence``."""
    with path.open(newline="") as f:
        return [
            Term(r["term"], tuple(s for s in r["developed_on"].split(";") if s), r["evidence"])
            for r in csv.DictReader(f)
        ]


@dataclass
class Residual:
    """One measured row against the model: log(measured / predicted), the predicted figure's
    share per uncertainty group, and each ablatable term's part of the prediction (a share)."""

    source: str
    log_error: float
    shares: dict[str, float]
    terms: dict[str, float] = field(default_factory=dict)
    censored: bool = False
    """A known OOM: ``log_error`` is a lower bound (the GPU's memory over the prediction)."""

    def without(self, names: Sequence[str]) -> float:
        """log(measured / predicted) with the named terms' parts taken out of the prediction."""
        left = 1.0 - sum(self.terms.get(n, 0.0) for n in names)
        return self.log_error - math.log(max(left, 1e-9))


def held_out(res: Residual, terms: Sequence[Term]) -> float:
    """``res``'s log error with the terms developed on its own source left out."""
    return res.without([t.name for t in terms if res.source in t.developed_on])


def row_sigma(shares: Mapping[str, float], sigmas: Mapping[str, float]) -> float:
    """Relative sd of a prediction whose groups have ``shares`` of it (independent groups)."""
    return math.sqrt(sum((w * sigmas[g]) ** 2 for g, w in shares.items()))


STACK = "stack"
"""The key of the between-source sd in what :func:`fit_sigmas` returns with ``between``."""


def band_sigma(shares: Mapping[str, float], sigmas: Mapping[str, float]) -> float:
    """The band's sd of a row: its groups' (:func:`row_sigma`) and, where fitted, the
    between-source sd (``sigmas[STACK]``) in quadrature: every term of a held-out row is the
    catalog's, so a new stack's bias moves the whole figure."""
    return math.hypot(row_sigma(shares, sigmas), sigmas.get(STACK, 0.0))


def fit_sigmas(
    rows: Sequence[Residual], terms: Sequence[Term], floors: Mapping[str, float],
    between: bool = False,
) -> dict[str, float]:  # fmt: skip
    """Maximum-likelihood group sds of ``rows``' held-out residuals (each normal with sd
    ``row_sigma(shares)``; a censored row contributes its chance of lying above its bound),
    each at least its floor (the physical spread the group is known to have). With
    ``between``: the group sds of the rows' deviations from their source's mean (within a
    source) and, under :data:`STACK`, the between-source sd (:func:`between_source_sd`)."""
    if between:
        within = fit_sigmas(centred(rows, terms), [], floors)
        return within | {STACK: between_source_sd(rows, terms, within)}
    groups = list(floors)
    w = np.array([[r.shares.get(g, 0.0) for g in groups] for r in rows])
    e = np.array([held_out(r, terms) for r in rows])
    cut = np.array([r.censored for r in rows])
    lo = np.log([floors[g] for g in groups])

    def nll(x: np.ndarray) -> float:
        sd = np.sqrt((w**2) @ np.exp(2 * x) + 1e-12)
        exact = np.sum(2 * np.log(sd[~cut]) + (e[~cut] / sd[~cut]) ** 2)
        tail = -2 * np.sum(norm.logsf(e[cut] / sd[cut])) if cut.any() else 0.0
        return float(exact + tail)

    # the likelihood has several local optima (slack and fixed memory trade off on device
    # rows): start from every corner of a coarse grid and keep the best
    bounds = [(b, math.log(100.0)) for b in lo]
    starts = itertools.product(*[(b, b + 2.5) for b in lo])
    fits = [minimize(nll, np.array(x0), method="L-BFGS-B", bounds=bounds) for x0 in starts]
    best = min(fits, key=lambda f: float(f.fun))
    sds = {g: float(math.exp(v)) for g, v in zip(groups, best.x, strict=True)}
    # Normal residuals are the likelihood's assumption, not a fact: where the fitted band holds
    # fewer than 90% of these rows, widen every sd by the split-conformal factor (the
    # ceil((n + 1) 0.9)-th smallest of |error| / band half-width), never narrow it.
    width = np.sqrt((w**2) @ np.array([sds[g] ** 2 for g in groups])) * Z_BAND
    ratio = np.sort(np.abs(e[~cut]) / np.maximum(width[~cut], 1e-12))
    if len(ratio):
        k = min(math.ceil((len(ratio) + 1) * 0.9), len(ratio)) - 1
        sds = {g: v * max(1.0, float(ratio[k])) for g, v in sds.items()}
    return sds


def _by_source(rows: Sequence[Residual]) -> dict[str, list[Residual]]:
    by: dict[str, list[Residual]] = {}
    for r in rows:
        if not r.censored:  # a bound, not a figure: no part of a source's mean
            by.setdefault(r.source, []).append(r)
    return by


def centred(rows: Sequence[Residual], terms: Sequence[Term]) -> list[Residual]:
    """Each row's held-out residual less its source's mean, times sqrt(n / (n - 1)) (the
    deviation from a mean of n rows has (n - 1) / n of a row's variance): what is left of a row
    once its stack's shared bias is taken out. A source of one row has no such deviation and
    gives none."""
    out = []
    for group in _by_source(rows).values():
        n = len(group)
        if n < 2:
            continue
        errors = [held_out(r, terms) for r in group]
        mean, k = statistics.fmean(errors), math.sqrt(n / (n - 1))
        out += [
            Residual(r.source, (e - mean) * k, r.shares)
            for r, e in zip(group, errors, strict=True)
        ]
    return out


def between_source_sd(
    rows: Sequence[Residual], terms: Sequence[Term], within: Mapping[str, float]
) -> float:
    """The sd of a stack's own bias, shared by all its rows, for a stack not among ``rows``.

    Each source's rows are the model's error on one stack: a bias ``b`` the stack's rows share
    (its kernels' and libraries' versions, its clocks, its cluster) plus each row's own error
    (the ``within`` sds). Source i's precision-weighted mean ``y_i`` has variance
    ``v_i + tau^2`` (``v_i`` = 1 / sum of its rows' 1 / within variance); with the model meant
    unbiased (mean 0), ``Q = sum y_i^2 / v_i`` has expectation ``k + tau^2 sum 1 / v_i`` over
    k sources, the method-of-moments estimate of DerSimonian & Laird (Controlled Clinical
    Trials 7:177, 1986) with the mean known: ``tau^2 = max(0, (Q - k) / sum 1 / v_i)``.

    ``tau`` is estimated from k sources, a handful: the bias of a new stack over its estimate
    follows Student's t with k degrees of freedom (k draws of a zero-mean normal, mean
    known), not the normal, so the band's z would under-cover. As in Higgins, Thompson &
    Spiegelhalter's prediction interval for a new study (J. R. Stat. Soc. A 172:137, 2009) the
    t quantile is used: ``tau`` is returned times t(0.95, k) / z(0.95), so that the band's
    z-based half-width is the t one."""
    means, weights = [], []
    for group in _by_source(rows).values():
        w = [1.0 / max(row_sigma(r.shares, within), 1e-9) ** 2 for r in group]
        e = [held_out(r, terms) for r in group]
        means.append(sum(a * b for a, b in zip(w, e, strict=True)) / sum(w))
        weights.append(sum(w))
    k = len(means)
    if k < 2:
        return 0.0
    q = sum(w * y * y for w, y in zip(weights, means, strict=True))
    tau = math.sqrt(max(0.0, (q - k) / sum(weights)))
    return tau * float(student_t.ppf(0.5 + BAND_LEVEL / 2, k)) / Z_BAND


def _pct(values: Sequence[float]) -> tuple[str, str]:
    if not values:
        return "     -", "     -"
    mags = [abs(math.expm1(-v)) for v in values]  # |predicted - measured| / measured
    return f"{statistics.median(mags):6.1%}", f"{max(mags):6.1%}"


@dataclass(frozen=True)
class SourceFigures:
    """One source's leave-one-source-out line."""

    source: str
    n: int
    in_sample: tuple[str, str]
    held: tuple[str, str]
    inside: int
    sigmas: dict[str, float]
    inside_fits_only: int
    """Rows inside the band fitted on the other sources' rows that fit (no known OOM)."""

    @property
    def coverage(self) -> float:
        return self.inside / self.n if self.n else 1.0


def loso(
    rows: Sequence[Residual], terms: Sequence[Term], floors: Mapping[str, float],
    between: bool = False,
) -> list[SourceFigures]:  # fmt: skip
    """Per source: its held-out errors and how many fall in the band fitted on the others
    (rows that fit; a source's known OOMs count in :func:`flagged`); ``between``: the band
    has a between-source sd (:func:`fit_sigmas`)."""
    out = []
    for source in sorted({r.source for r in rows if not r.censored}):
        mine = [r for r in rows if r.source == source and not r.censored]
        others = [r for r in rows if r.source != source]
        sig = fit_sigmas(others, terms, floors, between)
        plain = fit_sigmas([r for r in others if not r.censored], terms, floors, between)
        held = [held_out(r, terms) for r in mine]
        inside = sum(
            abs(e) <= Z_BAND * band_sigma(r.shares, sig) for e, r in zip(held, mine, strict=True)
        )
        fits_only = sum(
            abs(e) <= Z_BAND * band_sigma(r.shares, plain) for e, r in zip(held, mine, strict=True)
        )
        out.append(SourceFigures(source, len(mine), _pct([r.log_error for r in mine]),
                                 _pct(held), inside, sig, fits_only))  # fmt: skip
    return out


def print_loso(
    title: str, rows: Sequence[Residual], terms: Sequence[Term], floors: Mapping[str, float],
    between: bool = False, stated: bool = True,
) -> tuple[float, dict[str, float]]:  # fmt: skip
    """Print the per-source table and the sds fitted on every source's held-out residuals
    (``stated``: what the catalog states); return (the pooled coverage, those sds)."""
    figures = loso(rows, terms, floors, between)
    print(f"\n{title}: leave-one-source-out (held out = the terms developed on the source "
          "left out; band = 90%, its sds fitted on the other sources)")  # fmt: skip
    print(f"{'source':34} {'n':>4}  {'in-sample':>15}  {'held out':>15}  {'in band':>9} "
          f"{'no OOMs':>8}  band sds fitted without it")  # fmt: skip
    print(f"{'':34} {'':>4}  {'median':>7} {'max':>7}  {'median':>7} {'max':>7}")
    for f in figures:
        sds = " ".join(f"{g} {s:.3f}" for g, s in f.sigmas.items())
        plain_share = f.inside_fits_only / f.n
        print(f"{f.source[:34]:34} {f.n:>4}  {f.in_sample[0]} {f.in_sample[1]}  {f.held[0]} "
              f"{f.held[1]}  {f.coverage:8.0%} {plain_share:8.0%}  {sds}")  # fmt: skip
    n = sum(f.n for f in figures)
    pooled = sum(f.inside for f in figures) / n if n else 1.0
    plain = sum(f.inside_fits_only for f in figures) / n if n else 1.0
    every = fit_sigmas(rows, terms, floors, between)
    print(f"{'all held-out rows':34} {n:>4}  {'':15}  {'':15}  {pooled:8.0%} {plain:8.0%}  "
          "(target >= 90%; 'no OOMs': sds fitted without the known OOMs' bounds)")  # fmt: skip
    what = "what the catalog states, tuner.models.uncertainty" if stated else "not stated"
    print(
        f"sds fitted on every source's held-out residuals ({what}): "
        + ", ".join(f"{g} {s:.3f}" for g, s in every.items())
    )
    return pooled, every


def print_term_effects(title: str, rows: Sequence[Residual], terms: Sequence[Term]) -> None:
    """Per term: median |error| with and without it on the sources it was not developed on
    (rows where it is part of the prediction), each row predicted as held out (without the
    terms developed on its own source: a term built on that source is no baseline there)."""
    print(f"\n{title}: each term on the sources it was NOT developed on")
    print(f"{'term':32} {'developed on':34} {'rows':>5} {'with':>7} {'without':>8}  verdict")
    for t in terms:
        on = [r for r in rows if r.source not in t.developed_on and r.terms.get(t.name, 0.0)
              and not r.censored]  # fmt: skip
        if not on:
            print(f"{t.name:32} {';'.join(t.developed_on) or '-':34} {0:>5}       -        -  "
                  "no held-out row it touches")  # fmt: skip
            continue
        own = {r.source: [u.name for u in terms if r.source in u.developed_on] for r in on}
        with_ = statistics.median(abs(math.expm1(r.without(own[r.source]))) for r in on)
        without = statistics.median(
            abs(math.expm1(r.without([*own[r.source], t.name]))) for r in on
        )
        verdict = (
            "keeps: improves held-out"
            if with_ < without
            else ("REVIEW: held-out worse with it" if with_ > without else "no effect")
        )
        print(f"{t.name:32} {';'.join(t.developed_on)[:34] or '-':34} {len(on):>5} "
              f"{with_:7.1%} {without:8.1%}  {verdict}")  # fmt: skip


def coverage(errors: Sequence[float], sigmas: Sequence[float]) -> float:
    """Share of ``errors`` (log) inside the 90% band of their sds."""
    pairs = list(zip(errors, sigmas, strict=True))
    return sum(abs(e) <= Z_BAND * s for e, s in pairs) / len(pairs) if pairs else 1.0
