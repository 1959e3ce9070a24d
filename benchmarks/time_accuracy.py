"""How well ``tuner.models.time.estimate`` predicts and ranks published training speeds, and how
fast it is.

Reads ``benchmarks/data/step_times.csv`` (measured step times / throughputs of real runs, each with
its citation, cluster and full config; see ``benchmarks/data/STEP_TIMES.md``) and prints, per row,
the published figure, the prediction in the *source's own* metric and FLOPs convention, and the
error; then, per group of configs measured on one cluster and per source:

- MAPE: mean absolute percentage error of the prediction in the row's metric;
- Spearman rank correlation between measured and predicted speed (model FLOPs per GPU-second, so
  rows of different GPU counts or models in one group compare fairly; for one model on one GPU
  count this is the order of the step times);
- best: whether the config the model predicts fastest is within 2% of the measured best.

Targets (issue 14): MAPE <= 10%, Spearman >= 0.9 and best within 2% in every group, with the
catalog alone. The cluster's network is a fact of the cluster, not of the GPU: a row's
``network_gbps_per_gpu`` (the node's NIC line rate / GPUs per node, from the cited hardware
description) replaces the catalog's per-GPU network share when given. Rows that also cite their
cluster's measured inter-node bandwidth (``network_measured_gbps_per_node``) are printed a second
time predicted with it, beside the catalog's figures; every other table stays catalog-only. Run:

    .venv/bin/python benchmarks/time_accuracy.py [--rows]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from held_out import (
    STACK,
    Residual,
    band_sigma,
    coverage,
    load_terms,
    print_loso,
    print_term_effects,
)
from scipy.stats import spearmanr
from time_rows import (
    BEST_WITHIN,
    CSV,
    TIMES,
    Case,
    _tag,
    load_cases,
)

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.time.estimate import (
    estimate_time,
)
from tuner.models.uncertainty import (
    CATALOG_TIME_SIGMA,
    CATALOG_TIME_STACK_SIGMA,
    TIME_GROUPS,
    TIME_SIGMA_FLOORS,
    Z_BAND,
)
from tuner.spec.study import ModelSpec, TrainingSpec


def _describe(c: ParallelConfig) -> str:
    text = f"t{c.tp} p{c.pp} d{c.dp}"
    text += f" c{c.cp}" if c.cp > 1 else ""
    text += f" v{c.vp}" if c.vp > 1 else ""
    text += f" b{c.micro_batch_size} g{c.global_batch_size} {c.recompute}"
    text += " sp" if c.sequence_parallel else ""
    text += " dopt" if c.distributed_optimizer else ""
    text += " tpo" if c.tp_comm_overlap else ""
    return text + (f" z{c.zero_stage}" if c.zero_stage else "")


def print_rows(cases: list[Case]) -> None:
    print(f"{'group':34} {'config':36} {'metric':21} {'published':>10} {'predicted':>10} "
          f"{'error':>7}  assumptions")  # fmt: skip
    for case in cases:
        print(
            f"{case.row['group'][:34]:34} {_describe(case.config):36} {case.row['metric']:21} "
            f"{case.published:10.4g} {case.predicted:10.4g} {case.error:+7.1%}  "
            f"{', '.join(case.notes)}"
        )


def _mape(cases: list[Case]) -> float:
    return sum(abs(c.error) for c in cases) / len(cases)


@dataclass(frozen=True)
class GroupScore:
    """The three issue-14 figures of one group."""

    n: int
    mape: float
    worst: float
    rho: float | None
    best_gap: float | None
    """Measured shortfall of the predicted-fastest config from the measured best (0 = found)."""

    @property
    def passed(self) -> bool:
        rank_ok = self.rho is None or self.rho >= 0.9
        best_ok = self.best_gap is None or self.best_gap <= BEST_WITHIN
        return self.mape <= 0.10 and rank_ok and best_ok


def score(group: list[Case]) -> GroupScore:
    mape = _mape(group)
    worst = max(abs(c.error) for c in group)
    if len(group) < 2:
        return GroupScore(len(group), mape, worst, None, None)
    measured = [c.speed("measured") for c in group]
    rho, gap = _rank(measured, [c.speed("predicted") for c in group])
    return GroupScore(len(group), mape, worst, rho, gap)


def _rank(measured: list[float], predicted: list[float]) -> tuple[float, float]:
    """(Spearman of the two speed lists, measured shortfall of the predicted-fastest row from
    the measured best)."""
    rho = float(spearmanr(measured, predicted).statistic) if len(set(predicted)) > 1 else 0.0
    pick = max(range(len(measured)), key=lambda i: predicted[i])
    return rho, 1.0 - measured[pick] / max(measured)


def _key(case: Case) -> str:
    """What the model sees of a row: model, config, precision, GPU, framework."""
    config, precision = _describe(case.config), case.row["precision"]
    return f"{case.model!r} {config} {precision} {case.gpu.name} {case.framework}"


def repeat_bound(group: list[Case]) -> tuple[float, float] | None:
    """The figures an exact model would reach where rows it cannot tell apart (a setup measured
    again, or runs that differ only in what the model does not see) were measured at different
    speeds: it can only predict their mean, so their spread bounds its rank correlation and best
    gap: (Spearman, best gap), or None when no two rows look the same to the model."""
    runs: dict[str, list[float]] = defaultdict(list)
    for case in group:
        runs[_key(case)].append(case.speed("measured"))
    if all(len(v) == 1 for v in runs.values()):
        return None
    measured = [c.speed("measured") for c in group]
    return _rank(measured, [statistics.fmean(runs[_key(c)]) for c in group])


def step_log_error(case: Case) -> float:
    """log(measured / predicted step time) of a row, whatever its metric."""
    ratio = case.published / case.predicted
    return math.log(ratio if case.row["metric"] in TIMES else 1.0 / ratio)


def rms_step_error(cases: list[Case]) -> float:
    """The rms of ``step_log_error``, in sample (what the catalog states is the held-out sd,
    ``tuner.models.uncertainty.CATALOG_STEP_SIGMA``)."""
    return math.sqrt(statistics.fmean(step_log_error(c) ** 2 for c in cases))


def print_groups(cases: list[Case]) -> None:
    for title, key in (("group", lambda c: c.row["group"]), ("source", lambda c: _tag(c.row))):
        groups: dict[str, list[Case]] = defaultdict(list)
        for case in cases:
            groups[key(case)].append(case)
        print(f"\nby {title}: {'':28} n   MAPE  worst  Spearman  best-gap  targets")
        passed = 0
        for name, group in sorted(groups.items()):
            s = score(group)
            rho = "     -" if s.rho is None else f"{s.rho:+6.2f}"
            gap = "      -" if s.best_gap is None else f"{s.best_gap:7.1%}"
            passed += s.passed
            print(f"  {name:38} {s.n:2} {s.mape:6.1%} {s.worst:6.1%}    {rho}   {gap}  "
                  f"{'ok' if s.passed else 'MISS'}")  # fmt: skip
        print(f"  {passed}/{len(groups)} {title}s meet all three targets; "
              f"all {len(cases)} rows: MAPE {_mape(cases):.1%}")  # fmt: skip
        for name, group in sorted(groups.items()):
            bound = repeat_bound(group) if title == "group" else None
            if bound is not None:
                print(f"  {name}: rows the model cannot tell apart ran at different speeds; "
                      f"predicting their mean exactly reaches Spearman {bound[0]:+.2f}, best gap "
                      f"{bound[1]:.1%}")  # fmt: skip


def pair_order(group: list[Case]) -> tuple[int, int, float] | None:
    """Pairs of rows of one group (one cluster and campaign) with one model on one GPU type and
    count, the choices a search ranks against each other: (pairs whose faster row the model
    names, pairs, median |log(predicted speed ratio / measured speed ratio)|); None without such
    a pair. Pairs the model cannot tell apart (:func:`_key`: a setup measured again) or that were
    measured at the same speed have no order to name and are left out."""
    runs: dict[str, list[Case]] = defaultdict(list)
    for case in group:
        runs[
            f"{case.row['group']} {case.model!r} {case.gpu.name} {case.config.world_size}"
        ].append(case)
    right, ratios = 0, []
    for same in runs.values():
        for i, a in enumerate(same):
            for b in same[i + 1 :]:
                measured = math.log(a.speed("measured") / b.speed("measured"))
                if measured == 0.0 or _key(a) == _key(b):
                    continue
                predicted = math.log(a.speed("predicted") / b.speed("predicted"))
                right += measured * predicted > 0
                ratios.append(abs(predicted - measured))
    return (right, len(ratios), statistics.median(ratios)) if ratios else None


def print_pairs(cases: list[Case]) -> None:
    print("\npairs of one model on one GPU type and count, per source: faster row named right, "
          "median |error| of the speed ratio")  # fmt: skip
    sources: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        sources[_tag(case.row)].append(case)
    for name, group in sorted(sources.items()):
        figures = pair_order(group)
        if figures is not None:
            right, n, ratio = figures
            print(f"  {name:38} {right:3}/{n:<3}  {ratio:6.1%}")


def _figures(group: list[Case]) -> str:
    s, pairs = score(group), pair_order(group)
    rho = "     -" if s.rho is None else f"{s.rho:+6.2f}"
    named = "      -" if pairs is None else f"{pairs[0]:3}/{pairs[1]:<3}"
    return f"{s.mape:6.1%}  {rho}  {named}"


def _belongs(case: Case, kind: str, name: str) -> bool:
    return (case.row["group"] if kind == "group" else _tag(case.row)) == name


def print_measured_network(catalog: list[Case], path: Path) -> None:
    """The groups whose rows cite their cluster's measured inter-node bandwidth
    (``network_measured_gbps_per_node``), predicted with it as a cluster profile's measured link
    would be, beside the catalog's figures above (line rate x NETWORK_BUS_EFFICIENCY); the
    held-out tables and the catalog's stated sds stay catalog-only."""
    measured, _ = load_cases(path, measured_network=True)
    cited = {c.row["group"] for c in measured if c.row.get("network_measured_gbps_per_node")}
    if not cited:
        return
    print("\nwith the cluster's measured inter-node bandwidth (rows that cite one): catalog -> "
          "measured link; MAPE, Spearman, pairs of one model and GPU count named "
          "right")  # fmt: skip
    sources = sorted({_tag(c.row) for c in measured if c.row["group"] in cited})
    keys = [("group", g) for g in sorted(cited)] + [("source", t) for t in sources]
    for kind, name in keys:
        before = [c for c in catalog if _belongs(c, kind, name)]
        after = [c for c in measured if _belongs(c, kind, name)]
        print(f"  {name:38} {len(after):2}  {_figures(before)}  ->  {_figures(after)}".rstrip())


