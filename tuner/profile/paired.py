"""The probe's step-time statistics: its own spread, and one point's step over another's paired by
the rounds they ran side by side (:mod:`tuner.profile.probe` interleaves its points' steps).
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.profile.probe import ProbeRow


def spread(samples: Sequence[float]) -> float:
    """Median absolute deviation over the median: the probe's own relative spread."""
    if len(samples) < 2:
        return 0.0
    mid = statistics.median(samples)
    return statistics.median(abs(s - mid) for s in samples) / mid if mid > 0 else 0.0


def paired_ratios(row: ProbeRow, ref: ProbeRow,
                  within: Collection[int] | None = None) -> list[tuple[int, float]]:  # fmt: skip
    """(round, ``row`` over ``ref``) per block of the rounds both ran in (and in ``within``),
    when the probe interleaved them (``rounds``); empty otherwise.

    A block is a pair of rounds ``(r, r + 1)`` with ``r`` even, the points in order in the first
    and in reverse in the second (the workloads' schedule): its ratio is ``row``'s two steps
    over ``ref``'s two, which cancels a load that drifts linearly through the block whichever of
    the two points ran first. A round whose pair is missing (a warm-up left out) is a block
    alone."""
    if not row.rounds or not ref.rounds:
        return []
    mine = dict(zip(row.rounds, row.samples_s, strict=True))
    theirs = dict(zip(ref.rounds, ref.samples_s, strict=True))
    shared = mine.keys() & theirs.keys() & (set(within) if within is not None else mine.keys())
    out = []
    for r in sorted(shared):
        if r % 2 == 0 and r + 1 in shared:
            out.append((r, (mine[r] + mine[r + 1]) / (theirs[r] + theirs[r + 1])))
        elif not (r % 2 == 1 and r - 1 in shared):
            out.append((r, mine[r] / theirs[r]))
    return out


def paired_ratio(row: ProbeRow, ref: ProbeRow,
                 within: Collection[int] | None = None) -> tuple[float, float] | None:  # fmt: skip
    """(median, spread) of ``row``'s step time over ``ref``'s, paired by round; None when the
    two were not interleaved or share no round.

    The estimator: the median over blocks of rounds (:func:`paired_ratios`) of the ratio of
    steps that ran side by side. A machine's load slows the steps of one round alike (other
    processes take a share of the cores), so the ratio is free of it however it drifts from
    round to round, and the median keeps a block that one burst hit, or a warm-up the
    steady-state cut kept, from moving it. The spread is the ratios' median absolute deviation
    over their median. The estimator before it took the difference of the two rows' own
    medians, each at whatever load its run had: two short runs under a drifting load differ by
    the drift, which the per-layer difference of a 1- and a 2-layer run then amplifies. (A
    median of paired differences is not free of the load: under a trend its blocks differ by
    the load, so one outlier moves it to another block's load level.)"""
    ratios = [q for _, q in paired_ratios(row, ref, within)]
    if not ratios:
        return None
    mid = statistics.median(ratios)
    return mid, statistics.median(abs(q - mid) for q in ratios) / mid
