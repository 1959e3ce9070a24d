"""What ``tune`` prints: rich tables of estimates, spaces and leaderboards, and JSON.

Shared by ``tuner.cli.main`` and ``tuner.cli.profile`` (which cannot import the CLI itself).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from tuner.space.enumerate import Candidate
from tuner.spec.study import StudySpec

MEMORY_TERMS = (
    "weights grads optimizer activations stage_extras framework_buffers workspaces slack "
    "cuda_context comm_buffers allocated_gib reserved_gib device_gib peak_gib"
).split()


TIME_TERMS = (
    "compute recompute tp_comm cp_comm ep_comm pp_p2p pp_bubble dp_comm optimizer stage_imbalance "
    "overhead fp8_cast moe_routing step"
).split()


def _console() -> Console:
    # Wide tables stay readable when the output goes to a file or a pipe.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _print_estimate(result: dict[str, Any], headroom: float) -> None:
    console = _console()
    cfg = ", ".join(f"{k}={v}" for k, v in result["config"].items() if v is not None)
    console.print(f"[bold]config[/]: {cfg}")
    if not result["valid"]:
        for message in result["errors"]:
            console.print(f"[red]invalid[/]: {message}")
        return
    memory = result["memory"]
    _print_memory_terms(console, memory)
    _print_stage_table(console, memory)
    time = result["time"]
    table = Table(title="predicted step time (critical path)")
    table.add_column("term")
    table.add_column("seconds", justify="right")
    for key in TIME_TERMS:
        table.add_row(key, f"{time[key]:.4f}", style="bold" if key == "step" else "")
    console.print(table)
    error = result.get("time_error")
    if error:
        console.print(f"step {time['step']:.4g} s, +-{error:.0%} (the catalog rates' rms error "
                      "on published runs)")  # fmt: skip
    console.print(
        f"tokens/s {time['tokens_per_s']:,.0f} ({time['tokens_per_s_per_gpu']:,.0f} per GPU), "
        f"{time['model_tflops_per_gpu']:.1f} model TFLOP/s per GPU, MFU {time['mfu']:.1%}, "
        f"HFU {time['hfu']:.1%}"
    )
    verdict = "[green]fits[/]" if result["fits"] else "[red]predicted OOM[/]"
    console.print(
        f"{verdict}: peak {result['memory']['peak_gib']:.2f} GiB vs "
        f"{headroom:.0%} of {result['gpu_memory_gib']:.1f} GiB"
    )


def _print_memory_terms(console: Console, memory: dict[str, Any]) -> None:
    title = (
        f"memory per GPU: peak at stage {memory['stage']}, {memory['phase']} "
        f"(+-{memory['uncertainty']:.0%})"
    )
    table = Table(title=title)
    table.add_column("term")
    table.add_column("GiB", justify="right")
    for key in MEMORY_TERMS:
        style = "bold" if key.endswith("_gib") else ""
        table.add_row(key, f"{memory[key]:.2f}", style=style)
    console.print(table)


def _print_stage_table(console: Console, memory: dict[str, Any]) -> None:
    table = Table(title="per pipeline stage, at each stage's peak phase (GiB)")
    heads = (
        "stage",
        "layers",
        "in-flight",
        "weights",
        "grads",
        "optimizer",
        "activations",
        "buffers",
        "slack",
        "overhead",
        "allocated",
        "reserved",
        "device",
        "peak phase",
    )
    for head in heads:  # fmt: skip
        table.add_column(head, justify="left" if head == "peak phase" else "right")
    for s in memory["stages"]:
        p = next(p for p in s["phases"] if p["phase"] == s["peak_phase"])
        row = [
            str(s["stage"]), str(s["layers"]), f"{s['in_flight']:g}",
            *(f"{p[k]:.2f}" for k in ("weights", "grads", "optimizer")),
            f"{p['activations'] + p['stage_extras']:.2f}",
            f"{p['framework_buffers'] + p['workspaces']:.2f}", f"{p['slack']:.2f}",
            f"{p['cuda_context'] + p['comm_buffers']:.2f}",
            *(f"{s[k]:.2f}" for k in ("allocated_gib", "reserved_gib", "device_gib")),
            s["peak_phase"],
        ]  # fmt: skip
        table.add_row(*row)
    console.print(table)


def _candidate_json(c: Candidate) -> dict[str, Any]:
    t = c.time
    return {
        "config": c.config.to_dict(),
        "step_s": t.step if t else None,
        "tokens_per_s": t.tokens_per_s if t else None,
        "mfu": t.mfu if t else None,
        "peak_gib": c.memory.to_dict()["peak_gib"],
        "time": t.to_dict() if t else None,
    }


def _short(c: Candidate) -> str:
    k = c.config
    rc = k.recompute_setting
    parts = [f"tp{k.tp}", f"pp{k.pp}", f"dp{k.dp}"]
    parts += [f"cp{k.cp}"] if k.cp > 1 else []
    parts += [f"vp{k.vp}"] if k.vp > 1 else []
    parts += ["sp"] if k.sequence_parallel else []
    parts += ["tpo"] if k.tp_comm_overlap else []
    parts += [f"ep{k.ep}"] if k.moe_key else []
    parts += [f"etp{k.etp}"] if k.etp is not None else []
    parts += [k.moe_token_dispatcher] if k.moe_token_dispatcher != "alltoall" else []
    parts += [f"mbs{k.micro_batch_size}", f"ga{k.num_microbatches}", rc]
    parts += ["distopt"] if k.distributed_optimizer else []
    parts += [f"zero{k.zero_stage}"] if k.zero_stage else []
    parts += [f"hsdp{k.dp_replicate}"] if k.dp_replicate > 1 else []  # torchtitan's knobs
    parts += [k.pp_schedule] if k.pp_schedule else []
    parts += [f"reshard-{k.reshard_after_forward}"] if k.reshard_after_forward != "default" else []
    parts += ["compile"] if k.compile else []
    return " ".join(parts)


def _gib(value: float) -> str:
    """GiB with one decimal, or three significant digits below 10 (a CPU demo's 0.106)."""
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def _top_table(title: str, top: list[Candidate]) -> Table:
    table = Table(title=title)
    for col in ("#", "config", "step s", "tok/s/GPU", "MFU", "peak GiB", "bubble", "tp comm",
                "dp comm"):  # fmt: skip
        if col == "config":
            table.add_column(col, no_wrap=True)
        else:
            table.add_column(col, justify="right")
    for i, c in enumerate(top, 1):
        t = c.time
        assert t is not None
        table.add_row(
            str(i), _short(c), f"{t.step:.3f}", f"{t.tokens_per_s_per_gpu:,.0f}", f"{t.mfu:.1%}",
            _gib(c.memory.peak / 2**30), f"{t.pp_bubble:.3f}", f"{t.tp_comm:.3f}",
            f"{t.dp_comm:.3f}",
        )  # fmt: skip
    return table


def _counts_table(spec: StudySpec, out: dict[str, Any]) -> Table:
    table = Table(title=f"search space of {spec.name} ({spec.world_size} ranks per trial)")
    table.add_column("configs")
    table.add_column("count", justify="right")
    table.add_row("total", str(out["total"]))
    for rule, count in out["invalid_by_rule"].items():
        table.add_row(f"  invalid: {rule}", str(count))
    table.add_row("invalid", str(out["invalid"]))
    table.add_row("predicted OOM", str(out["predicted_oom"]))
    table.add_row("  of them memory probes", str(out.get("memory_probes", 0)))
    table.add_row("viable", str(out["viable"]), style="bold")
    return table


BOARD_HEADERS = {
    "trial": "#", "outcome": "outcome", "tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp",
    "vp": "vp", "sp": "sp", "micro_batch": "mbs", "grad_accum": "ga", "recompute": "recompute",
    "distributed_optimizer": "distopt", "zero_stage": "zero", "ep": "ep", "etp": "etp",
    "dispatcher": "dispatcher", "dp_replicate": "hsdp", "pp_schedule": "schedule",
    "reshard": "reshard", "compile": "compile", "nodes": "nodes",
    "predicted_step_s": "pred s", "measured_step_s": "step s", "tokens_per_s_per_gpu": "tok/s/GPU",
    "tflops_per_gpu": "TFLOP/s", "mfu": "MFU", "predicted_peak_gib": "pred GiB",
    "measured_peak_gib": "GiB", "measured_reserved_gib": "reserved GiB", "duration_s": "took s",
    "reason": "reason",
}  # fmt: skip


def _print_board(spec: StudySpec, board: Any) -> None:
    console = _console()
    shown = [c for c in BOARD_HEADERS if c in board.columns and board[c].notna().any()]
    table = Table(title=f"leaderboard of {spec.name} ({len(board)} configs)")
    for col in shown:
        header = BOARD_HEADERS[col]
        table.add_column(header, no_wrap=col != "reason", min_width=max(len(header), 2))
    for _, row in board.iterrows():
        cells = []
        for col in shown:
            v = row[col]
            text = "" if v is None or v != v else (f"{v:.4g}" if isinstance(v, float) else str(v))
            cells.append(text)
        table.add_row(*cells)
    console.print(table)
