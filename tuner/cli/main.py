"""``tune``: the command line. Thin: parse arguments, call the library, print.

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
from typing import Any

from tuner.api import estimate
from tuner.cli import profile as cli_profile
from tuner.cli.options import add_format_option
from tuner.cli.tables import (
    _candidate_json,
    _console,
    _counts_table,
    _emit_json,
    _print_board,
    _print_estimate,
    _top_table,
)
from tuner.errors import ConfigError, TunerError
from tuner.models.rates import CATALOG_STEP_ERROR
from tuner.outcome import Outcome
from tuner.space.enumerate import (
    SpaceReport,
    config_from_settings,
    enumerate_space,
    require_viable,
)
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec

FLOPS_HELP = (
    "FLOPs convention: 2 per multiply-add, backward = 2x forward, attention scores counted in "
    "full, LM head included (Korthikanti's 72BsLh^2(1 + s/6h + V/12Lh) for GPT); MFU counts no "
    "recomputation, HFU does."
)

Handler = Callable[[argparse.Namespace], int]


# ----------------------------------------------------------------------------- estimate


def _cmd_estimate(args: argparse.Namespace) -> int:
    spec = load_study(args.study)
    rates, source = cli_profile.time_source(spec, args.results)
    found = estimate(spec, config_from_settings(spec, args.set or []), rates=rates)
    result = found.to_dict()
    result["time_source"] = source
    result["time_error"] = CATALOG_STEP_ERROR if rates is None else None
    line, result["calibrated"] = cli_profile.calibrated_estimate(spec, found, args.results)
    if args.format == "json":
        _emit_json(result)
    else:
        _print_estimate(result, spec.search.memory_headroom)
        _console().print(f"time model rates: {source}")
        if line:
            _console().print(line)
    return 0


# ----------------------------------------------------------------------------- space


def _cmd_space(args: argparse.Namespace) -> int:
    spec = load_study(args.study)
    rates, out_source = cli_profile.time_source(spec, args.results)
    report = enumerate_space(spec, keep_oom=True, rates=rates)
    out = report.counts()
    out["time_source"] = out_source
    top = report.ranked()[: args.top] if args.top > 0 else []
    lines, out["calibrated"] = cli_profile.calibrated_lines(spec, report, args.top, args.results)
    if args.format == "json":
        if args.top > 0:
            out["top"] = [_candidate_json(c) for c in top]
        _emit_json(out)
        return 0
    console = _console()
    console.print(_counts_table(spec, out))
    console.print(f"time model rates: {out_source}")
    if top:
        console.print(_top_table(f"top {len(top)} by predicted step time", top))
    for line in lines:
        console.print(line)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    spec = load_study(args.study)
    if args.dry_run:
        return _dry_run(spec, args.format == "json", args.n_trials, args.results)
    require_viable(spec, enumerate_space(spec, with_time=False))  # before any storage exists
    return _run(spec, args)


def _run(spec: StudySpec, args: argparse.Namespace) -> int:
    # The launch layer and Optuna load only when something runs.
    from tuner.cli.progress import LiveProgress
    from tuner.study.loop import build_loop, make_executor
    from tuner.study.signals import stop_on_signals

    executor = make_executor(spec)
    if not args.skip_preflight and (code := _preflight(spec, executor)):
        executor.close()
        return code
    progress = LiveProgress(quiet=args.quiet)
    loop = build_loop(
        spec, storage=args.storage, results=args.results, force=args.force,
        n_trials=args.n_trials, on_update=progress.update, executor=executor,
        rerun=_rerun(args.rerun),
    )  # fmt: skip
    try:
        with stop_on_signals(loop), progress:
            summary = loop.run()
    finally:
        loop.executor.close()
    if args.format == "json":
        _emit_json({"study": spec.name, **dataclasses.asdict(summary), "failed": summary.failed,
                    "space": loop.space_counts})  # fmt: skip
    else:
        progress.final(loop, summary)
    if summary.stop_reason.startswith("interrupted"):
        return 130
    failed = summary.failed
    if failed:
        sys.stderr.write(f"tune: error: {failed}\n")
        return 1
    return 0


def _rerun(text: str) -> frozenset[Outcome]:
    """``--rerun timeout,hang`` -> the outcomes whose configs run again."""
    from tuner.space.trials import RERUNNABLE

    out = set()
    for name in filter(None, (n.strip() for n in text.split(","))):
        try:
            outcome = Outcome(name)
        except ValueError:
            outcome = None
        if outcome not in RERUNNABLE:
            allowed = ", ".join(sorted(str(o) for o in RERUNNABLE))
            raise ConfigError(f"--rerun: {name!r} is not one of {allowed}")
        out.add(outcome)
    return frozenset(out)


def _preflight(spec: StudySpec, executor: Any) -> int:
    """Every node reachable and ready, before anything is launched: one line per problem."""
    from tuner.launch.preflight import checks_for, exit_code

    problems = executor.preflight(spec.node_names, checks_for(spec))
    for problem in problems:
        sys.stderr.write(f"tune: preflight: {problem}\n")
    return exit_code(problems)


def _cmd_leaderboard(args: argparse.Namespace) -> int:
    from tuner.report.leaderboard import leaderboard

    spec = load_study(args.study)
    board = leaderboard(spec, include_all=args.all, storage=args.storage, results=args.results)
    if args.format == "csv":
        sys.stdout.write(board.to_csv(index=False))
    elif args.format == "json":
        sys.stdout.write(board.to_json(orient="records", indent=2) + "\n")
    elif args.format == "markdown":
        sys.stdout.write(board.to_markdown(index=False, floatfmt=".4g") + "\n")
    else:
        _print_board(spec, board)
    return 0


def _cmd_best(args: argparse.Namespace) -> int:
    from tuner.report.leaderboard import best_trial, emit_best

    spec = load_study(args.study)
    if args.train_iters is not None and args.train_iters <= 0:
        raise ConfigError(f"--train-iters must be > 0, got {args.train_iters}")
    text = emit_best(spec, args.emit, storage=args.storage, results=args.results,
                     train_iters=args.train_iters)  # fmt: skip
    if args.format != "json":
        sys.stdout.write(text)
        return 0
    trial = best_trial(spec, args.storage, args.results)
    out: dict[str, Any] = {"study": spec.name, "trial": trial.number, "step_s": trial.value,
                           "config": trial.user_attrs["config"], "emit": args.emit}  # fmt: skip
    if args.emit == "args":
        out["args"] = text.split()
    elif args.emit == "torchtitan":
        out["args"] = shlex.split(text)
    elif args.emit == "ds-config":
        out["ds_config"] = json.loads(text)
    else:
        out["script"] = text
    _emit_json(out)
    return 0


def _dry_run(spec: StudySpec, as_json: bool, n_trials: int | None, results: str) -> int:
    report: SpaceReport = enumerate_space(spec, keep_oom=True)
    lines, calibrated = cli_profile.calibrated_lines(spec, report, 5, results)
    require_viable(spec, report)
    budget = n_trials or spec.search.n_trials
    ranked = report.ranked()
    if spec.search.sampler == "model":  # one trial per node group, fastest predicted first
        groups = max(len(spec.node_names) // spec.nodes_per_trial, 1)
        first = ranked[: min(groups, budget)]
        then = ("then each measurement corrects the time model and the model sampler proposes "
                "the config with the highest expected improvement")  # fmt: skip
    else:
        first = ranked[: max(spec.search.enqueue_top, 1)]
        then = f"then the {spec.search.sampler} sampler proposes configs"
    if as_json:
        out = report.counts()
        out["launch_first"] = [_candidate_json(c) for c in first]
        out["n_trials"] = budget
        out["calibrated"] = calibrated
        _emit_json(out)
        return 0
    console = _console()
    console.print(_counts_table(spec, report.counts()))
    console.print(_top_table(f"would launch first (top {len(first)} predicted)", first))
    if lines and spec.search.sampler == "model":
        for line in lines:
            console.print(line)
        console.print("the saved calibration reorders them: the model sampler starts from the "
                      "calibrated ranking")  # fmt: skip
    console.print(f"{then} until {budget} runs; nothing was launched (--dry-run).")
    return 0


# ----------------------------------------------------------------------------- main

GLOBAL_DEFAULTS: dict[str, Any] = {"debug": False, "verbose": False, "quiet": False}
"""Options every command takes, before or after its name (``tune --debug run``, ``tune run
--debug``)."""
STORE_DEFAULTS: dict[str, Any] = {"results": "results", "storage": None}
"""Where a study's results live: options of run, leaderboard and best, also accepted before the
command's name."""
STORE_COMMANDS = ("run", "leaderboard", "best", "report", "profile", "calibrate", "space",
                  "estimate")  # fmt: skip
