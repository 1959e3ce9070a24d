"""``tune``'s commands: parse arguments, call the library, print (thin). Entered through
:func:`tuner.cli.main.main`, which loads this module.

Exit codes: 0 success, 1 the job failed, 2 bad usage or bad input (one line on stderr; the
traceback only with ``--debug``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tuner.cli import exiting, help_text, render
from tuner.cli import profile as cli_profile
from tuner.cli.board import BOARD_COLUMNS
from tuner.cli.cost import (
    cost_json,
    measurable,
    print_cost,
    require_launch,
    spent_json,
)
from tuner.cli.failure import exit_status, terminate_as_interrupt
from tuner.cli.logline import LineFormatter
from tuner.cli.options import (
    RESULTS_DEFAULT,
    Parser,
    VersionAction,
    add_columns_option,
    add_format_option,
    add_study_option,
    describe_subcommands,
    folder,
    rerun_outcomes,
    whole,
)
from tuner.cli.tables import (
    STAGE_COLUMNS,
    TOP_COLUMNS,
    _candidate_json,
    _console,
    _counts_table,
    _emit_json,
    _print_estimate,
    _top_table,
    wrote,
)
from tuner.config.settings import settable_keys
from tuner.config.spelling import spell
from tuner.errors import ConfigError, StudyError
from tuner.layout import EXPORT_KINDS
from tuner.report import units
from tuner.spec.bounds import MAX_ITERS, MAX_TRIALS
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec

if TYPE_CHECKING:
    pass

Handler = Callable[[argparse.Namespace], int]
RUN_HELP = "search: launch short real runs and record them"
RUN_MORE = "\n".join((
    "first: tune run --study S --dry-run counts the space, shows what would run first and what "
    "the trials would cost, and launches nothing",
    "results: everything a run records goes to RESULTS/STUDY/ (study.db; trials/N/ with each "
    "trial's scripts and logs) under the folder it starts from (--results DIR elsewhere); the "
    "other commands read it from there",
    "Ctrl-C stops it cleanly (the running trials ended and recorded interrupted, exit status "
    "130); the same command again resumes",
    "then: tune leaderboard, tune report and tune best (docs/getting-started.md)",
))  # fmt: skip
RUN_ABOUT = f"{RUN_HELP[0].upper()}{RUN_HELP[1:]}.\n{RUN_MORE}"
BEST_MORE = "\n".join((
    "a Megatron-LM study's full run (--emit script or sbatch) needs launch.train_args in the "
    "study: its data, tokenizer and schedule, which no short trial used; without them tune best "
    "stops and says so (--emit args needs none)",
    "each kind's files, and how launch.sh finds its node's rank and the master address: "
    "docs/exports.md",
))  # fmt: skip
BOARD_MORE = ("--format csv and json keep every field, the config as its full key; --columns "
              "takes those field names too (tp, zero_stage, predicted_mfu, ...)")  # fmt: skip


# ----------------------------------------------------------------------------- estimate


def _cmd_estimate(args: argparse.Namespace) -> int:
    # The models load with the commands that use them: `tune --version` and `--help` stay quick.
    import dataclasses

    from tuner.api import estimate
    from tuner.cli.probe import source_lines
    from tuner.models.memory.stack import study_stack
    from tuner.profile.recorded import study_with_profile
    from tuner.profile.stack_terms import study_terms
    from tuner.space.enumerate import config_from_settings

    columns = render.parse_columns(args.columns, args.format)
    spec = study_with_profile(args.study, args.results)
    rates, source = cli_profile.time_source(spec, args.results)
    terms = study_terms(spec, args.results, rates)
    found = estimate(spec, config_from_settings(spec, args.set or []), rates=rates, terms=terms)
    result = found.to_dict()
    result["time_source"] = source
    result["stack"] = (stack := study_stack(spec)).to_dict()
    result["term_sources"] = [dataclasses.asdict(s) for s in terms.sources(found.config)]
    # the step's stated sd: each term's held-out catalog error or measured spread
    result["time_error"] = found.time.sigma if found.time else None
    measured = found.time is not None and bool(found.time.provenance)
    result["time_error_from"] = (
        "some terms measured on this stack" if measured
        else "catalog terms at their held-out error" if rates is None
        else "measured rates, catalog terms at their held-out error"
    )  # fmt: skip
    line, result["calibrated"] = cli_profile.calibrated_estimate(spec, found, args.results)
    if args.format == "json":
        _emit_json(result)
    elif found.valid:
        _print_estimate(result, spec.search.memory_headroom, columns)
        _console().print(f"time model rates: {source}")
        if stack.source or stack.loading_source:  # nothing known: the catalog's, as before
            _console().print(stack.summary())
        for text in source_lines(spec, found.config, terms):
            _console().print(text)
        if line:
            _console().print(line)
    if not found.valid:  # bad input: the rules it breaks, one line, exit 2
        sys.stderr.write(f"tune: error: {spell(found.config)} breaks "
                         f"{units.plural(len(found.errors), 'rule')}: "
                         f"{'; '.join(found.errors)}\n")  # fmt: skip
        return 2
    return 0


# ----------------------------------------------------------------------------- space


def _cmd_space(args: argparse.Namespace) -> int:
    from tuner.profile.recorded import study_with_profile  # reads the profile: not for --help

    spec = study_with_profile(args.study, args.results)
    if (columns := render.parse_columns(args.columns, args.format)) is not None:  # before all
        if args.top <= 0:
            raise ConfigError("--columns: it picks the columns of the --top table; add --top K")
        render.check_columns(columns, [c.name for c in TOP_COLUMNS])
    report, rates, terms, out_source = cli_profile.measured_space(spec, args.results)
    out = report.counts()
    out["time_source"] = out_source
    top = (ranked := report.ranked())[: max(args.top, 0)]  # sorted once: costly at 10^5
    lines, out["calibrated"] = cli_profile.calibrated_lines(spec, report, args.top, args.results,
                                                            ranked=ranked)  # fmt: skip
    out["cost"] = cost_json(spec, ranked, top, spec.search.n_trials, rates, terms, args.results,
                            report.probes)  # fmt: skip
    if args.format == "json":
        if args.top > 0:
            out["top"] = [_candidate_json(c) for c in top]
        _emit_json(out)
        return 0
    console = _console()
    render.render(console, _counts_table(spec, out))
    console.print(f"time model rates: {out_source}")
    if top:
        title = f"top {len(top)} by predicted step time"
        render.render(console, _top_table(title, top, spec.framework), columns)
    print_cost(console, spec, out["cost"])
    for line in lines:
        render.show(console, line)
    study = spec.study_arg
    if not out["viable"]:  # the counts say what ruled each out; say what that means
        console.print(f"nothing to run: no config is valid and predicted to fit; widen the space "
                      f"(tune estimate --study {study} --set KNOB=VALUE shows one config's broken "
                      "rules and memory)")  # fmt: skip
    elif args.top <= 0:  # a first look: say how to see the configs themselves
        console.print(f"the fastest predicted configs: tune space --study {study} --top 10")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from tuner.profile.recorded import study_with_profile  # reads the profile: not for --help

    spec = study_with_profile(args.study, args.results)
    if args.dry_run:
        from tuner.cli.dry_run import dry_run

        return dry_run(spec, args.format == "json", args.n_trials, args.results,
                       storage=args.storage, force=args.force)  # fmt: skip
    from tuner.space.enumerate import enumerate_space, require_viable

    # Before any storage exists: some config is viable and, under a limit the user set, some
    # config can be measured within it (one enumeration; step times only when they are needed).
    limited = spec.search.trial_timeout_min is not None
    report = enumerate_space(spec, with_time=limited)
    require_viable(spec, report)
    first = measurable(spec, report.ranked())[0] if limited else report.viable[0]
    if not args.skip_preflight:  # a broken template: one line, not a budget of launch errors
        require_launch(spec, first.config)
    return _run(spec, args)


def _run(spec: StudySpec, args: argparse.Namespace) -> int:
    # The launch layer and Optuna load only when something runs.
    from tuner.cli.progress import LiveProgress
    from tuner.study.build import build_loop
    from tuner.study.launchers import make_executor
    from tuner.study.signals import stop_on_signals

    if not args.force:
        _refuse_a_changed_study(spec, args.storage, args.results)
    executor = make_executor(spec)
    if not args.skip_preflight and (code := _preflight(spec, executor)):
        executor.close()
        return code
    progress = LiveProgress(quiet=args.quiet)
    try:  # a refusal or a Ctrl-C while the space and the study are made: the nodes' connections
        loop = build_loop(  # opened by the preflight are closed, not left to the interpreter
            spec, storage=args.storage, results=args.results, force=args.force,
            n_trials=args.n_trials, on_update=progress.update, executor=executor,
            rerun=args.rerun,
        )  # fmt: skip
    except BaseException:
        executor.close()
        raise
    try:
        with stop_on_signals(loop), progress:
            summary = loop.run()
    finally:
        loop.executor.close()
    if args.format == "json":
        _emit_json({"study": spec.name, **dataclasses.asdict(summary), "failed": summary.failed,
                    "space": loop.space_counts, "spent": spent_json(loop.trials())})  # fmt: skip
    else:
        progress.final(loop, summary)
    if summary.stop_reason.startswith("interrupted"):
        return 130
    failed = summary.failed
    if failed:
        sys.stderr.write(f"tune: error: {failed}\n")
        return 1
    return 0


def _refuse_a_changed_study(spec: StudySpec, storage: str | None, results: str) -> None:
    """Refuse to resume a study whose file changed before the preflight, not after it: the
    preflight reaches every node (an srun per node on Slurm, which may queue) and the refusal
    came once it had passed."""
    from tuner.cli.resume import changed_here

    if why := changed_here(spec, storage, results):
        raise StudyError(why)


def _preflight(spec: StudySpec, executor: Any) -> int:
    """Every node reachable and ready, before anything is launched: one line per problem."""
    from tuner.cli.lockcheck import refused
    from tuner.launch.preflight import checks_for

    return refused(executor.preflight(spec.node_names, checks_for(spec)))


def _cmd_leaderboard(args: argparse.Namespace) -> int:
    from tuner.cli import board

    return board.run(_console, args)


def _cmd_best(args: argparse.Namespace) -> int:
    from tuner.report.export import trial_record

    spec = load_study(args.study)
    record = trial_record(spec, args.trial, storage=args.storage, results=args.results)
    export = record.export(args.emit, train_iters=args.train_iters)
    if args.format != "json":
        sys.stdout.write(export.text)
        sys.stderr.write(wrote("best", export.files) + "\n")  # stdout: the export itself
        return 0
    out: dict[str, Any] = {**record.to_dict(), "step_s": record.measured["measured_step_s"],
                           "emit": args.emit, "files": [str(p) for p in export.files]}  # fmt: skip
    if args.emit == "args":
        out["args"] = shlex.split(export.text)
        for path in export.files[1:]:  # a DeepSpeed study's: the ds_config the line names
            out["ds_config"] = json.loads(path.read_text())
    elif args.emit == "torchtitan":
        out["args"] = shlex.split(export.text)
    elif args.emit == "ds-config":
        out["ds_config"] = json.loads(export.text)
    elif args.emit == "bridge-overrides":
        out["overrides"] = shlex.split(export.text)
    elif args.emit == "bridge-recipe":
        out["recipe"] = export.text
    else:
        out["script"] = export.text
    _emit_json(out)
    return 0


# ----------------------------------------------------------------------------- main

GLOBAL_DEFAULTS: dict[str, Any] = {"debug": False, "verbose": False, "quiet": False}
"""Options every command takes, before or after its name (``tune --debug run``, ``tune run
--debug``)."""
STORE_DEFAULTS: dict[str, Any] = {"results": RESULTS_DEFAULT, "storage": None}
"""Where a study's results live: options of run, leaderboard and best, also accepted before the
command's name."""
STORE_COMMANDS = ("run", "leaderboard", "best", "report", "profile", "calibrate", "space",
                  "estimate")  # fmt: skip
