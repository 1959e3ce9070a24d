"""``tune profile --probe``: the framework probe at reduced depth (tuner.profile.probe), its
table, its cost, and where ``tune estimate``'s terms came from."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from tuner.cli import render
from tuner.cli.render import Column, Grid
from tuner.cli.tables import _console, _emit_json, wrote
from tuner.report import units
from tuner.spec.study import StudySpec


def run_probe(spec: StudySpec, layout: Any, args: argparse.Namespace) -> int:
    """Run (or with ``--show`` read) the study's framework probe; print its terms and cost."""
    from tuner.cli.lockcheck import refuse_stale_locks
    from tuner.profile.probe import ProbeResult, run_stack_probe
    from tuner.profile.probe_file import load_probe, save_probe
    from tuner.profile.rates import study_rates
    from tuner.profile.stack_terms import study_terms
    from tuner.study.launchers import make_executor

    path = layout.stack_yaml(spec.name)
    rates = study_rates(spec, args.results)
    if not args.show:
        executor = make_executor(spec)
        try:  # a stale build lock: tune run's preflight line, not a probe waiting on it forever
            if code := refuse_stale_locks(spec, executor):
                return code
            result: ProbeResult = run_stack_probe(spec, executor, layout.stack_probe(spec.name),
                                                  rates=rates)  # fmt: skip
        finally:
            executor.close()
        save_probe(spec, result, path, dt.datetime.now(dt.UTC))
    data = load_probe(path, spec)  # none yet (--show): says the command that measures it
    terms = study_terms(spec, args.results, rates)  # checked
    cost = data["cost"]
    if args.format == "json":
        _emit_json({"path": str(path), "cost": cost, "versions": data["versions"],
                    "rows": [_plain(r) for r in data["rows"]],
                    "points": [_plain(p) for p in terms.points]})  # fmt: skip
        return 0
    console = _console()
    render.render(console, runs_grid(spec, data))
    render.render(console, terms_grid(terms.points, spec.framework))
    versions = ", ".join(f"{k} {v}" for k, v in data["versions"].items())
    console.print(f"stack: {versions or 'versions not reported'}")
    for line in recheck_lines(spec, data["rows"]):
        console.print(line)
    again, rechecked = cost.get("recheck_s", 0.0), sum(1 for r in data["rows"] if r.rechecked)
    extra = (f" ({units.duration(again)} of it measuring {rechecked} point(s) again)"
             if rechecked else f" (nothing measured again; the verdict took "
             f"{units.duration(again)})" if again else "")  # fmt: skip
    console.print(f"probe cost: {units.duration(cost['wall_s'])} on {cost['nodes']} node(s), "
                  f"{cost['node_hours']:.4f} node-hours{extra}")  # fmt: skip
    console.print(wrote("profile --probe", [path]))
    return 0


def recheck_lines(spec: StudySpec, rows: Any) -> list[str]:
    """What the probe measured again and why, and which points are still uncertain (the terms
    they give carry both runs' spread): :mod:`tuner.profile.recheck`."""
    from tuner.config.spelling import split_constant
    from tuner.profile.recheck import terms_of
    from tuner.profile.stack_terms import probe_configs

    if not any(r.rechecked for r in rows):
        return []
    configs, wides = probe_configs(spec, {r.key for r in rows})
    _, labels = split_constant([configs[r.key] for r in rows], spec.framework)
    out = []
    for k, (label, r) in enumerate(zip(labels, rows, strict=True)):
        if r.rechecked:
            name = f"{label or 'the base point'} at {r.depth} layer(s)"
            out.append(f"measured again: {name}: {r.rechecked}")
            if r.uncertain:
                terms = terms_of(rows, k, configs, wides)
                out.append(f"  uncertain: {r.uncertain}; what it gives ({terms}) states both "
                           f"runs' spread")  # fmt: skip
    return out


RUN_COLUMNS = (
    Column(name="point", header="point", right=False, wrap=2,
           meaning="the probed config's key fields that differ between runs"),
    Column(name="layers", header="layers", meaning="layers per stage the run had"),
    Column(name="step_s", header="step s", meaning="the run's steady step time"),
    Column(name="spread", header="spread", meaning="its samples' relative spread"),
    Column(name="peak_gib", header="peak GiB", meaning="its peak memory"),
)  # fmt: skip
TERM_COLUMNS = (
    Column(name="point", header="point", right=False, wrap=2),
    Column(name="layer_time", header="layer\ntime"),
    Column(name="rest", header="rest per\nmicro-b."),
    Column(name="sharded", header="sharded\nwork"),
    Column(name="overhead", header="step\noverhead"),
    Column(name="activations", header="layer\nacts"),
    Column(name="extras", header="extras"),
    Column(name="states", header="states"),
    Column(name="spread", header="time\nspread", minor=True),
)  # fmt: skip
CATALOG_CELL = "-"
"""A term the point did not measure: the catalog's (said under the table)."""
NIL_CELL = "nil"
"""A term the point measured at or under nothing, which the models then take as none (said under
the table; :func:`tuner.profile.stack_terms._part_ratio`): it read "x0.000", like a bug."""


