"""Trace one ``tune`` search of ``search_efficiency.py --node-hours``, launch by launch.

    python benchmarks/search_trace.py --surface micro_batch --seeds 0,1,2
                                      [--anchor deepspeed-autotuning] [--starts] [--stop]

For each launch: the config, its place in the time model's order (the sampler's prior: rank 1 is
the model's fastest admitted config), the model's step time for it, its true step time on the
surface (and its ratio to the best), what the sampler said it launched it for (``exploitation``,
``exploration``), the node-hours charged so far, and where the study's stop rule ended it.
The header says where the surface's best sits in the model's order; with ``--anchor``, the
anchor's launches on the same surface follow, with the same charge per launch, so a diagnosis of
"why does the anchor get there first" reads both orders side by side. With ``--stop`` the last
column is what the stop rules read once each launch was measured (:func:`stop_inputs`): why the
search went on after it.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import FrozenTrial

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.anchors import ANCHORS, deepspeed  # noqa: E402
from benchmarks.replays import NETWORKS  # noqa: E402
from benchmarks.search_efficiency import (  # noqa: E402
    Truth,
    launch_node_hours,
    open_loop,
    study_data,
    truth,
)
from tuner.profile.rates import profile_rates  # noqa: E402
from tuner.search.knowledge import launch_values  # noqa: E402
from tuner.search.sampler import ModelGuidedSampler  # noqa: E402
from tuner.search.value import best_worth, chance, improvement, purpose_of  # noqa: E402
from tuner.space.enumerate import enumerate_space  # noqa: E402
from tuner.spec.file import study_from_mapping  # noqa: E402
from tuner.spec.study import StudySpec  # noqa: E402
from tuner.study.loop import StudyLoop  # noqa: E402


def model_order(spec: StudySpec, t: Truth) -> dict[str, tuple[int, float]]:
    """Each admitted config's (1-based rank, predicted step s) in the time model's order (under
    a replay's cluster profile, where it has one), among the configs ``t.keep`` names (a
    replay's measured ones) when given."""
    rates = None if t.profile is None else profile_rates(spec, t.profile)
    report = enumerate_space(spec, keep_oom=t.keep is not None, rates=rates)
    if t.keep is not None:
        report = report.restricted(t.keep)
    return {c.config.key(): (i, c.time.step if c.time else float("nan"))
            for i, c in enumerate(report.ranked(), 1)}  # fmt: skip


def best_seen(loop: StudyLoop, trials: list[FrozenTrial], key: str) -> str:
    """What the sampler believed about config ``key`` before the launch after ``trials``: a
    fresh sampler (the loop's own reads each finished trial once) on the same space. ``screened``
    when the corrected memory screen keeps it out, ``tried`` once launched; else its corrected
    step (s), its spread (log), its chance of beating the best by 1 %, and its place by expected
    improvement per node-hour among the open configs (the order the sampler picks in: the
    improvement of the config the run would use once the launch is measured)."""
    own = loop.study.sampler
    assert isinstance(own, ModelGuidedSampler)
    sampler = ModelGuidedSampler(loop.spec, seed=loop.spec.search.seed, space=own._shared)
    b = sampler.belief(trials)
    keys = [c.key() for c in sampler._candidates()]
    if b is None or key not in keys:
        return "-"
    i = keys.index(key)
    if i not in b.open_:
        launched = {str(x.user_attrs.get("key")) for x in trials}
        return "tried" if key in launched else "screened"
    j = b.open_.index(i)
    if b.best is None:
        place = int(np.argsort(b.mu).tolist().index(j)) + 1
        return f"{math.exp(b.mu[j]):.2f}s first-pick rank {place}"
    spread = b.spread(sampler._prior.noise)
    cost = sampler.launch_node_hours(b, trials)
    _, xb = sampler._belief(trials)
    score = launch_values(b, xb, spread, sampler._prior.noise) / cost  # the sampler's order
    p = chance(b.mu, spread, b.best, dof=b.dof)
    place = int((score > score[j]).sum()) + 1
    return (
        f"{math.exp(b.mu[j]):.2f}s sd {spread[j]:.2f} p {p[j]:.2f} "
        f"EI/nh rank {place}/{len(b.open_)}"
    )


def stop_inputs(loop: StudyLoop, trials: list[FrozenTrial], t: Truth) -> str:
    """What the stop rules read after ``trials`` (a fresh sampler, as :func:`best_seen`):
    rule 1's joint chance; the leave-one-out scale and its degrees of freedom; rule 2's most
    valuable launch: its believed step over the best, its gain against its cost (node-hours),
    the same gain were the belief Gaussian (``dof`` infinite) and at the stated prior width
    (``scale`` 1, Gaussian), its true step over the surface's best, and the training run
    (node-hours) at or below which rule 2 would have stopped here."""
    own = loop.study.sampler
    assert isinstance(own, ModelGuidedSampler)
    sampler = ModelGuidedSampler(loop.spec, seed=loop.spec.search.seed, space=own._shared)
    b, xb = sampler._belief(trials)
    found = sampler.chance_to_beat(trials, 0.01)
    if b is None or b.best is None or b.scale is None or found is None:
        return ""
    noise = sampler._prior.noise
    moves = b.lookahead(xb, noise)
    cost = sampler.launch_node_hours(b, trials)
    run = sampler.run_node_hours(trials)
    w = best_worth(b.mu, moves, cost, b.best, run, b.dof)
    gauss = best_worth(b.mu, moves, cost, b.best, run, None)
    stated = best_worth(b.mu, moves / b.scale, cost, b.best, run, None)
    i = w.index
    gains = improvement(b.mu, moves, b.best, b.dof)
    breakeven = float(np.min(cost / np.maximum(gains, 1e-12)))
    true = t.space.step.get(sampler._candidates()[b.open_[i]].key())
    return (
        f"joint {found[0]:.2f} scale {b.scale:.2f} dof {b.dof} | top "
        f"{math.exp(b.mu[i] - b.best):.2f}x best, gain {w.gain_node_hours:.3f} (Gaussian "
        f"{gauss.gain_node_hours:.3f}, stated width "
        f"{stated.gain_node_hours:.3f}) vs cost {w.cost_node_hours:.3f}, true "
        f"{'OOM' if true is None else f'{true / t.best_step:.2f}'}; stops for a run <= "
        f"{breakeven:.1f} (default {run:.1f})"
    )


def trace(spec: StudySpec, t: Truth, results: Path, stops: bool = False
          ) -> tuple[list[list[str]], str]:  # fmt: skip
    """The launches of one tune search run to its own stop, as table rows; and its stop. With
    ``stops``, the last column is what the stop rules read once the launch was measured
    (:func:`stop_inputs`) instead of what the sampler believed about the best."""
    order = model_order(spec, t)
    loop = open_loop(spec, t, results)
    loop.poll_s = 0.0
    try:
        loop.seed()
        while loop.step():
            time.sleep(0.01)
        stop = loop.summary.stop_reason
        trials = sorted((x for x in loop.trials() if x.user_attrs.get("launched")),
                        key=lambda x: x.number)  # fmt: skip
        every = sorted(loop.trials(), key=lambda x: x.number)
        seen = [stop_inputs(loop, [y for y in every if y.number <= x.number], t) if stops
                else best_seen(loop, [y for y in every if y.number < x.number], t.best_key)
                for x in trials]  # fmt: skip
    finally:
        loop.executor.close()
    rows, spent = [], 0.0
    for n, x in enumerate(trials, 1):
        key = str(x.user_attrs.get("key"))
        spent += launch_node_hours(spec, t, key)
        rank, predicted = order.get(key, (0, float("nan")))
        true = t.space.step.get(key)
        measured = x.value if x.values else None
        rows.append([str(n), key, str(rank), f"{predicted:.3f}",
                     "OOM" if true is None else f"{true:.3f} ({true / t.best_step:.2f})",
                     "" if measured is None else f"{float(measured):.3f}",
                     purpose_of(x.system_attrs, x.user_attrs) or "first",
                     f"{spent:.3f}", "best" if t.good(key) else "",
                     seen[n - 1]])  # fmt: skip
    return rows, stop


def anchor_rows(spec: StudySpec, t: Truth, name: str, seed: int) -> list[list[str]]:
    """The anchor's launches on the same truth, charged as the benchmark charges them."""
    order = model_order(spec, t)
    rows, spent = [], 0.0
    for n, key in enumerate(ANCHORS[name](t.space, random.Random(seed)), 1):
        spent += launch_node_hours(spec, t, key)
        true = t.space.step.get(key)
        rows.append([str(n), key, str(order.get(key, (0, 0.0))[0] or "-"), "",
                     "OOM" if true is None else f"{true:.3f} ({true / t.best_step:.2f})",
                     "", name, f"{spent:.3f}", "best" if t.good(key) else "", ""])  # fmt: skip
    return rows


def deepspeed_starts(spec: StudySpec, t: Truth) -> str:
    """DeepSpeed Autotuning's emulation started from every admitted config in turn (its grid
    order starts at the first): node-hours to the best, median and range over the starts, and
    from its own start."""
    spent = []
    for key in sorted(t.space.admitted):
        order = deepspeed(t.space, random.Random(0), first=key)
        total = 0.0
        for k in order:
            total += launch_node_hours(spec, t, k)
            if t.good(k):
                break
        spent.append(total if any(t.good(k) for k in order) else math.inf)
    own = deepspeed(t.space, random.Random(0))
    reached = [k for k in own if t.good(k)]
    mine = sum(launch_node_hours(spec, t, k) for k in own[: own.index(reached[0]) + 1]
               ) if reached else math.inf  # fmt: skip
    finite = sorted(spent)
    return (
        f"deepspeed-autotuning from each of {len(spent)} first launches: node-hours to the "
        f"best median {statistics.median(finite):.3f} (min {finite[0]:.3f}, max "
        f"{finite[-1]:.3f}, {sum(math.isinf(v) for v in spent)} never reach it); "
        f"from its grid's first, {mine:.3f}\n"
    )


def emit(rows: list[list[str]], last: str = "the best, as the sampler saw it") -> None:
    header = ["#", "config", "model rank", "model s", "true s (/best)", "measured s",
              "purpose", "node-h so far", "", last]  # fmt: skip
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        sys.stdout.write("\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--surface", default="micro_batch", help="a surface or a replay's name")
    parser.add_argument("--space", default="full")
    parser.add_argument("--seeds", default="0", help="comma-separated; empty: no tune search")
    parser.add_argument("--anchor", default="")
    parser.add_argument(
        "--stop",
        action="store_true",
        help="per launch, what the stop rules read once it was measured (not the best's view)",
    )
    parser.add_argument(
        "--starts",
        action="store_true",
        help="DeepSpeed's emulation from every possible first launch",
    )
    parser.add_argument(
        "--replay-network", choices=NETWORKS, default="profile",
        help="a replay's network (search_efficiency.py's option of the same name)",
    )  # fmt: skip
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("tuner").setLevel(logging.WARNING)
    base = study_from_mapping(study_data(args.surface, "tune", 0, 1, args.space))
    t = truth(base, args.surface, args.replay_network)
    order = model_order(base, t)
    best_rank = order[t.best_key][0]
    good = sorted(order[k][0] for k in t.step if t.good(k))
    where = "replay" if t.keep is not None else args.space
    sys.stdout.write(f"{where}/{args.surface}: best {t.best_key} {t.best_step:.3f} s, "
                     f"model rank {best_rank} of {len(order)}; configs within 2 % at model "
                     f"ranks {good}\n")  # fmt: skip
    if args.starts:
        sys.stdout.write(deepspeed_starts(base, t))
    with tempfile.TemporaryDirectory(prefix="tuner-trace-") as tmp:
        for seed in (int(s) for s in args.seeds.split(",") if s):
            data = study_data(args.surface, "tune", seed, t.valid, args.space)
            rows, stop = trace(study_from_mapping(data), t, Path(tmp) / str(seed), args.stop)
            sys.stdout.write(f"\nseed {seed}: stopped: {stop}\n")
            emit(rows, "what the stop rules read after it" if args.stop else
                 "the best, as the sampler saw it")  # fmt: skip
            if args.anchor:
                sys.stdout.write(f"\n{args.anchor}, seed {seed}:\n")
                emit(anchor_rows(base, t, args.anchor, seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
