"""Predicted vs measured per-GPU memory peaks on the public calibration set.

Usage: python benchmarks/memory_accuracy.py [--csv PATH] [--published-cases PATH] [--rows]
                                            [--headroom F]

Reads benchmarks/data/memory_peaks.csv (see benchmarks/data/README.md) and compares like with like:
an ``allocated`` row with the model's allocated figure, ``reserved`` with its reserved figure,
``device`` with its device figure. A row that covers one pipeline stage is compared with that
stage when the model gives per-stage figures, else with the model's peak stage. ``oom`` rows are
counted as flagged when the model prunes the config at the study's default headroom; a measured
row that fit but is pruned is a false OOM. ``--published-cases`` also reads the memory rows of
the older shared published_cases.csv. Mixture-of-experts rows (``num_experts`` and the ``moe_*``
columns) run through the same model with their experts and expert grid; targets are judged for
dense and MoE rows apart. A row whose ``unmodelled`` column names a feature no knob expresses is
predicted without it and reported on a "not expressible" line, out of the targets. Rows with a
``resident`` figure (Megatron's mem-allocated-bytes after the optimizer step) are also compared
with the model's step-phase allocated figure, on a "resident" line outside the targets.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import re
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from held_out import Residual, coverage, load_terms, print_loso, print_term_effects

from tuner.catalog import GPUSpec, get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.errors import TunerError
from tuner.models.memory.breakdown import (
    METRIC_PARTS,
    PhaseMemory,
    StageMemory,
    memory_sources,
)
from tuner.models.memory.estimate import GIB, estimate_memory, fits
from tuner.models.uncertainty import (
    MEMORY_GROUPS,
    MEMORY_SIGMA_FLOORS,
    WHOLE_FIGURE_GROUPS,
    combined_sigma,
)
from tuner.space.probes import at_risk
from tuner.spec.moe import MoESpec
from tuner.spec.study import ModelSpec, SearchSpec

DEFAULT_CSV = Path(__file__).resolve().parent / "data" / "memory_peaks.csv"
# GB-smi: a figure read off nvidia-smi's MiB column by eye and written "NNGB" (NN x 1000 MiB;
# benchmarks/data/README.md says why this reading, between 1e9-byte GB and GiB).
UNITS = {"bytes": 1.0, "MiB": 2.0**20, "GiB": GIB, "GB": 1e9, "GB-smi": 1000 * 2.0**20}
# Calibration GPU names -> (catalog entry, memory in GiB or None for the catalog's). The memory
# model reads a GPU only for its capacity (and its stack overheads); a GPU missing from the
# catalog takes the nearest data-center entry and the capacity its source states.
GPUS: dict[str, tuple[str, float | None]] = {
    "A100-SXM4-80GB": ("a100-80gb", None),
    "A100-SXM4-40GB": ("a100-40gb", None),
    "H100-SXM5-80GB": ("h100-sxm-80gb", None),
    "H800-80GB": ("h100-sxm-80gb", None),
    # torchtitan's Grand Teton H100: "96GB HBM2e" (its hardware section), taken as GiB the way
    # the catalog's 80 GB parts are.
    "H100-96GB-HBM2e": ("h100-sxm-80gb", 96.0),
    "H100-96GB-HBM2e-500W": ("h100-sxm-80gb", 96.0),
    # Megatron-LM CI's dgx_gb200 runs: the source states no memory size; the catalog's Blackwell
    # entry stands in (these rows are allocated peaks far below either capacity).
    "GB200": ("b200-180gb", None),
    # Megatron-LM issue #525 prints "31.74 GiB total capacity" for its V100.
    "V100-32GB": ("a100-40gb", 31.74),
}
# Frameworks the model knows. Megatron-DeepSpeed rows (argonne-lcf's fork on Polaris, the
# BigScience 3D runs) are the megatron-deepspeed framework: Megatron's TP shards and padded
# vocabulary, GPTModelPipe's stages, DeepSpeed's optimizer. torchtitan's FSDP2 rows are the
# torchtitan framework (tuner.models.optimizer_layout's FSDP2 layout, per-op selective
# checkpointing in tuner.models.memory.fsdp2); their four rows come from one source and two of
# them ran torch.compile, whose memory effect is not modelled, so they are reported on a line of
# their own, apart from the targets, never dropped.
FRAMEWORKS = {"megatron": "megatron", "megatron-deepspeed": "megatron-deepspeed",
              "deepspeed": "deepspeed", "torchtitan-fsdp2": "torchtitan"}  # fmt: skip
NOT_EXPRESSIBLE = {
    "torchtitan-fsdp2": "predicted as tuner's torchtitan; one source, two torch.compile rows"
}
_SPLIT = re.compile(r"megatron:(first=\d+,last=\d+|account_for_embedding\+loss)|deepspeed:(.+)")
_STAGE = re.compile(r"(?:last pipeline stage|pipeline stage (\d+))")


class Skip(Exception):
    """A row the model cannot express yet; the message says why."""


@dataclass(frozen=True, slots=True)
class Result:
    """One compared row."""

    row: dict[str, str]
    measured: float  # bytes
    predicted: float  # bytes, same metric
    fits: bool  # the config passes the prune at the headroom
    stage: str  # which of the model's stages was compared: "last", its index, or "peak"
    resident: float = 0.0  # predicted bytes alive after the optimizer step, same stage
    parts: dict[str, float] = dataclasses.field(default_factory=dict)  # compared phase's terms
    lazy: float = 0.0  # Adam moments left out of a first-iteration figure (bytes)
    workspace_config: float = 0.0  # bytes the run's CUBLAS_WORKSPACE_CONFIG adds to the figure
    sigma: float = 0.0  # stated relative sd of the figure (tuner.models.uncertainty)
    risk: bool = False  # fits the headroom, but not surely (tuner.space.probes.at_risk)

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def _yes(value: str) -> bool:
    return value.strip().lower() in ("yes", "true", "1")


def row_moe(row: dict[str, str]) -> MoESpec | None:
    """The row's routed experts (``num_experts`` and the ``moe_*`` columns), None when dense."""
    if not row.get("num_experts"):
        return None
    topk = int(row["moe_topk"])
    freq = row["moe_layer_freq"] or "1"
    shared = int(row["moe_shared_ffn"]) if row["moe_shared_ffn"] else None
    return MoESpec(
        num_experts=int(row["num_experts"]), router_topk=topk,
        ffn_hidden_size=int(row["moe_ffn_hidden"]) if row["moe_ffn_hidden"] else None,
        shared_expert_ffn_hidden_size=shared,
        layer_freq=int(freq) if freq.isdigit() else freq,
        router_dtype=row["moe_router_dtype"] or None,  # type: ignore[arg-type]
        grouped_gemm=_yes(row["moe_grouped_gemm"]),
        load_balancing=row["moe_load_balancing"] or "aux_loss",  # type: ignore[arg-type]
    )  # fmt: skip


