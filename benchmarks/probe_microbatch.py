"""Per-layer and per-micro-batch time of the real stack at every micro-batch size of a study,
measured directly, against the time model: is there a fixed cost per layer per micro-batch that
the probe's layer scale (measured at one micro-batch size) stretches with the micro-batch size?

    python benchmarks/probe_microbatch.py --study demo [--results results] [--iters 21]
                                          [--save FILE | --rows FILE]

One job through the study's executor and the framework probe's own machinery
(``tuner.profile.probe``): the probe's base point (its first TP/CP group) at each micro-batch
size of the space, same global batch (so ``m`` micro-batches per step fall as the size grows), at
the probe's two depths (:func:`tuner.profile.probe.probe_depths`), the steps interleaved (one of
each run per round) on CPU ranks, each run read as the base's 1-layer run times their paired ratio
(``tuner.profile.paired``). Per size it prints what the probe would measure there: one layer's
forward and backward per micro-batch (the two depths' difference, less the model's step rest, over
``m`` and the layers between) and the rest of a micro-batch (embedding, LM head, loss, the
engine's per-micro-batch call), each beside the model's and as their ratio. A fixed cost per
layer per micro-batch that the model lacks shows as a layer ratio that falls as the size grows,
and as a positive intercept of the line through the smallest and largest size's per-layer time.
Last, each size's deeper run against the composition from the base's size alone (its layer and
rest ratios times the model's at the other size): what the probe's composition leaves there.
CPU step times follow the machine's load: the load is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.config.parallel import ParallelConfig  # noqa: E402
from tuner.layout import ClusterLayout, TrialPaths  # noqa: E402
from tuner.models.rates import Rates, catalog_rates  # noqa: E402
from tuner.profile import probe  # noqa: E402
from tuner.profile.paired import paired_ratio  # noqa: E402
from tuner.profile.probe import ProbeRow  # noqa: E402
from tuner.profile.rates import study_rates  # noqa: E402
from tuner.profile.stack_terms import _time_parts  # noqa: E402
from tuner.space.enumerate import iter_configs, study_gpu, study_violations  # noqa: E402
from tuner.spec.file import load_study  # noqa: E402
from tuner.spec.study import StudySpec  # noqa: E402


def sizes(spec: StudySpec, point: int = 0) -> list[ParallelConfig]:
    """The config of the probe's run ``point`` (0: its base point; in the order ``tune profile
    --probe`` lists its runs) at every micro-batch size of the space (same other knobs)."""
    base = probe.probe_runs(spec)[point].config
    same = [c for c in iter_configs(spec) if dataclasses.replace(
        c, micro_batch_size=base.micro_batch_size).key() == base.key()]  # fmt: skip
    deep = max(probe.probe_depths(spec))
    ok = [c for c in same if not study_violations(c, probe.reduced(spec, c, deep))]
    return sorted(ok, key=lambda c: c.micro_batch_size)


def measure(
    spec: StudySpec, results: str, iters: int, points: tuple[int, ...] = (0,)
) -> list[ProbeRow]:
    """The runs, one job: each point's config at each size at both probe depths, ``iters``
    steps each (interleaved where the study's script runs the points in one process)."""
    from tuner.cli.lockcheck import refuse_stale_locks
    from tuner.study.launchers import make_executor

    depths = probe.probe_depths(spec)
    runs = [probe.ProbeRun(c, d) for p in points for c in sizes(spec, p) for d in depths]
    where = ClusterLayout(Path(results).resolve(), spec.cluster_name).stack_probe(spec.name)
    saved = probe.PROBE_ITERS
    probe.PROBE_ITERS = iters
    executor = make_executor(spec)
    try:  # a stale build lock: tune run's preflight line, not a job waiting on it forever
        if code := refuse_stale_locks(spec, executor, "probe_microbatch"):
            raise SystemExit(code)
        found = probe.run_stack_probe(spec, executor,
                                      TrialPaths(where.dir.with_suffix(".microbatch")),
                                      runs=runs)  # fmt: skip
    finally:
        executor.close()
        probe.PROBE_ITERS = saved
    return list(found.rows)


@dataclass(frozen=True, slots=True)
class Size:
    """What the runs at one micro-batch size measured, per micro-batch, beside the model's."""

    m: int
    layer: float
    layer_model: float
    rest: float
    rest_model: float


def per_size(
    spec: StudySpec, rates: Rates, rows: list[ProbeRow], point: int = 0
) -> tuple[dict[int, Size], dict[tuple[int, int], float]]:
    """(each size's figures, each run's step by (size, depth)): every run read as the base's
    1-layer run times their paired ratio; one layer's time per micro-batch is the two depths'
    difference less the model's step rest ``S`` at each, over ``m`` and the layers between
    (as :func:`tuner.profile.stack_terms._base_point` reads it), the rest what the 1-layer run
    holds besides that layer and ``S``."""
    lo, hi = probe.probe_depths(spec)
    configs = {c.key(): c for c in sizes(spec, point)}
    base = probe.probe_runs(spec)[0].config
    ref = next(r for r in rows if configs[r.key].micro_batch_size == base.micro_batch_size
               and r.depth == lo)  # fmt: skip
    level = statistics.median(ref.samples_s)
    step: dict[tuple[int, int], float] = {}
    for r in rows:
        q = paired_ratio(r, ref) if r is not ref else (1.0, 0.0)
        step[(configs[r.key].micro_batch_size, r.depth)] = level * q[0] if q else r.step_s
    per: dict[int, Size] = {}
    for c in configs.values():
        m, mbs = max(c.num_microbatches, 1), c.micro_batch_size
        (v1, s1, _), (v2, s2, _) = (_time_parts(spec, c, d, rates) for d in (lo, hi))
        layer = ((step[(mbs, hi)] - s2) - (step[(mbs, lo)] - s1)) / m / (hi - lo)
        model = (v2 - v1) / (hi - lo)
        rest = (step[(mbs, lo)] - s1) / m - lo * layer
        per[mbs] = Size(m, layer, model, rest, v1 - lo * model)
    return per, step


def fixed_part(per: dict[int, Size], model: bool = False) -> tuple[float, float]:
    """(seconds a sample, seconds fixed) of one layer per micro-batch: the line through the
    smallest and the largest size's per-layer time (``model``: the model's)."""
    a, b = min(per), max(per)
    ya, yb = (per[a].layer_model, per[b].layer_model) if model else (per[a].layer, per[b].layer)
    slope = (yb - ya) / (b - a)
    return slope, ya - a * slope


def report(spec: StudySpec, results: str, rows: list[ProbeRow], point: int = 0) -> list[str]:
    """The printed lines (see the module's docstring)."""
    rates = study_rates(spec, results) or catalog_rates(study_gpu(spec), spec.training.precision)
    hi = max(probe.probe_depths(spec))
    per, step = per_size(spec, rates, rows, point)
    out = [f"{'mbs':>3} {'m':>2}  {'layer/mb ms':>11} {'model':>7} {'ratio':>6}  "
           f"{'rest/mb ms':>10} {'model':>7} {'ratio':>6}"]  # fmt: skip
    for mbs, f in per.items():
        out.append(f"{mbs:>3} {f.m:>2}  {f.layer * 1e3:>11.2f} {f.layer_model * 1e3:>7.2f} "
                   f"{f.layer / f.layer_model:>6.3f}  {f.rest * 1e3:>10.2f} "
                   f"{f.rest_model * 1e3:>7.2f} {f.rest / f.rest_model:>6.3f}")  # fmt: skip
    lo = min(probe.probe_depths(spec))
    raw = {mbs: (step[(mbs, hi)] - step[(mbs, lo)]) / f.m / (hi - lo) for mbs, f in per.items()}
    out.append(
        "the depths' raw difference per layer per micro-batch (no model term taken "
        "out): " + ", ".join(f"mbs {k} {v * 1e3:.2f} ms" for k, v in raw.items())
    )
    (slope, fixed), own = fixed_part(per), fixed_part(per, model=True)[1]
    out.append(f"per-layer time through mbs {min(per)} and {max(per)}: {slope * 1e3:.2f} ms a "
               f"sample + {fixed * 1e3:.2f} ms fixed per layer per micro-batch (the model's, "
               f"through the same sizes: {own * 1e3:.2f} ms)")  # fmt: skip
    base = per[probe.probe_runs(spec)[0].config.micro_batch_size]
    k_lay, k_rest = base.layer / base.layer_model, base.rest / base.rest_model
    for c in sizes(spec, point):
        f = per[c.micro_batch_size]
        s2 = _time_parts(spec, c, hi, rates)[1]
        composed = f.m * (hi * k_lay * f.layer_model + k_rest * f.rest_model) + s2
        out.append(f"mbs {c.micro_batch_size} at {hi} layers: measured / composed from the "
                   f"base's size {step[(c.micro_batch_size, hi)] / composed:.3f}")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default="demo")
    parser.add_argument("--results", default="results")
    parser.add_argument("--iters", type=int, default=21)
    parser.add_argument("--point", type=int, nargs="+", default=[0], help="the probe's runs "
                        "whose configs are measured, in one job (0: the base; as tune profile "
                        "--probe lists them)")  # fmt: skip
    parser.add_argument("--save", metavar="FILE", help="keep the measured rows (json)")
    parser.add_argument("--rows", metavar="FILE", help="measure nothing: report saved rows")
    args = parser.parse_args(argv)
    spec = load_study(args.study)
    before = os.getloadavg()[0]
    if args.rows:
        rows = [ProbeRow(**{**r, "samples_s": tuple(r["samples_s"]), "rounds": tuple(r["rounds"])})
                for r in json.loads(Path(args.rows).read_text())["rows"]]  # fmt: skip
    else:
        rows = measure(spec, args.results, args.iters, tuple(args.point))
    if args.save:
        Path(args.save).write_text(json.dumps({"study": args.study, "rows": [
            {**dataclasses.asdict(r), "samples_s": list(r.samples_s), "rounds": list(r.rounds)}
            for r in rows]}, indent=1))  # fmt: skip
    for point in args.point:
        keys = {c.key() for c in sizes(spec, point)}
        print(f"point {point}: {probe.probe_runs(spec)[point].config.key()}")
        for line in report(spec, args.results, [r for r in rows if r.key in keys], point):
            print(line)
    if not args.rows:
        print(f"load (1-minute average) {before:.1f} at the start, {os.getloadavg()[0]:.1f} at "
              f"the end")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