TERMS_CSV = Path(__file__).resolve().parent / "data" / "time_terms.csv"


def residual(case: Case) -> Residual:
    """A row for the held-out tables: its step's log error, the compute and communication
    groups' shares of the predicted step, and each ablatable term's share
    (benchmarks/data/time_terms.csv). A one-layer row is all compute."""
    b = case.breakdown
    if b is None:
        return Residual(_tag(case.row), step_log_error(case), {"compute": 1.0})
    shares: dict[str, float] = {}
    for name, group in TIME_GROUPS.items():
        shares[group] = shares.get(group, 0.0) + getattr(b, name) / b.step
    terms = {t.name: getattr(b, t.name) / b.step for t in load_terms(TERMS_CSV)}
    return Residual(_tag(case.row), step_log_error(case), shares, terms)


def print_held_out(cases: list[Case]) -> float:
    """The leave-one-source-out tables and the stated band's coverage; returns the pooled
    held-out coverage."""
    terms = load_terms(TERMS_CSV)
    rows = [residual(c) for c in cases]
    pooled, _ = print_loso("step time", rows, terms, TIME_SIGMA_FLOORS, between=True)
    print_term_effects("step time", rows, terms)
    stated = CATALOG_TIME_SIGMA | {STACK: CATALOG_TIME_STACK_SIGMA}
    print("\nthe stated band (tuner.models.uncertainty's catalog sds) per source: rows inside")
    for source in sorted({r.source for r in rows}):
        of = [r for r in rows if r.source == source]
        sds = [band_sigma(r.shares, stated) for r in of]
        print(f"  {source:34} {len(of):>4}  {coverage([r.log_error for r in of], sds):5.0%}")
    sds = [band_sigma(r.shares, stated) for r in rows]
    print(f"  {'all':34} {len(rows):>4}  {coverage([r.log_error for r in rows], sds):5.0%}")
    mid = statistics.median(sds)
    print(f"  the stated band's sd: median {mid:.3f} (90% band x{math.exp(-Z_BAND * mid):.2f}"
          f"-{math.exp(Z_BAND * mid):.2f} of the prediction), largest {max(sds):.3f}")  # fmt: skip
    return pooled