def row_model(row: dict[str, str]) -> ModelSpec:
    """The row's transformer as a ModelSpec."""
    for key in ("n_layers", "hidden", "ffn_hidden", "heads", "vocab", "seq_len"):
        if not row.get(key):
            raise Skip(f"incomplete shape: {key} missing")
    heads = int(row["heads"])
    return ModelSpec(
        name=row.get("model", "row"), num_layers=int(row["n_layers"]),
        hidden_size=int(row["hidden"]), ffn_hidden_size=int(row["ffn_hidden"]),
        num_attention_heads=heads, num_query_groups=int(row["kv_heads"] or heads),
        vocab_size=int(row["vocab"]), seq_length=int(row["seq_len"]),
        swiglu=row["activation"] == "swiglu", tied_embeddings=_yes(row["tied"]),
        normalization="rmsnorm" if row["norm"] == "rmsnorm" else "layernorm",
        position_embedding="rope" if row["position_embedding"] == "rope" else "learned_absolute",
        dropout=_yes(row["dropout"]), flash_attention=row["attention"] == "flash",
        add_bias_linear=_yes(row["bias"]), moe=row_moe(row),
    )  # fmt: skip


def _split_kwargs(row: dict[str, str]) -> dict[str, Any]:
    """The row's pipeline split as the study's ``pipeline_split`` value (``first=2,last=2``,
    ``embedding+loss``), or Skip if it can't be expressed."""
    split = row.get("pipeline_split", "")
    if not split:
        return {}
    match = _SPLIT.match(split)
    if match is None:
        raise Skip(f"pipeline split not expressible: {split.split(' (')[0]}")
    if match.group(2):  # a DeepSpeed partition method (type:REGEX, uniform, parameters)
        return {"pipeline_split": match.group(2)}
    value = match.group(1)
    return {"pipeline_split": "embedding+loss" if value.startswith("account") else value}


