"""Hold the memory and time models to real runs of a study: a CSV and the errors.

    python benchmarks/validate_models.py --study demo [--results DIR] [--force-oom 2]
                                         [--csv benchmarks/results/demo.csv]

1. ``tune run`` the study (resumed if its results exist).
2. Launch ``--force-oom`` configs the memory model predicts to run out of memory, outside the
   study (the closest to the limit first), to see whether they really do.
3. Write one CSV row per run: the config, predicted and measured peak memory (allocated, which
   ``torch.cuda.max_memory_allocated`` reports, and reserved) and step time, the outcome, the
   GPU and the versions. Print the median and max memory and step-time errors, and which forced
   configs really ran out of memory.

On a CPU study (``gpu: cpu``) the per-rank budget is a made-up number, so a forced config runs
instead of failing: the report says so rather than counting it as a miss.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from tuner.cli.lockcheck import refuse_stale_locks
from tuner.config.parallel import ParallelConfig
from tuner.launch import NodeGroup
from tuner.layout import ResultsLayout
from tuner.models.memory.estimate import GIB, estimate_memory
from tuner.models.time.estimate import estimate_time
from tuner.outcome import Outcome
from tuner.report.leaderboard import load_optuna_study
from tuner.space.enumerate import enumerate_space, study_gpu
from tuner.space.trials import trial_outcome
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec
from tuner.study.build import build_loop
from tuner.study.launchers import make_executor, template_launcher
from tuner.study.record import parse_result

FIELDS = [
    "source", "trial", "config", "tp", "pp", "dp", "micro_batch", "recompute", "zero_stage",
    "outcome", "predicted_allocated_gib", "measured_allocated_gib", "predicted_peak_gib",
    "measured_reserved_gib", "predicted_step_s", "measured_step_s", "gpu", "versions",
]  # fmt: skip


def versions() -> str:
    """The versions that decide memory: python, torch, deepspeed, this tuner."""
    out = [f"python {platform.python_version()}"]
    for name in ("torch", "deepspeed", "tuner"):
        try:
            out.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return "; ".join(out)


def predictions(spec: StudySpec, c: ParallelConfig) -> dict[str, float]:
    gpu = study_gpu(spec)
    m = estimate_memory(spec.model, c, gpu, spec.framework, spec.training.precision)
    t = estimate_time(spec.model, spec.training, c, gpu, spec.cluster.gpus_per_node,
                      spec.framework)  # fmt: skip
    return {"predicted_allocated_gib": m.allocated / GIB, "predicted_peak_gib": m.peak / GIB,
            "predicted_step_s": t.step}  # fmt: skip


def row(spec: StudySpec, source: str, number: int, c: ParallelConfig, outcome: str,
        measured: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    return {
        "source": source, "trial": number, "config": c.key(), "tp": c.tp, "pp": c.pp,
        "dp": c.dp, "micro_batch": c.micro_batch_size, "recompute": c.recompute,
        "zero_stage": c.zero_stage, "outcome": outcome, **predictions(spec, c),
        "measured_allocated_gib": measured.get("peak_memory_gib"),
        "measured_reserved_gib": measured.get("peak_reserved_gib"),
        "measured_step_s": measured.get("step_time_s"), "gpu": study_gpu(spec).name,
        "versions": versions(),
    }  # fmt: skip


def study_rows(spec: StudySpec, results: str) -> list[dict[str, Any]]:
    """Every launched trial of the study that ran or really ran out of memory."""
    rows = []
    for t in load_optuna_study(spec, None, results).get_trials(deepcopy=False):
        outcome = trial_outcome(t)
        if not t.user_attrs.get("launched") or outcome not in (Outcome.OK, Outcome.OOM):
            continue
        config = ParallelConfig(**t.user_attrs["config"])
        rows.append(row(spec, "study", t.number, config, str(outcome), dict(t.user_attrs)))
    return rows


def forced_rows(spec: StudySpec, results: str, n: int) -> list[dict[str, Any]]:
    """Launch the ``n`` predicted-OOM configs closest to the limit, outside the study."""
    oom = sorted(enumerate_space(spec, keep_oom=True).oom, key=lambda c: c.memory.peak)[:n]
    layout = ResultsLayout(Path(results).resolve(), f"{spec.name}-forced-oom")
    executor = make_executor(spec)
    hosts = spec.node_names[: spec.nodes_per_trial]
    group = NodeGroup(0, hosts, executor.master_port(hosts, spec.launch.master_port))
    rows = []
    try:
        for k, cand in enumerate(oom):
            paths = layout.trial(k)
            paths.dir.mkdir(parents=True, exist_ok=True)
            request = template_launcher(spec, cand.config, k, group, paths,
                                        executor.master_addr(hosts))  # fmt: skip
            m = parse_result(spec, executor.submit(request).wait())
            measured = {
                "peak_memory_gib": m.peak_memory_gib,
                "peak_reserved_gib": m.peak_reserved_gib,
                "step_time_s": m.step_time_s,
            }
            rows.append(row(spec, "forced", k, cand.config, str(m.outcome), measured))
    finally:
        executor.close()
    return rows


def _error(predicted: Any, measured: Any) -> float | None:
    if not predicted or not measured:
        return None
    return float(predicted) / float(measured) - 1.0


def report(spec: StudySpec, rows: list[dict[str, Any]]) -> None:
    ran = [r for r in rows if r["source"] == "study" and r["outcome"] == str(Outcome.OK)]
    pairs = [(r["predicted_allocated_gib"], r["measured_allocated_gib"]) for r in ran]
    memory = [e for p, m in pairs if (e := _error(p, m)) is not None]
    pairs = [(r["predicted_step_s"], r["measured_step_s"]) for r in ran]
    step = [e for p, m in pairs if (e := _error(p, m)) is not None]
    for r in ran:
        mem = _error(r["predicted_allocated_gib"], r["measured_allocated_gib"])
        print(f"  {r['config']}: memory predicted {r['predicted_allocated_gib']:.4g} GiB, "
              f"measured {r['measured_allocated_gib']:.4g} GiB ({mem:+.1%}); step predicted "
              f"{r['predicted_step_s']:.4g} s, measured {r['measured_step_s']:.4g} s")  # fmt: skip
    if memory:
        print(f"memory (allocated), {len(memory)} runs: median |error| "
              f"{statistics.median(abs(e) for e in memory):.1%}, max "
              f"{max(memory, key=abs):+.1%}")  # fmt: skip
    if step:
        print(
            f"step time, {len(step)} runs: median |error| "
            f"{statistics.median(abs(e) for e in step):.1%}, max {max(step, key=abs):+.1%}"
        )
    real_oom = [r for r in rows if r["source"] == "study" and r["outcome"] == str(Outcome.OOM)]
    if real_oom:
        print(f"{len(real_oom)} study runs really ran out of memory although predicted to fit:")
        for r in real_oom:
            print(f"  {r['config']} (predicted peak {r['predicted_peak_gib']:.4g} GiB)")
    for r in (r for r in rows if r["source"] == "forced"):
        verdict = "ran out of memory, as predicted" if r["outcome"] == str(Outcome.OOM) else (
            "ran (a CPU study's budget is not a real limit)" if spec.cluster.gpu == "cpu"
            else "did NOT run out of memory: the model is pessimistic here"
        )  # fmt: skip
        print(
            f"forced {r['config']} (predicted peak {r['predicted_peak_gib']:.4g} GiB): "
            f"{r['outcome']}: {verdict}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--results", default="results")
    parser.add_argument("--force-oom", type=int, default=2, metavar="N")
    parser.add_argument("--csv", help="default: benchmarks/results/<study>.csv")
    args = parser.parse_args()
    spec = load_study(args.study)
    executor = make_executor(spec)  # a stale build lock: tune run's preflight line, not trials
    if code := refuse_stale_locks(spec, executor, "validate_models"):  # waiting on it forever
        executor.close()
        return code
    loop = build_loop(spec, results=args.results, executor=executor)
    try:
        loop.run()
    finally:
        loop.executor.close()
    rows = study_rows(spec, args.results) + forced_rows(spec, args.results, args.force_oom)
    out = Path(args.csv or Path(__file__).parent / "results" / f"{spec.name}.csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows -> {out}")
    report(spec, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
