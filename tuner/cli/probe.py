"""``tune profile --probe``: the framework probe at reduced depth (tuner.profile.probe), its
table, its cost, and where ``tune estimate``'s terms came from."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from rich.table import Table

from tuner.cli.tables import _console, _emit_json
from tuner.spec.study import StudySpec


def run_probe(spec: StudySpec, layout: Any, args: argparse.Namespace) -> int:
    """Run (or with ``--show`` read) the study's framework probe; print its terms and cost."""
    from tuner.profile.probe import ProbeResult, run_stack_probe
    from tuner.profile.rates import study_rates
    from tuner.profile.stack_terms import load_probe, save_probe, study_terms
    from tuner.study.loop import make_executor

    path = layout.stack_yaml(spec.name)
    if not args.show:
        executor = make_executor(spec)
        try:
            result: ProbeResult = run_stack_probe(spec, executor, layout.stack_probe(spec.name))
        finally:
            executor.close()
        save_probe(spec, result, path, dt.datetime.now(dt.UTC))
    terms = study_terms(spec, args.results, study_rates(spec, args.results))  # checked
    data = load_probe(path)
    cost = data["cost"]
    if args.format == "json":
        _emit_json({"path": str(path), "cost": cost, "versions": data["versions"],
                    "rows": [_plain(r) for r in data["rows"]],
                    "points": [_plain(p) for p in terms.points]})  # fmt: skip
        return 0
    console = _console()
    table = Table(title=f"framework probe of {spec.name}: {len(data['rows'])} runs at reduced "
                  f"depth, one job, {data['created']}")  # fmt: skip
    for name in ("point", "layers", "step s", "spread", "peak GiB"):
        table.add_column(name, justify="left" if name == "point" else "right")
    for r in data["rows"]:
        table.add_row(r.key, str(r.depth), f"{r.step_s:.4g}", f"{_spread(r.samples_s):.1%}",
                      f"{r.peak_gib:.4g}")  # fmt: skip
    console.print(table)
    terms_table = Table(title="measured / catalog, per probed point (the models compose these)")
    for name in ("point", "layer time", "rest per micro-batch", "sharded work", "step overhead",
                 "layer activations", "extras", "states", "time spread"):  # fmt: skip
        terms_table.add_column(name, justify="left" if name == "point" else "right")
    for p in terms.points:
        scales = (p.layer_scale, p.fixed_scale, p.step_scale, p.overhead_scale,
                  p.activation_scale, p.extras_scale, p.states_scale)  # fmt: skip
        terms_table.add_row(p.label, *(_x(v) for v in scales), f"{p.time_spread:.1%}")
    console.print(terms_table)
    versions = ", ".join(f"{k} {v}" for k, v in data["versions"].items())
    console.print(f"stack: {versions or 'versions not reported'}")
    console.print(f"probe cost: {cost['wall_s'] / 60:.2f} min on {cost['nodes']} node(s), "
                  f"{cost['node_hours']:.4f} node-hours")  # fmt: skip
    console.print(f"saved: {path}")
    return 0


def _x(value: float | None) -> str:
    return "catalog" if value is None else f"x{value:.3f}"


def _spread(samples: Any) -> float:
    from tuner.profile.probe import spread

    return spread(samples)


def _plain(obj: Any) -> dict[str, Any]:
    import dataclasses

    out: dict[str, Any] = dataclasses.asdict(obj)
    return out


def source_lines(spec: StudySpec, config: Any, terms: Any) -> list[str]:
    """``tune estimate``'s lines saying where each term came from."""
    if terms.is_catalog:
        return [f"terms: all from the catalog (tune profile --study {spec.name} --probe measures "
                "this stack's per-layer time, activations and extras)"]  # fmt: skip
    out = []
    for s in terms.sources(config):
        where = f" at {s.point}, spread {s.spread:.1%}" if s.source == "measured" else ""
        out.append(f"  {s.term}: {s.source}{where}")
    return ["terms (measured: the framework probe; catalog: the models' own):", *out]