def _moe_kwargs(row: dict[str, str]) -> dict[str, Any]:
    """The row's expert parallelism (empty for a dense row: the config's defaults)."""
    if not row.get("num_experts"):
        return {}
    etp = row.get("etp")
    return {"ep": int(row["ep"] or 1), "etp": int(etp) if etp else None,
            "moe_token_dispatcher": row["moe_dispatcher"]}  # fmt: skip


def row_config(row: dict[str, str]) -> ParallelConfig:
    """The row's parallel layout as a ParallelConfig."""
    rc = row["recompute"] or "none"
    full = rc == "full"
    method = row.get("recompute_method") or "uniform"
    try:
        return ParallelConfig(
            tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]), cp=int(row["cp"] or 1),
            vp=int(row["vp"] or 1), micro_batch_size=int(row["micro_batch"]),
            global_batch_size=int(row["global_batch"]), recompute=rc,  # type: ignore[arg-type]
            recompute_method=method if full else None,  # type: ignore[arg-type]
            recompute_num_layers=int(row["recompute_num_layers"] or 1) if full else None,
            sequence_parallel=_yes(row["sequence_parallel"]),
            distributed_optimizer=_yes(row["distributed_optimizer"]),
            zero_stage=int(row["zero_stage"] or 0), **_split_kwargs(row), **_moe_kwargs(row),
        )  # fmt: skip
    except (TypeError, TunerError) as exc:
        raise Skip(f"config not accepted: {exc}") from exc


_WORKSPACE_CONFIG = re.compile(r":(\d+):(\d+)")


def cublas_workspace_mib(config: str) -> float | None:
    """PyTorch's cuBLAS workspace per handle that ``CUBLAS_WORKSPACE_CONFIG`` sets, MiB: the sum
    of SIZE KiB x COUNT over its ``:SIZE:COUNT`` pairs (aten/src/ATen/cuda/CublasHandlePool.cpp
    parseChosenWorkspaceSize); None when the row's run left it unset (the catalog's default)."""
    pairs = _WORKSPACE_CONFIG.findall(config)
    return sum(int(size) * int(count) for size, count in pairs) / 1024 if pairs else None


def row_gpu(row: dict[str, str]) -> GPUSpec:
    """The catalog GPU a row ran on, with the capacity its source states where it differs and
    the cuBLAS workspace its run's ``CUBLAS_WORKSPACE_CONFIG`` set (Megatron-LM's CI sets
    ``:4096:8`` in most model_config.yaml ENV_VARS)."""
    if row["gpu_type"] not in GPUS:
        raise Skip(f"GPU {row['gpu_type']!r} has no catalog mapping")
    name, memory = GPUS[row["gpu_type"]]
    workspace = cublas_workspace_mib(row.get("cublas_workspace_config", ""))
    return get_gpu(name, memory, {"cublas_workspace_mib": workspace} if workspace else None)


# A log printed after the first iteration (Megatron's report_memory at iteration 1) shows that
# iteration's peaks: its forward/backward ran before Adam's lazily created moments existed.
_FIRST_ITERATION = re.compile(r"after (?:the first|1) iteration")


def _figure(part: object, metric: str, first_iteration: bool = False) -> float:
    """The model's figure a row's metric measures: allocated, reserved or device; for a whole
    breakdown (no stage named) the largest over its stages and phases."""
    stages = getattr(part, "stages", None)
    if stages:
        return max(_figure(s, metric, first_iteration) for s in stages)
    if metric == "allocated" and first_iteration and hasattr(part, "first_iteration_allocated"):
        return float(part.first_iteration_allocated)
    return float(getattr(part, metric))