def runs_grid(spec: StudySpec, data: dict[str, Any]) -> Grid:
    """The probe's runs, one row each, spelled as every table spells a config
    (:func:`tuner.config.spelling.split_constant`; the rows' keys said ``tp=1 pp=2 gbs=16``
    beside the terms' ``tp1 mbs2``)."""
    from tuner.config.spelling import split_constant
    from tuner.profile.stack_terms import probe_configs

    rows = data["rows"]
    configs, _ = probe_configs(spec, {r.key for r in rows})  # found: the probe was checked
    same, points = split_constant([configs[r.key] for r in rows], spec.framework)
    return Grid(
        title=f"framework probe of {spec.name}: {len(rows)} runs at reduced depth, one job, "
        f"{data['created']}",
        columns=RUN_COLUMNS, constant=same, choosable=False,
        rows=tuple((p or "the base point", str(r.depth), units.seconds(r.step_s),
                    f"{_spread(r.samples_s):.1%}", units.gib(r.peak_gib))
                   for p, r in zip(points, rows, strict=True)),
    )  # fmt: skip


def terms_grid(points: Any, framework: str | None = None) -> Grid:
    """The terms each probed point measured, as measured / the catalog's figure; the points
    spelled as :func:`runs_grid` spells the runs (their knobs: :data:`POINT_KNOBS`)."""
    from tuner.config.spelling import split_constant
    from tuner.models.stack import POINT_KNOBS

    shared, labels = split_constant([p.config for p in points], framework, POINT_KNOBS)
    rows = []
    for p, label in zip(points, labels, strict=True):
        scales = (p.layer_scale, p.fixed_scale, p.step_scale, p.overhead_scale,
                  p.activation_scale, p.extras_scale, p.states_scale)  # fmt: skip
        rows.append((label or "base", *(_x(v) for v in scales), f"{p.time_spread:.1%}"))
    return Grid(
        title="measured / catalog, per probed point (the models compose these)",
        columns=TERM_COLUMNS, rows=tuple(rows), constant=shared, choosable=False,
        notes=(f"{CATALOG_CELL}: not measured at that point, the catalog's figure",
               *_nil_note(rows), *_expert_note(points)),
    )  # fmt: skip


def _nil_note(rows: list[tuple[str, ...]]) -> tuple[str, ...]:
    """What a nil cell means, where the table has one."""
    if not any(NIL_CELL in row for row in rows):
        return ()
    return (f"{NIL_CELL}: what the runs left for that term after the others was at or under "
            "nothing (their noise, or a part the model counts that the run did not hold); the "
            "models take it as none",)  # fmt: skip


def _expert_note(points: Any) -> tuple[str, ...]:
    """The MoE layer's fixed part per expert call by EP degree, where the probe measured one
    (the base at two sizes; an EP neighbour over the base's slope)."""
    fixed = {p.ep: p.expert_fixed_s for p in points if p.expert_fixed_s is not None}
    if not fixed:
        return ()
    ms = ", ".join(f"ep {ep} {f * 1e3:.2f}" for ep, f in sorted(fixed.items()))
    return (f"an MoE layer's expert calls: {ms} ms each per micro-batch whatever its tokens "
            f"(the layer at two micro-batch sizes; another EP degree: its layer over that "
            f"slope), the layer scale beside it",)  # fmt: skip


def _x(value: float | None) -> str:
    if value is None:
        return CATALOG_CELL
    return NIL_CELL if value == 0.0 else f"x{value:.3f}"


def _spread(samples: Any) -> float:
    from tuner.profile.paired import spread

    return spread(samples)


def _plain(obj: Any) -> dict[str, Any]:
    import dataclasses

    out: dict[str, Any] = dataclasses.asdict(obj)
    return out


def source_lines(spec: StudySpec, config: Any, terms: Any) -> list[str]:
    """``tune estimate``'s lines saying where each term came from."""
    if terms.is_catalog:
        return [f"terms: all from the catalog ({spec.profile_command} --probe "
                "measures this stack's per-layer time, activations and extras)"]  # fmt: skip
    out = []
    for s in terms.sources(config):
        where = f" at {s.point}, spread {s.spread:.1%}" if s.source == "measured" else ""
        where += f" (the point {s.point}: {s.note})" if s.note else ""
        out.append(f"  {s.term}: {s.source}{where}")
    return ["terms (measured: the framework probe; catalog: the models' own):", *out]