def print_speed() -> None:
    model = ModelSpec(
        num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
        num_query_groups=8, vocab_size=128256, seq_length=4096, swiglu=True,
    )  # fmt: skip
    training = TrainingSpec(global_batch_size=1024)
    gpu = get_gpu("h100-sxm-80gb")
    configs = [
        ParallelConfig(tp=t, pp=p, cp=c, dp=512 // (t * p * c), vp=v, micro_batch_size=b,
                       global_batch_size=1024, recompute=rc, sequence_parallel=t > 1,
                       distributed_optimizer=True)  # fmt: skip
        for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) for c in (1, 2) for v in (1, 2)
        for b in (1, 2, 4) for rc in ("none", "selective")
    ]  # fmt: skip
    for config in configs:  # warm the per-shape caches, as a study's first pass does
        estimate_time(model, training, config, gpu, 8)
    start = time.perf_counter()
    rounds = 20
    for _ in range(rounds):
        for config in configs:
            estimate_time(model, training, config, gpu, 8)
    per_call = (time.perf_counter() - start) / (rounds * len(configs))
    print(f"\nspeed: {per_call * 1e6:.1f} us per estimate_time call ({1 / per_call:,.0f} "
          f"configs/s; {len(configs)} configs of a 70B space, warm caches)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", action="store_true", help="print every row's prediction")
    parser.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args()
    cases, skipped = load_cases(args.csv)
    if args.rows:
        print_rows(cases)
    print(f"{len(cases)} rows used; skipped {sum(skipped.values())}:")
    for reason, n in sorted(skipped.items()):
        print(f"  {n:3}  {reason}")
    print_groups(cases)
    print_pairs(cases)
    print_measured_network(cases, args.csv)
    print(f"\nall {len(cases)} rows: rms of log(measured / predicted step time) "
          f"{rms_step_error(cases):.3f} (in sample; held out below)")  # fmt: skip
    print_held_out(cases)
    print_speed()


if __name__ == "__main__":
    main()