def predict(row: dict[str, str], headroom: float) -> Result:
    """Compare one row with the model (raises Skip for rows it can't express)."""
    framework = FRAMEWORKS.get(row["framework"])
    if framework is None:
        raise Skip(f"framework {row['framework']!r} not modelled")
    model, config, gpu = row_model(row), row_config(row), row_gpu(row)
    mem = estimate_memory(model, config, gpu, framework, row["precision"])  # type: ignore[arg-type]
    part, which = _stage_part(mem, row["stage"])
    measured = float(row["value"]) * UNITS[row["unit"]]
    first = bool(_FIRST_ITERATION.search(row.get("notes", "")))
    figure = _figure(part, row["metric"], first)
    phase, lazy = _compared_phase(part, row["metric"], first)
    parts = {n: float(getattr(phase, n)) for n in METRIC_PARTS[row["metric"]]}
    parts["optimizer"] -= lazy
    sigma = combined_sigma(parts, memory_sources())
    default = dict(row, cublas_workspace_config="")
    plain = _figure(_stage_part(estimate_memory(
        model, config, row_gpu(default), framework, row["precision"]),  # type: ignore[arg-type]
        row["stage"])[0], row["metric"], first)  # fmt: skip
    risk = at_risk(mem.peak / GIB, gpu.memory_gib, mem.sigma)
    return Result(row, measured, figure, fits(mem, gpu, headroom), which, _resident(part), parts,
                  lazy, figure - plain, sigma, risk)  # fmt: skip


def _compared_phase(part: object, metric: str, first: bool) -> tuple[PhaseMemory, float]:
    """The (stage's) phase whose ``metric`` figure ``_figure`` reports, and the Adam moments a
    first-iteration figure leaves out of it."""
    stages = getattr(part, "stages", None)
    if stages:
        return max((_compared_phase(s, metric, first) for s in stages),
                   key=lambda pl: _metric(pl[0], metric) - pl[1])  # fmt: skip
    assert isinstance(part, StageMemory)
    fwd, step = part.phases
    if metric == "allocated" and first:
        lazy = part.lazy_optimizer
        return (fwd, lazy) if fwd.allocated - lazy >= step.allocated else (step, 0.0)
    return max(part.phases, key=lambda p: _metric(p, metric)), 0.0


def _metric(phase: PhaseMemory, metric: str) -> float:
    return float(getattr(phase, metric))


def _resident(part: object) -> float:
    """The model's step-phase allocated figure (largest over stages for a whole breakdown):
    states, workspaces and what the step leaves until the next ``zero_grad``. Megatron logs
    ``mem-allocated-bytes`` (torch ``allocated_bytes.all.current``) in training_log, after
    train_step has returned (megatron/training/training.py), when just these are alive."""
    stages = getattr(part, "stages", None)
    if stages:
        return max(_resident(s) for s in stages)
    phases = getattr(part, "phases", None)
    return float(phases[1].allocated) if phases else 0.0


def _stage_part(mem: object, stage: str) -> tuple[object, str]:
    """The model's figures for the pipeline stage a row measured ("last pipeline stage ..." or
    "pipeline stage N ...") when the model gives per-stage figures (``.stages``), else its peak."""
    stages = getattr(mem, "stages", None)
    match = _STAGE.match(stage)
    if not stages or match is None:
        return mem, "peak"
    seq = list(stages.values() if isinstance(stages, dict) else stages)
    index = len(seq) - 1 if match.group(1) is None else int(match.group(1))
    if index < len(seq) and hasattr(seq[index], "allocated"):
        return seq[index], "last" if index == len(seq) - 1 else str(index)
    return mem, "peak"


def published_cases_rows(path: Path) -> list[dict[str, str]]:
    """The memory rows of the older shared published_cases.csv in this file's column layout."""
    metrics = {"peak_mem_GB_max_allocated": ("allocated", "GB"),
               "peak_mem_GiB_reserved": ("reserved", "GiB")}  # fmt: skip
    out = []
    for old in csv.DictReader(path.open()):
        if old["metric"] not in metrics:
            continue
        llama = "llama" in old["model"].lower()
        metric, unit = metrics[old["metric"]]
        sharding = old["distributed_optimizer"]
        fsdp = "ZeRO-3" in sharding
        out.append({
            **old, "source": "published_cases", "metric": metric, "unit": unit, "outcome": "ok",
            "framework": "torchtitan-fsdp2" if fsdp else "megatron",
            "zero_stage": "3" if fsdp else "0",
            "distributed_optimizer": "no" if fsdp or sharding in ("", "no") else "yes",
            "recompute": (old["recompute"] or "none").split()[0], "recompute_method": "",
            "recompute_num_layers": "", "activation": "swiglu" if llama else "gelu",
            "norm": "rmsnorm" if llama else "layernorm", "tied": "no" if llama else "yes",
            "position_embedding": "rope" if llama else "learned_absolute",
            "bias": "no" if llama else "yes", "dropout": "no" if llama else "yes",
            "attention": "flash", "precision": "bf16", "stage": "", "pipeline_split": "",
        })  # fmt: skip
    return out


