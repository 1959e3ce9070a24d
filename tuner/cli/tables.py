"""What ``tune`` prints: rich tables of estimates, spaces and leaderboards, and JSON.

Shared by ``tuner.cli.commands`` and ``tuner.cli.profile`` (which cannot import the CLI itself).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tuner.cli import render
from tuner.config.parallel import ParallelConfig
from tuner.config.spelling import spell, split_constant
from tuner.report import units
from tuner.spec.study import StudySpec

if TYPE_CHECKING:  # annotations only: `tune --version` and `--help` load no model
    from tuner.space.enumerate import Candidate

MEMORY_TERMS = (
    "weights grads optimizer activations stage_extras framework_buffers workspaces slack "
    "cuda_context comm_buffers allocated_gib reserved_gib device_gib peak_gib"
).split()


TIME_TERMS = (
    "compute recompute tp_comm cp_comm ep_comm pp_p2p pp_bubble dp_comm optimizer stage_imbalance "
    "overhead fp8_cast moe_routing step"
).split()


def _console() -> Console:
    return render.console()


def wrote(command: str, paths: Sequence[object], what: str = "") -> str:
    """The one line every command that writes files says it with: ``tune best: wrote
    launch.sh, ds_config.json``, ``tune report: wrote 9 PNG files in figures`` (``what``: the
    files in words, ``paths`` then their folder)."""
    where = ", ".join(str(p) for p in paths)
    return f"tune {command}: wrote {what} in {where}" if what else f"tune {command}: wrote {where}"


def _emit_json(data: Any) -> None:
    """``data`` on stdout as one JSON document (every command's ``--format json``)."""
    sys.stdout.write(json.dumps(finite(data), indent=2, default=str, allow_nan=False) + "\n")


def finite(data: Any) -> Any:
    """``data`` with every float that is not finite written as None (JSON's null): ``NaN`` and
    ``Infinity``, which :func:`json.dumps` writes by default, are no JSON, and jq or a browser's
    ``JSON.parse`` refuse the whole document. A stored figure may be one (a trial's hand-edited
    attribute, a profile's rate that makes a step infinite); the leaderboard's JSON, written by
    pandas, already had null there."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data


def config_of(data: dict[str, Any]) -> ParallelConfig:
    """A config back from its JSON form (``ParallelConfig.to_dict``, which adds grad_accum)."""
    return ParallelConfig(**{k: v for k, v in data.items() if k != "grad_accum"})


def _print_estimate(
    result: dict[str, Any], headroom: float, stage_columns: list[str] | None = None
) -> None:
    """``tune estimate``'s tables (``stage_columns``: ``--columns`` of the per-stage one)."""
    console = _console()
    console.print(f"config: {spell(config_of(result['config']))}", markup=False)
    if not result["valid"]:
        return
    memory = result["memory"]
    _print_memory_terms(console, memory)
    _print_stage_table(console, memory, stage_columns)
    time = result["time"]
    rows = [(key, units.seconds(time[key])) for key in TIME_TERMS if time[key] or key == "step"]
    zero = [key for key in TIME_TERMS if not time[key] and key != "step"]
    notes = (f"0 s in this config: {', '.join(zero)}",) if zero else ()
    render.render(console, render.Grid(
        title="predicted step time (critical path)",
        columns=(render.Column(name="term", header="term", right=False),
                 render.Column(name="seconds", header="s")),
        rows=tuple(rows), notes=notes,
    ))  # fmt: skip
    error = result.get("time_error")
    if error:
        low, high = result["step_band_s"]
        console.print(f"step {units.seconds(time['step'])} s, 90% band {units.seconds(low)}-"
                      f"{units.seconds(high)} s (sd {error:.0%}: "
                      f"{result['time_error_from']})")  # fmt: skip
    console.print(
        f"tokens/s {units.rate(time['tokens_per_s'])} ({units.rate(time['tokens_per_s_per_gpu'])} "
        f"per GPU), {units.tflops(time['model_tflops_per_gpu'])} model TFLOP/s per GPU, MFU "
        f"{units.percent(time['mfu'])}%, HFU {units.percent(time['hfu'])}%"
    )
    verdict = "[green]fits[/]" if result["fits"] else "[red]predicted OOM[/]"
    if result.get("memory_risk"):
        verdict = "[yellow]fits, at risk[/]"
    low, high = result["memory"]["band_gib"]
    console.print(
        f"{verdict}: peak {units.gib(result['memory']['peak_gib'])} GiB (90% band "
        f"{units.gib(low)}-{units.gib(high)}) vs {headroom:.0%} of "
        f"{units.gib(result['gpu_memory_gib'])} GiB; "
        f"{units.percent(result['fit_probability'])}% likely within the GPU's memory"
    )


def _print_memory_terms(console: Console, memory: dict[str, Any]) -> None:
    title = (
        f"memory per GPU: peak at stage {memory['stage']}, {memory['phase']} "
        f"(sd {memory['uncertainty']:.0%}: {_sources_said(memory['sources'])})"
    )
    rows = [(k, units.gib(memory[k])) for k in MEMORY_TERMS if memory[k] or k.endswith("_gib")]
    zero = [k for k in MEMORY_TERMS if not memory[k] and not k.endswith("_gib")]
    notes = (f"0 GiB in this config: {', '.join(zero)}",) if zero else ()
    render.render(console, render.Grid(
        title=title, columns=(render.Column(name="term", header="term", right=False),
                              render.Column(name="gib", header="GiB")),
        rows=tuple(rows), notes=notes,
    ))  # fmt: skip


def _sources_said(sources: dict[str, dict[str, Any]]) -> str:
    """Where a breakdown's terms came from, in a few words: "all terms from the catalog
    (held-out error)" or the measured ones named."""
    measured = [name for name, s in sources.items() if s["source"] == "measured"]
    if not measured:
        return "all terms from the catalog, at its held-out error"
    return f"measured on this stack: {', '.join(measured)}; the rest from the catalog"


def _stage(name: str, header: str, meaning: str) -> render.Column:
    return render.Column(name=name, header=header, right=name != "peak_phase",
                         number=name == "stage", meaning=meaning)  # fmt: skip


STAGE_COLUMNS = (
    _stage("stage", "stage", "pipeline stage (0 holds the embedding)"),
    _stage("layers", "layers", "transformer layers on the stage"),
    _stage(
        "device_gib",
        "device\nGiB",
        "predicted device memory of one GPU of the stage at its peak: reserved plus overhead",
    ),
    _stage(
        "peak_phase",
        "peak\nphase",
        "where in the step the stage peaks: fwd_bwd (forward "
        "and backward) or step (the optimizer step)",
    ),
    _stage("weights", "weights\nGiB", "parameters one GPU holds"),
    _stage(
        "optimizer",
        "optimizer\nGiB",
        "optimizer states one GPU holds (sharded over dp with distopt or ZeRO)",
    ),
    _stage(
        "activations",
        "activations\nGiB",
        "saved activations of the in-flight "
        "micro-batches, with the stage's embedding and loss extras",
    ),
    _stage("grads", "grads\nGiB", "gradients one GPU holds"),
    _stage(
        "in_flight",
        "in-flight\nmicro-b.",
        "micro-batches whose activations the stage holds at its peak",
    ),
    _stage("allocated_gib", "allocated\nGiB", "live tensors: PyTorch's max_memory_allocated"),
    _stage("reserved_gib", "reserved\nGiB", "allocated plus the caching allocator's slack"),
    _stage(
        "buffers",
        "buffers\nGiB",
        "framework buffers (gradient buckets, gathered ZeRO-3 parameters) and GEMM workspaces",
    ),
    _stage("slack", "slack\nGiB", "reserved by the caching allocator but not allocated"),
    _stage(
        "overhead", "overhead\nGiB", "outside PyTorch's allocator: CUDA context and NCCL buffers"
    ),
)
"""The per-stage table's columns, most important first (what ``--columns`` would name)."""


def _stage_cells(s: dict[str, Any]) -> dict[str, str]:
    p = next(p for p in s["phases"] if p["phase"] == s["peak_phase"])
    cells = {k: units.gib(p[k]) for k in ("weights", "grads", "optimizer", "slack")}
    cells |= {k: units.gib(s[k]) for k in ("allocated_gib", "reserved_gib", "device_gib")}
    return cells | {
        "stage": str(s["stage"]), "layers": str(s["layers"]), "in_flight": f"{s['in_flight']:g}",
        "activations": units.gib(p["activations"] + p["stage_extras"]),
        "buffers": units.gib(p["framework_buffers"] + p["workspaces"]),
        "overhead": units.gib(p["cuda_context"] + p["comm_buffers"]),
        "peak_phase": s["peak_phase"],
    }  # fmt: skip


def _print_stage_table(console: Console, memory: dict[str, Any], names: list[str] | None) -> None:
    cells = [_stage_cells(s) for s in memory["stages"]]
    render.render(console, render.Grid(
        title="per pipeline stage, at each stage's peak phase", columns=STAGE_COLUMNS,
        rows=tuple(tuple(c[col.name] for col in STAGE_COLUMNS) for c in cells),
    ), names)  # fmt: skip


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


TOP_COLUMNS = (
    render.Column(name="rank", header="rank", meaning="place in the predicted ranking"),
    render.CONFIG,
    render.Column(name="step_s", header="step s", meaning="predicted time of one optimizer step"),
    render.Column(
        name="tokens_per_s_per_gpu",
        header="tok/s/GPU",
        meaning="predicted tokens per second per GPU",
    ),
    render.Column(
        name="mfu",
        header="MFU %",
        meaning="model FLOPs utilisation: model FLOP/s over the GPUs' peak",
    ),
    render.Column(
        name="peak_gib",
        header="peak GiB",
        meaning="predicted peak device memory of the busiest GPU",
    ),
    render.Column(name="pp_bubble", header="bubble s", meaning="pipeline bubble per step"),
    render.Column(
        name="tp_comm",
        header="tp comm s",
        meaning="tensor-parallel communication on the critical path per step",
    ),
    render.Column(
        name="dp_comm",
        header="dp comm s",
        meaning="data-parallel gradient communication not hidden by compute",
    ),
)
"""``tune space --top`` and ``run --dry-run``: the predicted ranking, most important first."""


def _top_table(title: str, top: list[Candidate], framework: str | None = None) -> render.Grid:
    constant, spelled = split_constant([c.config for c in top], framework)
    rows = []
    for i, (c, config) in enumerate(zip(top, spelled, strict=True), 1):
        t = c.time
        if t is None:
            raise ValueError("a ranked candidate always has a predicted time")
        rows.append((
            str(i), config, units.seconds(t.step), units.rate(t.tokens_per_s_per_gpu),
            units.percent(t.mfu), units.gib(c.memory.peak / 2**30), units.seconds(t.pp_bubble),
            units.seconds(t.tp_comm), units.seconds(t.dp_comm),
        ))  # fmt: skip
    return render.Grid(title=title, columns=TOP_COLUMNS, rows=tuple(rows), constant=constant)


def launch_first_table(first: list[Candidate], framework: str | None = None) -> render.Grid:
    """``tune run --dry-run``'s configs to launch first: ``tune run`` takes no ``--columns``, so
    the note under a narrow table names no option to choose them."""
    grid = _top_table(f"would launch first (top {len(first)} predicted)", first, framework)
    return dataclasses.replace(grid, choosable=False)


def _counts_table(spec: StudySpec, out: dict[str, Any]) -> render.Grid:
    rows = [("total", str(out["total"]))]
    rows += [(f"  invalid: {rule}", str(n)) for rule, n in out["invalid_by_rule"].items()]
    rows += [("invalid", str(out["invalid"])), ("predicted OOM", str(out["predicted_oom"])),
             ("  of them memory probes", str(out.get("memory_probes", 0))),
             ("viable", str(out["viable"]))]  # fmt: skip
    return render.Grid(
        title=f"search space of {spec.name} ({spec.world_size} ranks per trial)",
        columns=(render.Column(name="configs", header="configs", right=False),
                 render.Column(name="count", header="count")),
        rows=tuple(rows),
    )  # fmt: skip
