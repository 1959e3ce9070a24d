"""The probe's step-time statistics: its own spread, and one point's step over another's paired by
the rounds they ran side by side (:mod:`tuner.profile.probe` interleaves its points' steps).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.config.parallel import ParallelConfig
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


def aligned(by_key: dict[str, dict[int, ProbeRow]],
             configs: Mapping[str, ParallelConfig]) -> dict[str, dict[int, ProbeRow]]:  # fmt: skip
    """The rows of a probe that interleaved its points, each as its reference's level times its
    paired ratio (:func:`tuner.profile.paired.paired_ratio`). The reference is the 1-layer run of
    the base point with the row's TP and CP; every row of that group is taken over the rounds
    all of them kept (a warm-up left out of one row leaves its round out of all), the reference
    at the median of its samples there, each other row at that median times the median over
    blocks of rounds of its ratio to the reference, its samples that median times each block's
    ratio (so its spread is the ratios'). A load that drifts through the probe then moves every
    row of the group by one factor, the reference's, and the differences between depths and
    points are free of it. Rows of a probe that ran its points one after another are kept as
    measured."""
    groups: dict[tuple[int, int], list[ProbeRow]] = {}
    for key, depths in by_key.items():
        groups.setdefault((configs[key].tp, configs[key].cp), []).extend(depths.values())
    refs = {(configs[k].tp, configs[k].cp): d[min(d)] for k, d in by_key.items() if len(d) > 1}
    out: dict[str, dict[int, ProbeRow]] = {}
    for key, depths in by_key.items():
        group = (configs[key].tp, configs[key].cp)
        ref = refs.get(group)
        shared = set.intersection(*(set(r.rounds) for r in groups[group]))
        if ref is None or not shared:
            out[key] = dict(depths)
            continue
        theirs = dict(zip(ref.rounds, ref.samples_s, strict=True))
        level = statistics.median(theirs[r] for r in shared)
        out[key] = {}
        for depth, row in depths.items():
            if row is ref:
                rounds = tuple(r for r in ref.rounds if r in shared)
                samples = tuple(theirs[r] for r in rounds)
                out[key][depth] = dataclasses.replace(row, step_s=level, samples_s=samples,
                                                      rounds=rounds)  # fmt: skip
                continue
            blocks = paired_ratios(row, ref, shared)
            ratio = paired_ratio(row, ref, shared)
            assert ratio is not None  # shared rounds, so blocks
            out[key][depth] = dataclasses.replace(
                row, step_s=level * ratio[0], samples_s=tuple(level * q for _, q in blocks),
                rounds=tuple(r for r, _ in blocks),
            )  # fmt: skip
    return out