def _summary(label: str, results: list[Result], ooms: list[Result]) -> str:
    errs = [abs(r.error) for r in results]
    under = sum(r.error < 0 for r in results)
    false_oom = sum(not r.fits for r in results)
    flagged = sum(not r.fits for r in ooms)
    med = f"{statistics.median(errs):6.1%}" if errs else "     -"
    worst = f"{max(errs):6.1%}" if errs else "     -"
    share = f"{under / len(results):5.0%}" if results else "    -"
    fo = f"{false_oom}/{len(results)}" if results else "-"
    fl = f"{flagged}/{len(ooms)}" if ooms else "-"
    return f"{label:38} {len(results):>5} {med:>7} {worst:>7} {share:>6} {fl:>7} {fo:>7}"


def _groups(results: Iterable[Result]) -> dict[tuple[str, str], list[Result]]:
    out: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        out.setdefault((r.row["source"], r.row["metric"]), []).append(r)
    return out


def _print_rows(results: list[Result]) -> None:
    print(f"{'model':44} {'gpu':15} {'tp':>2} {'pp':>2} {'dp':>3} {'vp':>2} {'metric':9} "
          f"{'stage':5} {'measured':>8} {'predict':>8} {'error':>7}  fits (GiB)")  # fmt: skip
    for r in results:
        row = r.row
        oom = row["outcome"] == "oom"
        err = "  >" if oom else f"{r.error:+7.1%}"
        print(f"{row['model'][:44]:44} {row['gpu_type'][:15]:15} {row['tp']:>2} {row['pp']:>2} "
              f"{row['dp']:>3} {row['vp'] or 1:>2} {row['metric']:9} {r.stage:5} "
              f"{r.measured / GIB:8.2f} {r.predicted / GIB:8.2f} {err:>7}  "
              f"{'yes' if r.fits else 'no'}{' (known OOM)' if oom else ''}")  # fmt: skip
    print()


def _layout(row: dict[str, str]) -> tuple[str, ...]:
    keys = ("source", "model", "gpu_type", "tp", "pp", "dp", "cp", "vp", "micro_batch",
            "global_batch", "recompute", "zero_stage", "distributed_optimizer")  # fmt: skip
    return tuple(row[k] for k in keys)


def _fits_elsewhere(oom: Result, fit: list[Result]) -> bool:
    """An OOM row whose exact config and GPU also ran fine in the same source (another software
    image): the OOM depends on the stack, which the row's config cannot tell the model."""
    return any(_layout(r.row) == _layout(oom.row) for r in fit)


def _unmodelled(row: dict[str, str]) -> bool:
    """A row with a feature no knob of the tuner expresses: compared for reference only."""
    return row["framework"] in NOT_EXPRESSIBLE or bool(row.get("unmodelled"))


def _print_unmodelled(results: list[Result]) -> None:
    """One line per source of rows whose ``unmodelled`` column names a missing feature; they
    are predicted with that feature left out, for reference, then their reasons counted."""
    for source in sorted({r.row["source"] for r in results}):
        rows_of = [r for r in results if r.row["source"] == source]
        print(_summary(f"not expressible: {source}", rows_of, []) + "  (features the "
              "tuner has no knob for; predicted without them)")  # fmt: skip
        reasons: dict[str, int] = {}
        for r in rows_of:
            reasons[r.row["unmodelled"]] = reasons.get(r.row["unmodelled"], 0) + 1
        for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            print(f"    {n:3} x {why}")


def _targets_met(fit: list[Result], ooms: list[Result]) -> bool:
    """Median and max error within 5% / 15%, every known OOM flagged, <= 5% false OOMs."""
    errs = [abs(r.error) for r in fit]
    return (
        bool(errs)
        and statistics.median(errs) <= 0.05
        and max(errs) <= 0.15
        and all(not r.fits for r in ooms)
        and sum(not r.fits for r in fit) <= 0.05 * len(fit)
    )


