"""One memory calibration row as the model sees it: its units, GPU, framework, model, config,
and the model's figure for the metric the row measured.

Shared by memory_accuracy.py (which reports and judges the rows) and fsdp2_accuracy.py.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from tuner.models.memory.stack import stack_overheads
from tuner.models.uncertainty import (
    combined_sigma,
)
from tuner.space.probes import at_risk
from tuner.spec.moe import MoESpec
from tuner.spec.overheads import StackVersions
from tuner.spec.study import ModelSpec

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
    # The A800 80GB PCIe is the A100 80GB's GA100 (108 SMs, 80 GB HBM2e) with NVLink capped for
    # export; llm-action's nvidia-smi tables print 81920 MiB, the a100-80gb entry's capacity.
    "A800-80GB-PCIe": ("a100-80gb", None),
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
    stack_context: float = 0.0  # bytes the run's stack versions add to the figure (eager context)
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
    """The catalog GPU a row ran on, with the capacity its source states where it differs, the
    cuBLAS workspace its run's ``CUBLAS_WORKSPACE_CONFIG`` set (Megatron-LM's CI sets
    ``:4096:8`` in most model_config.yaml ENV_VARS) and the CUDA context its ``stack`` versions
    imply (tuner.models.memory.stack: an eager context before lazy module loading)."""
    if row["gpu_type"] not in GPUS:
        raise Skip(f"GPU {row['gpu_type']!r} has no catalog mapping")
    name, memory = GPUS[row["gpu_type"]]
    overheads = dict(stack_overheads(StackVersions.parse(row.get("stack", ""))))
    workspace = cublas_workspace_mib(row.get("cublas_workspace_config", ""))
    if workspace:
        overheads["cublas_workspace_mib"] = workspace
    return get_gpu(name, memory, overheads or None)


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
    plain, versionless = (_figure(_stage_part(estimate_memory(
        model, config, row_gpu(dict(row, **{key: ""})), framework,
        row["precision"]), row["stage"])[0], row["metric"], first)  # type: ignore[arg-type]
        for key in ("cublas_workspace_config", "stack"))  # fmt: skip
    risk = at_risk(mem.peak / GIB, gpu.memory_gib, mem.sigma)
    return Result(row, measured, figure, fits(mem, gpu, headroom), which, _resident(part), parts,
                  lazy, figure - plain, figure - versionless, sigma, risk)  # fmt: skip


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
