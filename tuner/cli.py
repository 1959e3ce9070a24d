"""``tune``: the command line. Thin: parse arguments, call the library, print.

Exit codes: 0 success, 1 the job failed, 2 bad usage or bad input (one line on stderr; the
traceback only with ``--debug``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from tuner.errors import TunerError
from tuner.memory import fits
from tuner.parallel import validate
from tuner.space import config_from_settings, enumerate_space, study_gpu
from tuner.spec import load_study

Handler = Callable[[argparse.Namespace], int]


def _console() -> Console:
    return Console(highlight=False)


def _emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


# ----------------------------------------------------------------------------- estimate


def _cmd_estimate(args: argparse.Namespace) -> int:
    spec = load_study(args.study)
    config = config_from_settings(spec, args.set or [])
    gpu = study_gpu(spec)
    errors = validate(config, spec.model, spec.world_size, spec.framework)
    memory = None
    if not errors:
        from tuner.memory import estimate_memory

        memory = estimate_memory(spec.model, config, gpu, spec.framework, spec.training.precision)
    result: dict[str, Any] = {
        "config": config.to_dict(),
        "valid": not errors,
        "errors": [e.message for e in errors],
        "memory": memory.to_dict() if memory else None,
        "gpu_memory_gib": gpu.memory_gib,
        "fits": bool(memory and fits(memory, gpu, spec.search.memory_headroom)),
    }
    if args.json:
        _emit_json(result)
    else:
        _print_estimate(result, spec.search.memory_headroom)
    return 0


def _print_estimate(result: dict[str, Any], headroom: float) -> None:
    console = _console()
    cfg = ", ".join(f"{k}={v}" for k, v in result["config"].items() if v is not None)
    console.print(f"[bold]config[/]: {cfg}")
    if not result["valid"]:
        for message in result["errors"]:
            console.print(f"[red]invalid[/]: {message}")
        return
    table = Table(title="predicted memory per GPU (most loaded rank)")
    table.add_column("term")
    table.add_column("GiB", justify="right")
    for key, value in result["memory"].items():
        style = "bold" if key in ("allocated_gib", "peak_gib") else ""
        table.add_row(key, f"{value:.2f}", style=style)
    console.print(table)
    verdict = "[green]fits[/]" if result["fits"] else "[red]predicted OOM[/]"
    console.print(
        f"{verdict}: peak {result['memory']['peak_gib']:.2f} GiB vs "
        f"{headroom:.0%} of {result['gpu_memory_gib']:.1f} GiB"
    )


# ----------------------------------------------------------------------------- space


def _cmd_space(args: argparse.Namespace) -> int:
    spec = load_study(args.study)
    report = enumerate_space(spec)
    out = report.counts()
    if args.json:
        _emit_json(out)
        return 0
    console = _console()
    table = Table(title=f"search space of {spec.name} ({spec.world_size} ranks per trial)")
    table.add_column("configs")
    table.add_column("count", justify="right")
    table.add_row("total", str(out["total"]))
    for rule, count in out["invalid_by_rule"].items():
        table.add_row(f"  invalid: {rule}", str(count))
    table.add_row("invalid", str(out["invalid"]))
    table.add_row("predicted OOM", str(out["predicted_oom"]))
    table.add_row("viable", str(out["viable"]), style="bold")
    console.print(table)
    return 0


# ----------------------------------------------------------------------------- main


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    """The argument parser and the handler of each subcommand."""
    parser = argparse.ArgumentParser(
        prog="tune",
        description="Find the fastest Megatron-LM / DeepSpeed parallel configuration.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = parser.add_subparsers(dest="command", required=True)
    handlers: dict[str, Handler] = {}

    p = sub.add_parser("estimate", help="validate one config and predict its memory and time")
    p.add_argument("--study", required=True, help="study name, or a path to a YAML file")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE",
        help="a knob: tp, pp, cp, vp, sp, mbs, recompute, recompute_method, "
        "recompute_num_layers, distributed_optimizer, zero_stage (repeatable)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    handlers["estimate"] = _cmd_estimate

    p = sub.add_parser("space", help="count, validate and prune the study's search space")
    p.add_argument("--study", required=True)
    p.add_argument("--json", action="store_true")
    p.add_argument("--top", type=int, default=0, metavar="K", help="show the K fastest predicted")
    handlers["space"] = _cmd_space
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tune`` script."""
    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