TERMS_CSV = Path(__file__).resolve().parent / "data" / "memory_terms.csv"
HELD_OUT_SOURCES = ("bigscience-tr11-prequel",)
"""Sources added after every term (issue 35), never used to develop or tune one: reported with
the others per source, kept out of the targets, which judge the calibration set."""
_PART_TERMS = {"allocator_slack": "slack", "cuda_context": "cuda_context",
               "comm_buffers": "comm_buffers", "workspaces": "workspaces",
               "framework_buffers": "framework_buffers"}  # fmt: skip


def residual(r: Result) -> Residual:
    """A compared row for the held-out tables: its log error, its groups' shares of the
    predicted figure and each ablatable term's share (benchmarks/data/memory_terms.csv)."""
    total = sum(r.parts.values())
    shares: dict[str, float] = {}
    for name, value in r.parts.items():
        group = MEMORY_GROUPS[name]
        if group in WHOLE_FIGURE_GROUPS:  # its sd is a share of the whole figure, once
            shares[group] = 1.0 if value or shares.get(group) else 0.0
        else:
            shares[group] = shares.get(group, 0.0) + value / total
    terms = {t: r.parts.get(p, 0.0) / total for t, p in _PART_TERMS.items()}
    terms["first_iteration"] = -r.lazy / total
    terms["cublas_workspace_config"] = r.workspace_config / total
    oom = r.row["outcome"] == "oom"
    return Residual(r.row["source"], math.log(r.measured / r.predicted), shares, terms, oom)


def held_out_report(fit: list[Result], ooms: list[Result]) -> float:
    """The leave-one-source-out tables, the stated band's coverage and the known OOMs the
    band flags; returns the pooled held-out coverage."""
    terms = load_terms(TERMS_CSV)
    rows = [residual(r) for r in fit + ooms]
    pooled, _ = print_loso("memory", rows, terms, MEMORY_SIGMA_FLOORS)
    # the step time's between-source sd (a stack's own bias, held_out.between_source_sd) tried
    # on the memory's whole figure: printed, not stated (tuner.models.uncertainty keeps the
    # independent-row fit; docs/internals/models.md says why)
    print_loso("memory with a between-source sd", rows, terms, MEMORY_SIGMA_FLOORS,
               between=True, stated=False)  # fmt: skip
    print_term_effects("memory", rows, terms)
    print("\nthe stated band (tuner.models.uncertainty's catalog sds) per source: rows inside")
    for source in sorted({r.row["source"] for r in fit}):
        of = [r for r in fit if r.row["source"] == source]
        errs = [math.log(r.measured / r.predicted) for r in of]
        print(f"  {source:34} {len(of):>4}  {coverage(errs, [r.sigma for r in of]):5.0%}")
    every = [math.log(r.measured / r.predicted) for r in fit]
    print(f"  {'all':34} {len(fit):>4}  {coverage(every, [r.sigma for r in fit]):5.0%}")
    print("\nknown OOMs: pruned, or fitting but at risk (>= 1% likely over the GPU's memory)")
    for r in ooms:
        verdict = (
            "pruned" if not r.fits else "at risk (flagged)" if r.risk else "SURE FIT (missed)"
        )
        print(f"  {r.row['source'][:26]:26} {r.row.get('model', '')[:30]:30} tp{r.row['tp']} "
              f"pp{r.row['pp']} dp{r.row['dp']} mbs{r.row['micro_batch']}: predicted "
              f"{r.predicted / GIB:6.2f} GiB, sd {r.sigma:.0%} -> {verdict}")  # fmt: skip
    return pooled


