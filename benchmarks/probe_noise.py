"""How the framework probe's step-time noise reaches the composed step of every config of a study,
with the probe's deeper run at 2 layers per stage and at the depth it runs now.

    python benchmarks/probe_noise.py [--study demo] [--draws 150] [--sigma 0.02 0.03 0.04 0.05]

No machine is measured: the truth is a stand-in stack with a known per-layer surface (GEMMs at 60%
of the catalog's rate, streaming kernels at 70%, a per-micro-batch framework cost and three times
the catalog's fixed per-step work; sharded work by ZeRO stage x1.0, x1.8, x1.3, x1.5; a pipeline
engine's cost per schedule slot), the same kind as the probe's unit tests. Each probe row's step
is that surface at the row's depth times independent log-normal noise of ``sigma`` (what a CPU
probe's paired ratios leave: a median over five blocks of two rounds spread 2-5% on an idle
two-core machine, 5-15% under a load of 5-10); the terms are derived from the noisy rows and every
config of the study predicted at full depth. Printed per depth pair and sigma: over the draws,
the median and 10th percentile of the configs within 10% of the truth, the median worst error,
and the probe's summed step time (what its rounds cost) relative to the 2-layer probe's. At
sigma 0 what is left is the models' own structure against the stand-in's.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.config.parallel import ParallelConfig  # noqa: E402
from tuner.models.rates import Rates, catalog_rates  # noqa: E402
from tuner.models.time.estimate import estimate_time  # noqa: E402
from tuner.profile import probe  # noqa: E402
from tuner.profile.probe import ProbeRow, probe_runs  # noqa: E402
from tuner.profile.stack_terms import derive_terms  # noqa: E402
from tuner.space.enumerate import iter_configs, study_gpu, study_violations  # noqa: E402
from tuner.spec.file import load_study  # noqa: E402
from tuner.spec.study import StudySpec  # noqa: E402

SHARDED_WORK = {0: 1.0, 1: 1.8, 2: 1.3, 3: 1.5}
PIPE_SLOT_S = 0.03


def standin_rates(spec: StudySpec) -> Rates:
    """The stand-in's true speeds against the catalog's."""
    base = catalog_rates(study_gpu(spec), spec.training.precision)
    return dataclasses.replace(base, gemm=base.gemm * 0.6, gemm16=base.gemm16 * 0.6,
                               hbm=base.hbm * 0.7, microbatch_overhead=0.004,
                               step_overhead=base.step_overhead * 3.0)  # fmt: skip


def true_step(spec: StudySpec, c: ParallelConfig, layers: int) -> float:
    """The stand-in's step of ``c`` at ``layers`` layers in all."""
    model = dataclasses.replace(spec.model, num_layers=layers)
    t = estimate_time(model, spec.training, c, study_gpu(spec), spec.cluster.gpus_per_node,
                      spec.framework, standin_rates(spec))  # fmt: skip
    pipe = (max(c.num_microbatches, 1) + c.pp - 1) * PIPE_SLOT_S if c.pp > 1 else 0.0
    return t.step + (SHARDED_WORK.get(c.zero_stage, 1.0) - 1) * (t.dp_comm + t.optimizer) + pipe


def trial(spec: StudySpec, deep: int, sigma: float, draws: int) -> tuple[list[int], list[float],
                                                                         float]:  # fmt: skip
    """(configs within 10% per draw, worst error per draw, the probe's summed step time)."""
    saved = probe.DEEP_MAX
    probe.DEEP_MAX = deep
    try:
        runs = probe_runs(spec)
    finally:
        probe.DEEP_MAX = saved
    gpu, gpn = study_gpu(spec), spec.cluster.gpus_per_node
    rates = catalog_rates(gpu, spec.training.precision)
    configs = [c for c in iter_configs(spec) if not study_violations(c, spec)]
    truth = [true_step(spec, c, spec.model.num_layers) for c in configs]
    exact = [ProbeRow(key=r.launched.key(), depth=r.depth,
                      step_s=true_step(spec, r.launched, r.depth * r.config.pp * r.config.vp),
                      samples_s=(1.0, 1.0, 1.0), peak_gib=0.05, reserved_gib=None)
             for r in runs]  # fmt: skip
    rng = random.Random(1)
    inside, worst = [], []
    for _ in range(draws):
        rows = [dataclasses.replace(r, step_s=r.step_s * rng.lognormvariate(0.0, sigma))
                for r in exact]  # fmt: skip
        terms = derive_terms(spec, rows, rates)
        errors = [abs(estimate_time(spec.model, spec.training, c, gpu, gpn, spec.framework, rates,
                                    terms=terms).step / t - 1)
                  for c, t in zip(configs, truth, strict=True)]  # fmt: skip
        inside.append(sum(e <= 0.10 for e in errors))
        worst.append(max(errors))
    return inside, worst, sum(r.step_s for r in exact)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default="demo")
    parser.add_argument("--draws", type=int, default=150)
    parser.add_argument("--sigma", type=float, nargs="+", default=[0.0, 0.02, 0.03, 0.04, 0.05])
    args = parser.parse_args(argv)
    spec = load_study(args.study)
    now = probe.probe_depths(spec)
    pairs = sorted({2, now[1]})
    n = sum(1 for c in iter_configs(spec) if not study_violations(c, spec))
    print(f"{args.study}: {n} configs at {spec.model.num_layers} layers, composed from probes at "
          f"1 and {' or '.join(map(str, pairs))} layers, {args.draws} draws each")  # fmt: skip
    print(f"{'depths':<8} {'sigma':>5}  {'within 10% (median, p10)':>25}  {'worst (median)':>14}"
          f"  {'probe steps':>11}")  # fmt: skip
    cost2 = None
    for sigma in args.sigma:
        for deep in pairs:
            inside, worst, cost = trial(spec, deep, sigma, args.draws if sigma > 0 else 1)
            cost2 = cost if deep == 2 else cost2
            p10, rel = sorted(inside)[len(inside) // 10], cost / (cost2 or cost)
            print(f"(1, {deep})  {sigma:5.0%}  {statistics.median(inside):>18.0f}, {p10:>4}  "
                  f"{statistics.median(worst):>14.3f}  x{rel:>10.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
