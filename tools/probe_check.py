"""How well the framework probe predicted a study's trials: measured / predicted per config.

    python tools/probe_check.py --study demo [--results results]

For every measured trial of the study: its config, whether the probe ran that config (at its
two depths; ``-`` = kept out of everything the probe ran), and measured / predicted step time and
peak memory, where the prediction is the models' with the saved probe's terms (what the study's
screen recorded before the trial ran, unrounded) and, beside it, the catalog's alone. Then the
range of each ratio. The demos (``make demo``, ``make demo-moe``, ``make demo-ssh``) print it
after their trials.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def rows(study: str, results: str) -> list[dict[str, Any]]:
    """One dict per measured trial: the config's spelling, probed or not, and the ratios."""
    from tuner.api import estimate
    from tuner.config.parallel import ParallelConfig
    from tuner.config.spelling import spell
    from tuner.models.memory.estimate import GIB
    from tuner.profile.probe import probe_runs
    from tuner.profile.rates import study_rates
    from tuner.profile.recorded import study_with_profile
    from tuner.profile.stack_terms import study_terms
    from tuner.report.leaderboard import load_optuna_study

    spec = study_with_profile(study, results)  # as tune run read it
    rates = study_rates(spec, results)
    terms = study_terms(spec, results, rates)
    probed = {r.config.key() for r in probe_runs(spec)}
    out = []
    for t in load_optuna_study(spec, None, results).get_trials(deepcopy=False):
        a = t.user_attrs
        if not a.get("config") or a.get("step_time_s") is None or not a.get("peak_memory_gib"):
            continue
        c = ParallelConfig(**a["config"])
        with_probe = estimate(spec, c, rates=rates, terms=terms)
        catalog = estimate(spec, c, rates=rates)
        assert with_probe.time and with_probe.memory and catalog.time and catalog.memory
        step, peak = float(a["step_time_s"]), float(a["peak_memory_gib"]) * GIB
        out.append({
            "trial": t.number, "config": spell(c), "probed": c.key() in probed,
            "step": step / with_probe.time.step, "peak": peak / with_probe.memory.peak,
            "catalog_step": step / catalog.time.step, "catalog_peak": peak / catalog.memory.peak,
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--results", default="results")
    args = parser.parse_args(argv)
    from tuner.cli import render
    from tuner.profile.probe import probe_depths
    from tuner.spec.file import load_study

    found = rows(args.study, args.results)
    if not found:
        print(f"{args.study}: no measured trial to check")
        return 0
    spec = load_study(args.study)
    low, high = probe_depths(spec)
    out = render.console()  # the tables' own layout: a terminal's width, plain in a file
    figures = (("step", "step"), ("peak", "peak"), ("catalog_step", "catalog\nstep"),
               ("catalog_peak", "catalog\npeak"))  # fmt: skip
    render.render(out, render.Grid(
        title=f"measured / predicted before any trial, {args.study} (probe: the probe ran that "
        f"config, at {low} and {high} layers; -: kept out of the probe)",
        columns=(render.Column(name="trial", header="trial"), render.CONFIG,
                 render.Column(name="probe", header="probe"),
                 *(render.Column(name=k, header=h) for k, h in figures)),
        rows=tuple((str(r["trial"]), r["config"], "yes" if r["probed"] else "-",
                    *(f"{r[k]:.3f}" for k, _ in figures))
                   for r in sorted(found, key=lambda r: r["trial"])),
        choosable=False,
    ))  # fmt: skip
    for name, key in (("step", "step"), ("peak", "peak")):
        values = [r[key] for r in found]
        kept = [r[key] for r in found if not r["probed"]]
        tail = f" (kept out: {min(kept):.3f}-{max(kept):.3f})" if kept else ""
        out.print(f"{name} measured / predicted: {min(values):.3f}-{max(values):.3f}{tail}")
    if spec.cluster.gpu == "cpu":
        out.print(CPU_PEAK_NOTE)
    return 0


CPU_PEAK_NOTE = (
    "peak on CPU: both sides are one tensor accounting (the workload's parameters, gradients, "
    "optimizer states and saved activations; no allocator, so nothing transient), and the "
    "probe read its terms off that same accounting at reduced depth, which adds up layer by "
    "layer as the memory model composes it: a probed config reads 1.000, one kept out near it. "
    "This checks the composition, not how near a GPU's allocator peak would come."
)
"""Why the CPU demos' peaks read 1.000 (``workloads/gpt_deepspeed_train.py``: on CPU the
measured peak is the ``tuner-memory`` accounting; ``tuner.models.memory.estimate``: the model
counts the same tensors by views there)."""


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
