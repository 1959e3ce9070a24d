"""How well a step measured at fewer micro-batches predicts the full step, for real on CPUs.

``search.fewer_microbatches`` (``tuner.space.shorten``) measures a config too slow for the time
limit at fewer micro-batches per step and extrapolates its full step with
``tuner.models.time.proxy.extrapolate``. This runs the CPU demo's small GPT
(``studies/demo.yaml``: DeepSpeed, 2 CPU ranks on one node, gloo) through ``tune run`` as a
user would, one config at a time, at ``--measured`` and at ``--full`` micro-batches per step
(``--repeats`` runs of each, taking turns; their median), and prints per config both measured
steps, the extrapolated full step, its error, and the
error of the naive rule (the measured step times full / measured micro-batches). Configs: pp 1
(dp 2: the per-step gradient all-reduce and optimizer step) and pp 2 (dp 1: the pipeline's fill
and drain). Catalog CPU rates, or the cluster profile's when ``tune profile`` saved one under
``results/``. Takes a few minutes; run it under the machine's heavy-job lock.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tuner.config.parallel import ParallelConfig
from tuner.models.time.proxy import extrapolate
from tuner.profile.rates import study_rates
from tuner.report.leaderboard import leaderboard
from tuner.space.enumerate import study_gpu
from tuner.spec.file import load_study

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ({"pp": 1, "dp": 2}, {"pp": 2, "dp": 1})
"""The configs measured (micro-batch 1, ZeRO 0, no recomputation)."""


def _study(base: dict[str, Any], name: str, pp: int, gbs: int, iters: int) -> dict[str, Any]:
    data = dict(base, name=name)
    data["training"] = dict(base["training"], global_batch_size=gbs)
    data["space"] = {"pp": [pp], "micro_batch_size": [1], "zero_stage": [0],
                     "recompute": ["none"]}  # fmt: skip
    data["search"] = dict(base["search"], n_trials=1, trial_timeout_min=20, memory_probes=0)
    launch = dict(base["launch"], train_iters=iters,
                  script=str(ROOT / "workloads" / "gpt_deepspeed.py"),
                  python=str(ROOT / ".venv" / "bin" / "python"))  # fmt: skip
    launch["env"] = dict(launch.get("env") or {}, TORCH_EXTENSIONS_DIR=str(ROOT / ".torch_ext"))
    data["launch"] = launch
    data["cluster"] = dict(base["cluster"], gpu_memory_gib=4.0)  # no memory pruning here
    return data


def _measure(path: Path, results: Path) -> float:
    tune = str(ROOT / ".venv" / "bin" / "tune")
    subprocess.run([tune, "run", "--study", str(path), "--results", str(results), "--quiet"],
                   check=True, cwd=ROOT)  # fmt: skip
    board = leaderboard(load_study(str(path)), results=str(results))
    return float(board.iloc[0].measured_step_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measured", type=int, default=2, help="micro-batches measured")
    parser.add_argument("--full", type=int, default=8, help="micro-batches of the full step")
    parser.add_argument("--iters", type=int, default=14, help="train_iters of each run")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each point, taking turns")
    args = parser.parse_args()
    base = yaml.safe_load((ROOT / "studies" / "demo.yaml").read_text())
    counts = (args.measured, args.full)
    runs: dict[tuple[int, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="microbatch-demo-") as tmp:
        work = Path(tmp)
        for r in range(args.repeats):  # the points take turns: a load change hits all of them
            for c in CONFIGS:
                for m in counts:
                    name = f"mb-demo-pp{c['pp']}-m{m}-r{r}"
                    path = work / f"{name}.yaml"
                    path.write_text(yaml.safe_dump(
                        _study(base, name, c["pp"], m * c["dp"], args.iters)))  # fmt: skip
                    runs.setdefault((c["pp"], m), []).append(_measure(path, work / "results"))
        spec = load_study(str(path))
    for c in CONFIGS:
        steps = {m: statistics.median(runs[c["pp"], m]) for m in counts}
        full = ParallelConfig(pp=c["pp"], dp=c["dp"], micro_batch_size=1,
                              global_batch_size=args.full * c["dp"])  # fmt: skip
        measured = dataclasses.replace(full, global_batch_size=args.measured * c["dp"])
        rates = study_rates(spec, str(ROOT / "results"))
        found = extrapolate(spec.model, spec.training, full, measured, steps[args.measured],
                            study_gpu(spec), spec.cluster.gpus_per_node, spec.framework,
                            rates)  # fmt: skip
        true = steps[args.full]
        naive = steps[args.measured] * args.full / args.measured
        each = "; ".join(f"m {m}: " + ", ".join(f"{v:.3f}" for v in runs[c["pp"], m])
                         for m in counts)  # fmt: skip
        print(f"pp {c['pp']} dp {c['dp']} ({'profile' if rates else 'catalog'} rates; runs "
              f"{each} s): m {args.measured} measured {steps[args.measured]:.4f} s, "
              f"m {args.full} measured {true:.4f} s, extrapolated {found.step_s:.4f} s, error "
              f"{100 * (found.step_s / true - 1):+.1f} % (naive x{args.full}/{args.measured}: "
              f"{100 * (naive / true - 1):+.1f} %; scale {found.scale:.2f})")  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
