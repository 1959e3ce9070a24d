"""``tune profile`` and ``tune calibrate``, and the calibrated lines of ``space``, ``estimate``
and ``run --dry-run``. Registered by :mod:`tuner.cli.commands`; thin like it: parse, call,
print."""

from __future__ import annotations

import argparse
import dataclasses
import glob
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.cli import help_text, render
from tuner.cli.calibration_tables import (
    FACTOR_COLUMNS,
    TRIAL_COLUMNS,
    loo_json,
    print_corrections,
)
from tuner.cli.options import STUDY_HELP, whole, wholes
from tuner.cli.tables import _console, _emit_json, wrote
from tuner.config.spelling import split_constant
from tuner.errors import ConfigError
from tuner.report import units
from tuner.spec.bounds import MAX_REPEATS
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec

if TYPE_CHECKING:
    from tuner.layout import ClusterLayout

Handlers = dict[str, Any]


# ----------------------------------------------------------------------------- profile


def cluster_study(path: str) -> StudySpec:
    """A cluster file (``cluster:``, ``model:``, optional ``launch:``, ``training:``,
    ``space:``) as a study, so its cluster can be profiled for that model. A study file works
    too."""
    from tuner.spec.file import read_yaml, study_from_mapping

    file = Path(path)
    raw = read_yaml(file, "the cluster file", shown=path)
    if not isinstance(raw, dict) or "cluster" not in raw:
        raise ConfigError("a cluster file needs a cluster: section", file=path)
    if "model" not in raw:
        raise ConfigError("required field is missing: the model whose GEMM shapes are "
                          "measured (for example model: {preset: llama3-8b})", path="model",
                          file=path)  # fmt: skip
    data = dict(raw)
    data.setdefault("name", "profile")
    data.setdefault("framework", "megatron")
    data["launch"] = {"template": "megatron_gpt", **(data.get("launch") or {})}
    data.setdefault("training", {"global_batch_size": 1024})
    try:
        return study_from_mapping(data, base_dir=file.resolve().parent, found_by=path,
                                  cluster_file=True)  # fmt: skip
    except ConfigError as exc:
        raise ConfigError(exc.reason, path=exc.path, file=path) from None


def _profile_spec(args: argparse.Namespace) -> StudySpec:
    if (args.study is None) == (args.cluster is None):
        raise ConfigError("give --study NAME or --cluster FILE")
    return load_study(args.study) if args.study else cluster_study(args.cluster)


def _cmd_profile(args: argparse.Namespace) -> int:
    from tuner.calibrate.store import cluster_layout
    from tuner.profile import run as prof

    spec = _profile_spec(args)
    layout = cluster_layout(spec, args.results)
    if args.probe:
        from tuner.cli.probe import run_probe

        return run_probe(spec, layout, args)
    if args.show:
        profile = prof.study_profile(spec, args.results) or prof.load_profile(
            layout.profile_yaml, spec
        )
    else:
        profile = _measure(spec, layout, args)
        prof.save_profile(profile, layout.profile_yaml)
    if args.format == "json":
        _emit_json({"path": str(layout.profile_yaml), **profile.to_dict(),
                    "alpha_beta": [_fields(f) for f in profile.alpha_beta()]})  # fmt: skip
        return 0
    console = _console()
    render.render(console, render.Grid(
        title=f"cluster {profile.cluster}: {profile.hosts} host(s), {profile.world_size} ranks, "
        f"{profile.created}",
        columns=PROFILE_COLUMNS, rows=tuple(prof.summary_rows(profile)), choosable=False,
    ))  # fmt: skip
    versions = ", ".join(f"{k} {v}" for k, v in profile.versions.items() if v is not None)
    console.print(f"software: {versions}")
    console.print(wrote("profile", [layout.profile_yaml]))
    return 0


def _fields(obj: Any) -> dict[str, Any]:

    return dataclasses.asdict(obj)


