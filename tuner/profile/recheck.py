"""Which points of a probe that ran them one after another are measured again, and which run of
each is kept.

A probe whose script runs one point per launch (Megatron-LM, Megatron-DeepSpeed, Megatron-Bridge,
torchtitan, DeepSpeed without ``launch.probe_one_process``) measures each point in its own
minute: a burst of load from another process over one point's run (a third process on two
cores: x1.5) moves that point alone, and the differences between points (the per-layer time of
two depths, a neighbour's sharded work) carry it whole. The interleaved probe pairs its points'
steps by round instead (:mod:`tuner.profile.paired`) and is never measured again.

After the first pass, while the job still holds its nodes (the node scripts wait for the
verdict, :data:`tuner.profile.probe.RECHECK`), :func:`verdict` names the points to run once
more, in reverse order, by two rules:

- **Two levels in one run** (:func:`two_levels`). Load only slows a step: another process takes
  a share of the cores or the device, and nothing makes the same work faster. A run whose
  steady steps (past the warm-up) include one more than :data:`~tuner.profile.probe_logs.
  WARM_SLOW` faster than their median, or whose steps before and after some step have medians
  that far apart (a level that moved mid-run), was slowed over part of its minutes (the
  probe's warm-up cut calls a step that much over the level not steady). On quiet runs it
  names none at a 2-3% spread and 3.4% of runs at 5% (the demo's runs one after another:
  0.5-2.7%). The project's steady-state estimator (:mod:`tuner.logs.steady`) was judged for
  this: over ten steps its four or five batch means give a burst over nine of them a
  9.6-12.9% half-width, what a quiet run at a 5% spread gives in the median draw (6.9%).
- **A part under nil** (:func:`impossible`). The terms are differences of runs; a part that
  comes out at or under nil (the per-layer time, the rest of a micro-batch, a neighbour's
  sharded work or per-layer time, the pipeline's rest) is real work measured as none, so a run
  subtracted in it was slowed: the group's base point at both depths is measured again (the
  rows every such part subtracts). The step's fixed rest (two micro-batch counts) is not
  judged: it is the smallest part the probe measures and a stack may have none of it.

A burst over the whole of a run, from its first step to its last, leaves one level in it and is
caught only where it puts a part under nil (a slow deeper base run does: a neighbour's sharded
work goes under nil). Each point is measured again once at most; :func:`settle` keeps the
faster of its two runs (the less disturbed) and reports a point still inconsistent then as
uncertain, its samples both runs' (so its spread, and the stated uncertainty of the terms it
gives, covers their disagreement).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from tuner.profile.probe_logs import WARM_SLOW
from tuner.profile.probe_rows import ProbeRow, ProbeRun

if TYPE_CHECKING:
    from tuner.config.parallel import ParallelConfig
    from tuner.models.rates import Rates
    from tuner.models.stack import StackPoint
    from tuner.spec.study import StudySpec


SEGMENT = 3
"""The fewest consecutive steps a level of :func:`two_levels` is the median of (as the probe's
own median, :data:`~tuner.profile.probe_logs.MIN_STEADY`)."""


def two_levels(row: ProbeRow) -> str | None:
    """Why ``row``'s run holds two levels, or None: a step more than :data:`WARM_SLOW` under the
    run's median (a burst over all of it but that step), or the medians of its steps before
    and after some step (:data:`SEGMENT` at least each side) that far apart (a level that moved
    in the middle of the run: a burst over about half of it leaves the median between the two;
    one over fewer steps than the quiet level's leaves it there, and is measured again all the
    same, for one launch). Rows of an interleaved probe (``rounds``) are read against each
    other round by round and are not judged alone."""
    if row.rounds or len(row.samples_s) < 2:
        return None
    steps = row.samples_s
    low, high = min(steps), row.step_s
    for cut in range(SEGMENT, len(steps) - SEGMENT + 1):  # a level that moved mid-run
        a, b = sorted((statistics.median(steps[:cut]), statistics.median(steps[cut:])))
        if b * low > high * a:
            low, high = a, b
    if low > 0 and high > WARM_SLOW * low:
        return (f"two levels in its run ({_ms(low)} and {_ms(high)} ms a step): load "
                f"over part of it")  # fmt: skip
    return None


def base_runs(runs: Sequence[ProbeRun]) -> dict[tuple[int, int], tuple[int, ...]]:
    """The indices of each (TP, CP) group's base point at its two depths (the runs of one config
    at more than one depth, at the study's micro-batches per step)."""
    depths: dict[str, list[int]] = {}
    for k, run in enumerate(runs):
        if run.batch_scale == 1 and run.config.pp == 1 and run.config.vp == 1:
            depths.setdefault(run.config.key(), []).append(k)
    return {(runs[ks[0]].config.tp, runs[ks[0]].config.cp): tuple(ks)
            for ks in depths.values() if len(ks) > 1}  # fmt: skip