OPTUNA_COMMANDS = STORE_COMMANDS[:4]


class _VersionAction(argparse.Action):
    """``--version``, reading the installed metadata only when asked (it is slow to import)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:  # fmt: skip
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
        option_string: str | None = None,
    ) -> None:  # fmt: skip
        import tuner

        sys.stdout.write(f"tune {tuner.__version__} ({tuner.DISTRIBUTION})\n")
        parser.exit()


def _add_global_options(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: an option left out after the command must not reset one given before it.
    s = argparse.SUPPRESS
    parser.add_argument("--debug", action="store_true", default=s, help="show tracebacks")
    parser.add_argument("-v", "--verbose", action="store_true", default=s, help="log progress")
    parser.add_argument("--quiet", action="store_true", default=s,
                        help="tune run: no live display")  # fmt: skip


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    s = argparse.SUPPRESS
    parser.add_argument("--storage", default=s, metavar="URL",
                        help="SQLAlchemy URL or journal file (default: the results directory's "
                        "STUDY/study.db)")  # fmt: skip
    parser.add_argument("--results", default=s, metavar="DIR",
                        help="results directory (default: results)")  # fmt: skip


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    """The argument parser and the handler of each subcommand."""
    parser = argparse.ArgumentParser(
        prog="tune",
        description="Find the fastest Megatron-LM / DeepSpeed parallel configuration.",
        epilog=FLOPS_HELP,
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    _add_global_options(parser)
    _add_store_options(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    handlers: dict[str, Handler] = {}

    p = sub.add_parser("estimate", help="validate one config and predict its memory and time")
    p.add_argument("--study", required=True, help="study name, or a path to a YAML file")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE",
        help="a knob: tp, pp, cp, vp, sp, mbs, recompute, recompute_method, "
        "recompute_num_layers, distributed_optimizer, zero_stage (repeatable)",
    )  # fmt: skip
    add_format_option(p)
    handlers["estimate"] = _cmd_estimate

    p = sub.add_parser("space", help="count, validate and prune the study's search space")
    p.add_argument("--study", required=True)
    add_format_option(p)
    p.add_argument("--top", type=int, default=0, metavar="K", help="show the K fastest predicted")
    handlers["space"] = _cmd_space

    p = sub.add_parser("run", help="search: launch short real runs and record them")
    p.add_argument("--study", required=True)
    p.add_argument("--n-trials", type=int, default=None, help="override search.n_trials")
    p.add_argument("--dry-run", action="store_true", help="rank and prune, launch nothing")
    p.add_argument("--force", action="store_true", help="resume even if the study file changed")
    add_format_option(p, ("text", "json"))
    p.add_argument(
        "--rerun", default="", metavar="OUTCOME[,OUTCOME]",
        help="run again, once, the configs whose trials ended so (e.g. timeout,hang)",
    )  # fmt: skip
    p.add_argument(
        "--skip-preflight", action="store_true",
        help="launch without checking every node first (reachable, paths, GPUs)",
    )  # fmt: skip
    handlers["run"] = _cmd_run

    p = sub.add_parser("leaderboard", help="every measured config, fastest first")
    p.add_argument("--study", required=True)
    add_format_option(p, ("table", "csv", "json", "markdown"), json_synonym=False)
    p.add_argument("--all", action="store_true", help="include pruned and failed trials")
    handlers["leaderboard"] = _cmd_leaderboard

    p = sub.add_parser("best", help="the winning config as a launch script, args or ds_config")
    p.add_argument("--study", required=True)
    p.add_argument("--emit", choices=["script", "sbatch", "args", "ds-config", "torchtitan"],
                   default="script")  # fmt: skip
    p.add_argument("--train-iters", type=int, default=None, metavar="N",
                   help="iterations of the exported script (default: the study's)")  # fmt: skip
    add_format_option(p, ("text", "json"), json_synonym=False)
    handlers["best"] = _cmd_best
    cli_profile.add_parsers(sub, handlers, add_format_option)

    from tuner.cli import parse_log as logs_cli

    logs_cli.add_parser(sub)
    handlers["parse-log"] = logs_cli.run
    from tuner.cli import report as report_cli

    report_cli.add_parser(sub)
    handlers["report"] = report_cli.run
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
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
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
    parser, handlers = build_parser()
    args = parse_args(parser, argv)
    _configure_logging(args)
    try:
        return handlers[args.command](args)
    except TunerError as exc:
        if args.debug:
            raise
        sys.stderr.write(f"tune: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("tune: interrupted\n")
        return 130
    except OSError as exc:  # a read-only or full results folder, a file that vanished
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        sys.stderr.write(f"tune: error: {where}{exc.strerror or exc}\n")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