def _measure(spec: StudySpec, layout: Any, args: argparse.Namespace) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from tuner.cli.render import Console
    from tuner.profile.plan import ProbeOptions
    from tuner.profile.run import run_probe
    from tuner.space.enumerate import study_gpu
    from tuner.study.launchers import make_executor

    # the parser bounds --warmup and --repeats and each --message-bytes from below; a message
    # no GPU can hold failed in the job, a torchrun error's last line ("error_file: <N/A>")
    sizes = args.message_bytes
    memory = study_gpu(spec).memory_gib * 2**30
    if sizes is not None and max(sizes) > memory:
        raise ConfigError(f"{max(sizes):,} bytes: more than a {spec.cluster.gpu_name}'s "
                          f"memory ({memory:,.0f} bytes)", path="--message-bytes")  # fmt: skip
    options = ProbeOptions(warmup=args.warmup, repeats=args.repeats, message_bytes=sizes)
    executor = make_executor(spec)
    columns = ("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    # the bar is a terminal's display, on stderr: rich still writes a line break to a file or a
    # pipe when a transient bar ends, so stdout held a blank line (before the error, too)
    console = Console(stderr=True)
    shown = not args.quiet and console.is_terminal
    try:
        with Progress(*columns, console=console, disable=not shown, transient=True) as bar:
            task = bar.add_task(f"profiling {spec.cluster_name}", total=None)

            def update(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            return run_probe(spec, executor, layout, options, on_progress=update)
    finally:
        executor.close()


# ----------------------------------------------------------------------------- calibrate


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from tuner.calibrate.calibrated import Corrector, error_summary
    from tuner.calibrate.store import load_calibration, setup_fingerprint
    from tuner.layout import ClusterLayout, name_problem

    if (args.study is None) == (args.cluster is None):
        raise ConfigError("give --cluster NAME or --study NAME")
    spec = load_study(args.study) if args.study else None
    name = spec.cluster_name if spec is not None else str(args.cluster)
    if (problem := name_problem(name)) is not None:
        raise ConfigError(f"--cluster {problem}")
    layout = ClusterLayout(Path(args.results).resolve(), name)
    if args.reset:
        existed = layout.calibration_yaml.exists()
        layout.calibration_yaml.unlink(missing_ok=True)
        sys.stdout.write(f"calibration of {name} {'cleared' if existed else 'was empty'}\n")
        return 0
    if spec is None:
        _check_cluster_known(layout)
    cal = load_calibration(layout.calibration_yaml, name)
    fingerprint = setup_fingerprint(spec) if spec is not None else ""
    corrector = Corrector(cal.observations, fingerprint=fingerprint)
    loo, memory_loo = corrector.leave_one_out(), corrector.memory_leave_one_out()
    errors, memory_errors = error_summary(loo), error_summary(memory_loo)
    choice = corrector.time_choice
    if args.format == "json":
        _emit_json({"cluster": name, "path": str(layout.calibration_yaml),
                    "updated": cal.updated, "factors": dict(corrector.factors()),
                    "error": errors, "trials": [loo_json(r) for r in loo],
                    "time_correction": choice and choice.to_json(),
                    "memory_factors": dict(corrector.memory_factors()),
                    "memory_error": memory_errors,
                    "memory_trials": [loo_json(r, memory=True) for r in memory_loo]})  # fmt: skip
        return 0
    console = _console()
    if not cal.observations:
        console.print(f"cluster {name}: no calibration saved yet ({layout.calibration_yaml})")
        return 0
    studies = sorted({o.study for o in cal.observations})
    console.print(f"cluster {name}: {units.plural(len(cal.observations), 'trial')} from "
                  f"{', '.join(studies)}, "
                  f"updated {cal.updated}")  # fmt: skip
    if choice is not None:
        console.print(choice.line())
    print_corrections(console, "step time", "fitted step-time corrections (measured / "
                       "predicted):", corrector.factors(), loo, errors,
                       choice.applied if choice else None)  # fmt: skip
    if memory_loo:
        print_corrections(console, "peak memory", "fitted memory corrections (measured / "
                           "predicted peak; a knob's factor is on the part of the peak it "
                           "sizes):", corrector.memory_factors(), memory_loo,
                           memory_errors)  # fmt: skip
    return 0


CALIBRATE_MORE = (
    "applies to: 'all configs' / 'whole peak' is the factor on every config; 'KNOB=VALUE' the "
    "further factor of configs with that value (tp, pp, cp, dp, vp, mbs, sp, recompute, ep, "
    "etp, dispatcher, tpo; sharding=D:Z is the distributed optimizer (0 or 1) and the ZeRO "
    "stage); a memory factor is on the part of the peak its knob sizes ('states, ' the weights' "
    "gradients and optimizer states, 'activations, ' the activations)"
)
PROFILE_COLUMNS = (
    render.Column(name="measured", header="measured", right=False, wrap=2),
    render.Column(name="figure", header="figure", right=False, wrap=3),
)
"""The saved cluster profile: what was measured and the figure it gave."""
# ----------------------------------------------------------------------------- other commands


CALIBRATED_COLUMNS = (
    render.Column(name="rank", header="rank", meaning="place in the calibrated ranking"),
    render.CONFIG,
    render.Column(name="step_s", header="model\nstep s", meaning="the time model's step time"),
    render.Column(
        name="calibrated_step_s",
        header="calibrated\nstep s",
        meaning="the step time corrected by the cluster's saved measurements",
    ),
    render.Column(
        name="calibrated_peak_gib",
        header="calibrated\npeak GiB",
        meaning="the peak memory so corrected; (over): above the limit",
    ),
)


def calibrated_lines(spec: StudySpec, report: Any, top: int, results: str = "results", *,
                     ranked: list[Any] | None = None) -> Any:  # fmt: skip
    """The calibrated ranking and memory notes for ``space`` and ``run --dry-run``: a list of
    printable things (empty without a saved calibration) and their JSON. ``ranked``: the
    report's ranking when the caller has it already (computed here otherwise)."""
    from tuner.calibrate.calibrated import corrector_for, memory_notes

    ranked = report.ranked() if ranked is None else ranked
    corrector = corrector_for(spec, results, [c.config for c in ranked])
    if not corrector:
        return [], None
    rows = sorted((corrector.correct(c) for c in ranked), key=lambda r: r.calibrated_step_s)
    notes = memory_notes(corrector, ranked, report.oom)
    title = (f"top {min(top, len(rows))} by calibrated step time (cluster {spec.cluster_name}, "
             f"{units.plural(len(corrector.observations), 'saved trial')})")  # fmt: skip
    constant, spelled = split_constant([r.config for r in rows[:top]], spec.framework)
    cells = []
    for i, (r, config) in enumerate(zip(rows[:top], spelled, strict=True), 1):
        over = " (over)" if r.calibrated_peak_gib > corrector.limit_gib else ""
        cells.append((str(i), config, units.seconds(r.step_s), units.seconds(r.calibrated_step_s),
                      f"{units.gib(r.calibrated_peak_gib)}{over}"))  # fmt: skip
    table = render.Grid(title=title, columns=CALIBRATED_COLUMNS, rows=tuple(cells),
                        constant=constant, choosable=False)  # fmt: skip
    data = {"cluster": spec.cluster_name, "saved_trials": len(corrector.observations),
            "notes": notes, "top": [{"config": r.config.to_dict(), "step_s": r.step_s,
                                     "calibrated_step_s": r.calibrated_step_s,
                                     "calibrated_peak_gib": r.calibrated_peak_gib}
                                    for r in rows[:top]]}  # fmt: skip
    return ([table] if top > 0 else []) + list(notes), data  # no --top: no empty "top 0" table


def calibrated_estimate(spec: StudySpec, candidate: Any, results: str = "results") -> Any:
    """One config's calibrated step and peak for ``tune estimate``: (line or None, JSON)."""
    from tuner.calibrate.calibrated import corrector_for

    if candidate.time is None:  # invalid: nothing predicted, nothing to correct
        return None, None
    corrector = corrector_for(spec, results, [candidate.config])
    if not corrector:
        return None, None
    r = corrector.correct(candidate)
    fits = r.calibrated_peak_gib <= corrector.limit_gib
    verdict = "fits" if fits else "over the limit (tried last)"
    if not candidate.fits:
        verdict = "the memory model's OOM stands: never launched"
    line = (
        f"calibrated (cluster {spec.cluster_name}, "
        f"{units.plural(len(corrector.observations), 'saved trial')}): "
        f"step {units.seconds(r.calibrated_step_s)} s "
        f"({units.factor(r.calibrated_step_s / r.step_s)}, spread "
        f"{units.percent(r.step_spread)}%), peak {units.gib(r.calibrated_peak_gib)} GiB: "
        f"{verdict}"
    )
    return line, {"step_s": r.calibrated_step_s, "step_spread": r.step_spread,
                  "peak_gib": r.calibrated_peak_gib, "fits": fits and candidate.fits}  # fmt: skip


def measured_space(spec: StudySpec, results: str) -> tuple[Any, Any, Any, str]:
    """The study's space enumerated as ``tune run`` ranks it (OOMs kept), on the cluster
    profile's rates and the framework probe's terms: the report, the rates, the terms and what
    the time figures come from (:func:`time_source`)."""
    from tuner.profile.stack_terms import study_terms
    from tuner.space.enumerate import enumerate_space

    rates, source = time_source(spec, results)
    terms = study_terms(spec, results, rates)
    return enumerate_space(spec, keep_oom=True, rates=rates, terms=terms), rates, terms, source


def time_source(spec: StudySpec, results: str = "results") -> tuple[Any, str]:
    """The cluster's measured rates (or None) and what ``tune estimate`` / ``space`` say of them:
    the saved profile's GEMMs and collectives, or the catalog's datasheet figures."""
    from tuner.catalog import get_gpu
    from tuner.models.rates import ceiling_share
    from tuner.models.uncertainty import CATALOG_STEP_SIGMA
    from tuner.profile.rates import profile_rates
    from tuner.profile.run import study_profile

    profile = study_profile(spec, results)  # read and checked once
    if profile is None:
        gpu = spec.cluster.gpu_name
        measured = (
            ceiling_share(get_gpu(spec.cluster.gpu)) > 0
        )  # what tuner.models.rates.gemm_efficiency reads
        ceiling = ", GEMMs at its published measured matmul ceiling" if measured else ""
        return None, (f"catalog ({gpu} datasheet figures{ceiling}; its step times are off by "
                      f"{CATALOG_STEP_SIGMA:.0%} sd on a stack never seen; "
                      f"{spec.profile_command} measures this cluster's)")  # fmt: skip
    rates, when = profile_rates(spec, profile), profile.created
    # a profile saved before the probe measured attention and memory streaming has neither
    measures = ["GEMMs by shape", "all-reduce latency and bandwidth"]
    catalog: list[str] = []
    for has, name, otherwise in (
        (bool(profile.attention), "fused attention by call length", "attention"),
        (profile.stream is not None, "memory streaming", "HBM bandwidth"),
        (profile.launch is not None, "kernel launches", "kernel launches"),
    ):
        (measures if has else catalog).append(name if has else otherwise)
    catalog.append("framework overheads")
    from_catalog = ", ".join(catalog[:-1]) + " and " if len(catalog) > 1 else ""
    return rates, (
        f"cluster profile {spec.cluster_name} (measured {when}): {', '.join(measures)}; "
        f"{from_catalog}{catalog[-1]} from the catalog"
    )


# ----------------------------------------------------------------------------- registration


def _check_cluster_known(layout: ClusterLayout) -> None:
    """``tune calibrate --cluster NAME`` of a cluster nothing was saved for (a mistyped name)
    is a one-line error naming those that have something, not "no calibration saved yet"."""
    if layout.calibration_yaml.exists() or layout.profile_yaml.exists():
        return
    if any(layout.dir.glob(f"{glob.escape(layout.name)}.*.stack.yaml")):
        return
    names = set()
    for path in layout.dir.glob("*.yaml"):
        if not path.name.endswith(".stack.yaml"):  # a profile or a calibration
            names.add(path.name.removesuffix(".yaml").removesuffix(".calibration"))
    known = sorted(names)
    saved = f"saved there: {', '.join(known)}" if known else "nothing is saved there yet"
    raise ConfigError(f"nothing saved for cluster {layout.name!r} in {layout.dir} ({saved}); "
                      "--study NAME finds a study's cluster", path="--cluster")  # fmt: skip


PROFILE_HELP = "measure the cluster's GEMM and collective speeds"
PROFILE_ABOUT = "\n".join((
    f"{PROFILE_HELP[0].upper()}{PROFILE_HELP[1:]}.",
    "one short job on the study's first node group, through its own executor (local, SSH or "
    "Slurm); saved as RESULTS/clusters/NAME.yaml (NAME: cluster.name) and used from then on by "
    "estimate, space and run of every study on that cluster instead of the catalog's figures",
    "--probe: the study's own launch at 1 and up to 4 layers (the framework's per-layer time, "
    "activations and extras), saved beside it; --show prints what is saved",
    "more: docs/guides/calibration.md",
))  # fmt: skip


def add_parsers(sub: Any, handlers: Handlers, add_format_option: Any) -> None:
    """Register ``profile`` and ``calibrate`` on ``tune``'s subparsers."""
    p = sub.add_parser("profile", help=PROFILE_HELP, description=PROFILE_ABOUT,
                       formatter_class=help_text.EpilogFormatter)  # fmt: skip
    p.add_argument(
        "--study",
        metavar="NAME",
        help=f"profile this study's cluster for its model and space: {STUDY_HELP}",
    )
    p.add_argument("--cluster", metavar="FILE", help="a cluster file (cluster:, model:, ...)")
    p.add_argument("--warmup", type=whole(0, MAX_REPEATS), default=3, metavar="N",
                   help="untimed repetitions (default 3)")  # fmt: skip
    p.add_argument("--repeats", type=whole(1, MAX_REPEATS), default=10, metavar="N",
                   help="timed repetitions (default 10)")  # fmt: skip
    p.add_argument(
        "--message-bytes",
        metavar="N[,N]",
        type=wholes(1),
        default=None,
        help="collective sizes in bytes (default: x4 apart up to the space's largest message)",
    )
    p.add_argument(
        "--show",
        action="store_true",
        help="print the saved profile after checking it is current; measure nothing",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="run the study's own launch at 1 and up to 4 layers per stage on a few points of its "
        "space (one job) and save the per-layer time, activations and extras it measures",
    )
    add_format_option(p, ("text", "json"))
    handlers["profile"] = _cmd_profile

    p = sub.add_parser(
        "calibrate", help="the model corrections saved for a cluster",
        epilog=help_text.epilog(FACTOR_COLUMNS + TRIAL_COLUMNS, CALIBRATE_MORE, choose=False),
        formatter_class=help_text.EpilogFormatter,
    )  # fmt: skip
    p.add_argument("--cluster", metavar="NAME", help="the cluster name (cluster.name)")
    p.add_argument("--study", metavar="NAME", help=f"the cluster of this study: {STUDY_HELP}")
    p.add_argument("--reset", action="store_true", help="clear the saved corrections")
    add_format_option(p, ("text", "json"))
    handlers["calibrate"] = _cmd_calibrate