def impossible(spec: StudySpec, runs: Sequence[ProbeRun], rows: Sequence[ProbeRow],
               rates: Rates | None = None) -> dict[int, str]:  # fmt: skip
    """The runs to measure again because a part of the terms composed from ``rows`` came out at
    or under nil, each with the part: the group's base at both depths (module docstring)."""
    from tuner.profile.stack_terms import derive_terms

    bases = base_runs(runs)
    terms = derive_terms(spec, rows, rates)
    out: dict[int, str] = {}
    for p in terms.points:
        base = runs[bases[(p.tp, p.cp)][0]].config if (p.tp, p.cp) in bases else None
        if base is None:
            continue
        is_base = p.pp == 1 and (p.mbs, p.recompute, p.zero_stage, p.ep, p.distopt) == (
            base.micro_batch_size, base.recompute, base.zero_stage, base.ep,
            base.distributed_optimizer)  # fmt: skip
        where = "the base point" if is_base else "the pipeline point" if p.pp > 1 else (
            "its neighbour " + _label(p, base))  # fmt: skip
        parts = []
        if p.pp == 1 and (p.layer_scale is None or p.layer_scale <= 0):  # None: layer <= 0
            parts.append("per-layer time")
        if p.fixed_scale == 0.0:
            parts.append("rest per micro-batch")
        if p.step_scale == 0.0:
            parts.append("sharded work")
        if parts:
            why = f"{' and '.join(parts)} of {where} at or under nil"
            for k in bases[(p.tp, p.cp)]:
                out.setdefault(k, why)
    return out


def _label(p: StackPoint, base: ParallelConfig) -> str:
    """What a neighbour point changes from its base (``zero1``, ``recompute=full``)."""
    names = (("recompute", "recompute"), ("zero_stage", "zero_stage"), ("ep", "ep"),
             ("distopt", "distributed_optimizer"), ("mbs", "micro_batch_size"))  # fmt: skip
    diff = [f"{a}={getattr(p, a)}" for a, b in names if getattr(p, a) != getattr(base, b)]
    return " ".join(diff) or "(same knobs)"


def verdict(spec: StudySpec, runs: Sequence[ProbeRun], rows: Sequence[ProbeRow],
            rates: Rates | None = None) -> dict[int, str]:  # fmt: skip
    """The first pass's points to measure again, each with why: :func:`two_levels`, then
    :func:`impossible` in the groups (TP, CP) whose base holds no two levels (a slowed base
    run's second run may be what put a part under nil: :func:`settle` judges the parts again;
    a slowed neighbour cannot, it enters its part with a plus sign); none for a probe that
    interleaved its points."""
    if any(r.rounds for r in rows):
        return {}
    out = {k: why for k, row in enumerate(rows) if (why := two_levels(row)) is not None}
    slowed = {g for g, ks in base_runs(runs).items() if set(ks) & out.keys()}
    for k, why in impossible(spec, runs, rows, rates).items():
        if (runs[k].config.tp, runs[k].config.cp) not in slowed:
            out.setdefault(k, why)
    return out


def order(points: Mapping[int, str]) -> list[int]:
    """The order the points run again: the reverse of the first pass's, so a pair of points
    whose difference is a term (the base's two depths) runs the other way round, and a load
    that drifts through the re-runs moves their difference the other way."""
    return sorted(points, reverse=True)


def settle(spec: StudySpec, runs: Sequence[ProbeRun], first: Sequence[ProbeRow],
           again: Mapping[int, ProbeRow], why: Mapping[int, str],
           rates: Rates | None = None) -> list[ProbeRow]:  # fmt: skip
    """The rows the terms use: for each point measured again, the faster of its two runs (load
    only slows the same work: the faster run is the less disturbed), its ``rechecked`` note
    saying why and which was kept; a point whose kept run still holds two levels, or whose
    group still has a part under nil, is ``uncertain`` and carries both runs' samples."""
    rows = list(first)
    for k, second in again.items():
        kept = second if second.step_s < first[k].step_s else first[k]
        which = "the second" if kept is second else "the first"
        note = (f"{why[k]}; again {_ms(second.step_s)} ms against {_ms(first[k].step_s)} ms, "
                f"{which} kept")  # fmt: skip
        rows[k] = dataclasses.replace(kept, rechecked=note)
    still = {k: w for k, r in enumerate(rows) if (w := two_levels(r)) is not None}
    for k, w in impossible(spec, runs, rows, rates).items():
        still.setdefault(k, w)
    for k, w in still.items():
        both = first[k].samples_s + again[k].samples_s if k in again else rows[k].samples_s
        note = rows[k].rechecked or f"{w} (not measured again)"
        rows[k] = dataclasses.replace(rows[k], samples_s=both, uncertain=w, rechecked=note)
    return rows


def terms_of(rows: Sequence[ProbeRow], k: int, configs: Mapping[str, ParallelConfig],
             wides: Collection[str]) -> str:  # fmt: skip
    """The time terms that ``rows[k]`` gives (what its being uncertain makes uncertain);
    ``configs`` and ``wides`` as :func:`tuner.profile.stack_terms.probe_configs` gives them."""
    row, c = rows[k], configs[rows[k].key]
    depths: dict[str, int] = {}
    for r in rows:
        depths[r.key] = depths.get(r.key, 0) + 1
    base = next((configs[r.key] for r in rows if depths[r.key] > 1 and r.key not in wides
                 and (configs[r.key].tp, configs[r.key].cp) == (c.tp, c.cp)), None)  # fmt: skip
    if row.key in wides:
        return "the step's fixed rest"
    if c.pp > 1:
        return "the pipeline's rest per micro-batch"
    if depths[row.key] > 1 or base is None:
        return "the per-layer time and rest per micro-batch of every point of its TP and CP"
    same = (c.micro_batch_size, c.recompute, c.ep) == (
        base.micro_batch_size, base.recompute, base.ep)  # fmt: skip
    return "its sharded work" if same else "its per-layer time"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"