def report(rows: list[dict[str, str]], headroom: float, show_rows: bool) -> bool:
    """Print the tables; True when every target is met."""
    results: list[Result] = []
    skipped: dict[str, int] = {}
    for row in rows:
        try:
            results.append(predict(row, headroom))
        except Skip as skip:
            key = f"{row['source']}: {row.get('model', '')} ({skip})"
            skipped[key] = skipped.get(key, 0) + 1
    for key, count in skipped.items():
        print(f"skipped {count} row{'s' if count > 1 else ''} of {key}")
    if show_rows:
        _print_rows(results)
    other = [r for r in results if _unmodelled(r.row)]
    results = [r for r in results if not _unmodelled(r.row)]
    fit = [r for r in results if r.row["outcome"] != "oom"]
    stack = [r for r in results if r.row["outcome"] == "oom" and _fits_elsewhere(r, fit)]
    ooms = [r for r in results if r.row["outcome"] == "oom" and r not in stack]
    print(f"\n{'source / metric':38} {'rows':>5} {'median':>7} {'max':>7} {'under':>6} "
          f"{'OOM hit':>7} {'falseOOM':>8}")  # fmt: skip
    fit_groups, oom_groups = _groups(fit), _groups(ooms)
    for group in sorted(set(fit_groups) | set(oom_groups)):
        print(_summary(f"{group[0]} / {group[1]}", fit_groups.get(group, []),
                       oom_groups.get(group, [])))  # fmt: skip
    for metric in sorted({r.row["metric"] for r in results}):
        print(_summary(f"all / {metric}", [r for r in fit if r.row["metric"] == metric],
                       [r for r in ooms if r.row["metric"] == metric]))  # fmt: skip
    recent = ("A100", "H100", "H800", "H200", "GB200", "B200")
    print(_summary("A100 and newer GPUs", [r for r in fit if r.row["gpu_type"].startswith(recent)],
                   [r for r in ooms if r.row["gpu_type"].startswith(recent)]))  # fmt: skip
    print(_summary("overall", fit, ooms))
    print("\nnot in the targets:")
    print(_summary("OOM on one stack, fits on another", [], stack))
    held = [dataclasses.replace(r, measured=float(r.row["resident"]), predicted=r.resident)
            for r in fit if r.row.get("resident")]  # fmt: skip
    for source in sorted({r.row["source"] for r in held}):
        of = [r for r in held if r.row["source"] == source]
        print(_summary(f"{source} / resident", of, []) + "  (mem-allocated-bytes after the step)")
    for framework, why in NOT_EXPRESSIBLE.items():
        rows_of = [r for r in other if r.row["framework"] == framework]
        label = f"apart: {framework}"
        print(_summary(label, rows_of, []) + f"  ({why})")
    _print_unmodelled([r for r in other if r.row["framework"] not in NOT_EXPRESSIBLE])
    held_out_report(fit, ooms + stack)
    held = [r for r in fit if r.row["source"] in HELD_OUT_SOURCES]
    held_ooms = [r for r in ooms if r.row["source"] in HELD_OUT_SOURCES]
    for source in HELD_OUT_SOURCES:
        print(_summary(f"held out: {source}", [r for r in held if r.row["source"] == source],
                       [r for r in held_ooms if r.row["source"] == source])
              + "  (never used to develop a term; out of the targets)")  # fmt: skip
    fit = [r for r in fit if r not in held]
    ooms = [r for r in ooms if r not in held_ooms]
    dense = [r for r in fit if not r.row.get("num_experts")]
    moe = [r for r in fit if r.row.get("num_experts")]
    ok = _targets_met(dense, ooms) and (not moe or _targets_met(moe, []))
    targets = f"median <= 5%, max <= 15%, <= 5% false OOMs at headroom {headroom:.2f}"
    print(
        f"\ntargets ({targets}, every known OOM flagged): dense rows "
        f"{'met' if _targets_met(dense, ooms) else 'NOT met'}"
        + (f"; MoE rows {'met' if _targets_met(moe, []) else 'NOT met'}" if moe else "")
    )
    print("errors: (predicted - measured) / measured over rows that fit; 'under': share "
          "under-predicted; OOM rows' values are lower bounds, not errors.")  # fmt: skip
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument(
        "--published-cases",
        type=Path,
        default=None,
        help="also read the memory rows of an older published_cases.csv",
    )
    parser.add_argument("--rows", action="store_true", help="print every compared row")
    parser.add_argument("--headroom", type=float, default=SearchSpec().memory_headroom)
    args = parser.parse_args()  # fmt: skip
    paths = [args.csv] + ([args.published_cases] if args.published_cases else [])
    for path in paths:
        if not path.is_file():
            print(f"{path}: not found", file=sys.stderr)
            return 2
    rows = list(csv.DictReader(args.csv.open()))
    if args.published_cases:
        rows += published_cases_rows(args.published_cases)
    report(rows, args.headroom, args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