OPTUNA_COMMANDS = STORE_COMMANDS[:4]


def _add_global_options(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: an option left out after the command must not reset one given before it.
    s = argparse.SUPPRESS
    parser.add_argument("--debug", action="store_true", default=s, help="show tracebacks")
    parser.add_argument("-v", "--verbose", action="store_true", default=s, help="log progress")
    parser.add_argument("--quiet", action="store_true", default=s,
                        help="tune run: no live display (-v: a log line per change)")  # fmt: skip


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    s = argparse.SUPPRESS
    parser.add_argument("--storage", default=s, metavar="URL",
                        help="SQLAlchemy URL or journal file (default: the results directory's "
                        "STUDY/study.db)")  # fmt: skip
    parser.add_argument("--results", default=s, metavar="DIR", type=folder,
                        help="results directory (default: ./results)")  # fmt: skip


def _top_parser() -> argparse.ArgumentParser:
    """``tune`` itself: its description, first steps and the options every command takes."""
    parser: argparse.ArgumentParser = Parser(
        prog="tune",
        description="Find the fastest parallel configuration for Megatron-LM, DeepSpeed, "
        "Megatron-DeepSpeed, Megatron-Bridge or torchtitan training.",
        epilog=f"{help_text.FIRST_STEPS}\n{help_text.FLOPS_HELP}",
        formatter_class=help_text.EpilogFormatter,
    )
    parser.add_argument("--version", action=VersionAction, help="print the version and exit")
    _add_global_options(parser)
    _add_store_options(parser)
    return parser


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    """The argument parser and the handler of each subcommand."""
    parser = _top_parser()
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers: dict[str, Handler] = {}

    raw = help_text.EpilogFormatter
    p = sub.add_parser("estimate", help="validate one config and predict its memory and time",
                       epilog=help_text.epilog(STAGE_COLUMNS), formatter_class=raw)  # fmt: skip
    add_study_option(p)
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE",
        help="a knob, repeatable; knobs not set take the first value of the study's space: "
        + ", ".join(settable_keys()),
    )  # fmt: skip
    add_format_option(p)
    add_columns_option(p, [c.name for c in STAGE_COLUMNS])
    handlers["estimate"] = _cmd_estimate

    p = sub.add_parser("space", help="count, validate and prune the study's search space",
                       epilog=help_text.epilog(TOP_COLUMNS), formatter_class=raw)  # fmt: skip
    add_study_option(p)
    add_format_option(p)
    add_columns_option(p, [c.name for c in TOP_COLUMNS])
    p.add_argument("--top", type=whole(0), default=0, metavar="K",
                   help="show the K fastest predicted")  # fmt: skip
    handlers["space"] = _cmd_space

    p = sub.add_parser("run", help=RUN_HELP, description=RUN_ABOUT,
                       epilog=help_text.epilog(TOP_COLUMNS), formatter_class=raw)  # fmt: skip
    add_study_option(p)
    p.add_argument("--n-trials", type=whole(1, MAX_TRIALS), default=None, metavar="N",
                   help="override search.n_trials")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="count, rank and cost; launch nothing")
    p.add_argument("--force", action="store_true", help="resume even if the study file changed")
    add_format_option(p, ("text", "json"))
    p.add_argument(
        "--rerun", default="", type=rerun_outcomes, metavar="OUTCOME[,OUTCOME]",
        help="run again, once, the configs whose trials ended so (e.g. timeout,hang)",
    )  # fmt: skip
    p.add_argument(
        "--skip-preflight", action="store_true",
        help="launch without checking first that the first launch renders and that every "
        "node is reachable and has the paths and GPUs",
    )  # fmt: skip
    handlers["run"] = _cmd_run

    p = sub.add_parser(
        "leaderboard",
        help="every measured config, fastest first",
        epilog=help_text.epilog(BOARD_COLUMNS, BOARD_MORE),
        formatter_class=raw,
    )
    add_study_option(p)
    add_format_option(p, ("table", "csv", "json", "markdown"), json_synonym=False)
    add_columns_option(p, ["any column of --format csv"])
    p.add_argument("--all", action="store_true", help="include pruned and failed trials")
    handlers["leaderboard"] = _cmd_leaderboard

    p = sub.add_parser("best", help="a measured config as a full run: launch script, sbatch job, "
                       "framework arguments or ds_config (docs/exports.md)", epilog=BEST_MORE,
                       formatter_class=raw)  # fmt: skip
    add_study_option(p)
    p.add_argument("--emit", choices=EXPORT_KINDS, default="script", metavar="KIND",
                   help=f"what to write: {', '.join(EXPORT_KINDS)} (default script; each kind "
                   "to its own file under results/STUDY/exports/trial-N/)")  # fmt: skip
    p.add_argument("--trial", type=whole(0), default=None, metavar="N",
                   help="export trial N instead of the fastest measured one")  # fmt: skip
    p.add_argument("--train-iters", type=whole(1, MAX_ITERS), default=None, metavar="N",
                   help="iterations of the full run (default: the study's launch.train_iters, "
                   "a short trial's length)")  # fmt: skip
    add_format_option(p, ("text", "json"), json_synonym=False)
    handlers["best"] = _cmd_best
    cli_profile.add_parsers(sub, handlers, add_format_option)
    from tuner.cli import catalog as catalog_cli

    catalog_cli.add_parser(sub, handlers, add_format_option, add_columns_option)

    from tuner.cli import parse_log as logs_cli

    logs_cli.add_parser(sub)
    handlers["parse-log"] = logs_cli.run
    from tuner.cli import report as report_cli

    report_cli.add_parser(sub)
    handlers["report"] = report_cli.run
    describe_subcommands(sub)
    for name, command in sub.choices.items():
        _add_global_options(command)
        if name in STORE_COMMANDS:
            _add_store_options(command)
    return parser, handlers


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, then default the options that may come before or after the command's name."""
    args = parser.parse_args(argv)
    for key, value in GLOBAL_DEFAULTS.items():
        args.__dict__.setdefault(key, value)
    given = [key for key in STORE_DEFAULTS if key in args.__dict__]
    if args.command not in STORE_COMMANDS and given:
        parser.error(f"--{given[0]} applies to {', '.join(STORE_COMMANDS)}, not {args.command}")
    for key, value in STORE_DEFAULTS.items():
        args.__dict__.setdefault(key, value)
    return args


def _configure_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(LineFormatter())
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        handlers=[handler])  # fmt: skip
    if args.debug:  # the details behind a one-line error (a failing storage's every error)
        logging.getLogger("tuner").setLevel(logging.DEBUG)
    if args.command in OPTUNA_COMMANDS and not getattr(args, "dry_run", False):
        # Optuna prints its own lines ("A new study created in RDB ...", "Trial 3 finished ...")
        # through a handler of its own; the CLI owns the output, so they go through ours and
        # only under --debug.
        import optuna

        optuna.logging.disable_default_handler()
        optuna.logging.enable_propagation()
        optuna.logging.set_verbosity(logging.DEBUG if args.debug else logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tune`` script."""
    render.prepare_output()  # before any console reads the environment or prints
    parser, handlers = build_parser()
    args = parse_args(parser, argv)
    _configure_logging(args)
    try:
        with terminate_as_interrupt(), exiting.kept_to_exit(args.command):
            return handlers[args.command](args)
    except BaseException as exc:  # a defect (or SystemExit) passes through: exit_status is None
        shown = not args.debug or isinstance(exc, KeyboardInterrupt)  # --debug: the traceback
        status = exit_status(exc) if shown else None
        if status is None:
            raise
        return status
