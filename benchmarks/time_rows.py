"""One step-time calibration row as the model sees it: its model, config, GPU, training spec
and the model's predicted step.

Shared by time_accuracy.py (which reports and judges the rows), proxy_accuracy.py and
fsdp2_accuracy.py.
"""

from __future__ import annotations

import csv
import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tuner._loader import load_dataclass
from tuner.catalog import GPUSpec, get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.rates import Link, Rates, catalog_rates
from tuner.models.time.estimate import (
    TimeBreakdown,
    estimate_time,
    layer_step_times,
    model_flops_per_step,
)
from tuner.spec.file import _expand_model
from tuner.spec.frameworks import Framework
from tuner.spec.study import ModelSpec, Precision, TrainingSpec

CSV = Path(__file__).resolve().parent / "data" / "step_times.csv"
METRICS = (
    "iter_time_s",
    "tflops_per_gpu",
    "tokens_per_s_per_gpu",
    "tokens_per_s_total",
    "mfu_pct",
    "layer_fwd_plus_bwd_ms",
)
TIMES = ("iter_time_s", "layer_fwd_plus_bwd_ms")
GPUS = {
    "A100-SXM-80GB": "a100-80gb",
    "H100-SXM-80GB": "h100-sxm-80gb",
    "H100-96GB-HBM2e-500W": "h100-hbm2e-96gb-500w",
    "B200-SXM-180GB": "b200-180gb",
}
MODERN = ("[M]", "[L]", "[T]", "[X]", "[G]", "[C]", "[W]")
"""Sources whose runs use FlashAttention, RoPE-era kernels and sequence parallelism by default."""
BEST_WITHIN = 0.02


@dataclass
class Case:
    """One usable row: what we predict and what was published."""

    row: dict[str, str]
    model: ModelSpec
    config: ParallelConfig
    gpu: GPUSpec
    gpus_per_node: int
    framework: Framework
    notes: list[str] = field(default_factory=list)
    predicted: float = 0.0
    predicted_step: float = 0.0
    breakdown: TimeBreakdown | None = None
    measured_network: bool = False
    """Predict with the inter-node link the row's cluster was measured at, where it cites one
    (``measured_network_rates``), instead of the catalog's share of its line rate."""

    @property
    def published(self) -> float:
        return float(self.row["value"])

    @property
    def error(self) -> float:
        return (self.predicted - self.published) / self.published

    def speed(self, which: str) -> float:
        """Model FLOPs per GPU-second, measured or predicted (higher is faster)."""
        if self.row["metric"] == "layer_fwd_plus_bwd_ms":
            return 1.0 / (self.published if which == "measured" else self.predicted)
        ratio = self.published / self.predicted if which == "measured" else 1.0
        if self.row["metric"] in TIMES:
            ratio = 1.0 / ratio
        step = self.predicted_step / ratio  # a throughput metric scales as 1 / step time
        flops = model_flops_per_step(self.model, self.config.global_batch_size)
        return flops / step / self.config.world_size


def _int(row: dict[str, str], key: str, default: int, notes: list[str]) -> int:
    if row[key].strip():
        return int(row[key])
    notes.append(f"{key}={default}?")
    return default


def _tag(row: dict[str, str]) -> str:
    notes = row["notes"]
    return notes[: notes.index("]") + 1] if notes.startswith("[") else "?"


def _skip_reason(row: dict[str, str]) -> str | None:
    if row["metric"] not in METRICS:
        return f"metric {row['metric']} is not a speed"
    if row["gpu_type"] not in GPUS:
        return f"GPU {row['gpu_type']} not in the catalog"
    tp, pp, dp, cp = (int(row[k] or 1) for k in ("tp", "pp", "dp", "cp"))
    if int(row["gpus"]) != tp * pp * dp * cp:
        return "tp x pp x dp x cp differs from the GPU count"
    return None


def _model(row: dict[str, str], notes: list[str]) -> ModelSpec:
    if row.get("preset"):  # an MoE model: the catalog's preset, its published architecture
        model = load_dataclass(ModelSpec, _expand_model({"preset": row["preset"]}), "model")
        return dataclasses.replace(model, seq_length=int(row["seq_len"]))
    h = int(row["hidden"])
    name = row["model"].lower()
    llama = "llama" in name
    # Nemotron (NeMo's nemotron*.yaml): RoPE, no biases, untied output, squared-ReLU MLP (not
    # gated: one fc1 output, as GPT's GeLU), LayerNorm (layernorm1p: the same kernel)
    modern = llama or "nemotron" in name
    heads = int(row["heads"])
    kv = int(row["kv_heads"]) if row["kv_heads"] else heads
    return ModelSpec(
        num_layers=int(row["n_layers"]),
        hidden_size=h,
        ffn_hidden_size=_int(row, "ffn_hidden", 4 * h, notes),
        num_attention_heads=heads,
        num_query_groups=None if kv == heads else kv,
        vocab_size=_int(row, "vocab", 51200, notes),
        seq_length=int(row["seq_len"]),
        swiglu=llama,
        tied_embeddings=not modern,
        normalization="rmsnorm" if llama else "layernorm",
        position_embedding="rope" if modern else "learned_absolute",
        dropout=not modern,
        flash_attention=_tag(row) in MODERN,
        add_bias_linear=not modern,
    )


def _recompute(text: str) -> str:
    for kind in ("none", "selective", "full"):
        if text.startswith(kind):
            return kind
    return "none"


def _sharding(row: dict[str, str]) -> tuple[Framework, bool, int]:
    """(framework, distributed_optimizer, zero_stage) from the row's framework and sharding."""
    text, framework = row["optimizer_sharding"], row["framework"]
    if framework == "torch-fsdp2":  # torchtitan's FSDP2: tuner's torchtitan framework
        return "torchtitan", False, 0
    if "ZeRO-3" in text or "FSDP" in text:
        return "deepspeed", False, 3  # FSDP2 full sharding = ZeRO-3's traffic
    if framework == "deepspeed":
        # the CSV's `deepspeed` rows ran Megatron-DeepSpeed: Megatron's TP inside DeepSpeed's
        # pipeline engine and ZeRO / BF16_Optimizer (STEP_TIMES.md)
        for stage in (1, 2):
            if f"ZeRO-{stage}" in text:
                return "megatron-deepspeed", False, stage
        return "megatron-deepspeed", False, 0
    return "megatron", text.startswith("yes"), 0


def _config(row: dict[str, str], notes: list[str]) -> tuple[ParallelConfig, Framework]:
    tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    cp = int(row["cp"] or 1)
    mbs = _int(row, "micro_batch", 1, notes)
    if row["metric"] == "layer_fwd_plus_bwd_ms":
        gbs = mbs * dp
    else:  # Korthikanti's own choice: 8 micro-batches per pipeline stage
        gbs = _int(row, "global_batch", mbs * dp * 8 * pp if pp > 1 else mbs * dp, notes)
    recompute = _recompute(row["recompute"])
    if not row["recompute"]:
        notes.append("recompute=none?")
    sp_text = row["sequence_parallel"]
    sp = tp > 1 and (sp_text.startswith("yes") or (not sp_text and _tag(row) in MODERN))
    framework, distopt, zero = _sharding(row)
    full = recompute == "full"
    tpo = row["tp_comm_overlap"] == "yes" and sp
    config = ParallelConfig(
        tp=tp, pp=pp, cp=cp, dp=dp, vp=int(row["vp"] or 1), sequence_parallel=sp,
        micro_batch_size=mbs, global_batch_size=gbs, recompute=recompute,  # type: ignore[arg-type]
        recompute_method="uniform" if full else None, recompute_num_layers=1 if full else None,
        distributed_optimizer=distopt, zero_stage=zero, ep=int(row.get("ep") or 1),
        tp_comm_overlap=tpo, pipeline_split=row["pipeline_split"] or "even",
        compile=framework == "torchtitan" and "torch.compile" in row["notes"],
    )  # fmt: skip
    return config, framework


def _gpu(row: dict[str, str], notes: list[str]) -> GPUSpec:
    gpu = get_gpu(GPUS[row["gpu_type"]])
    if row["network_gbps_per_gpu"]:
        network = float(row["network_gbps_per_gpu"])
        if network != gpu.inter_node_gbps:
            notes.append(f"network {network:g} GB/s/GPU")
        gpu = dataclasses.replace(gpu, inter_node_gbps=network)
    return gpu


_MEASURED_RATES: dict[tuple[str, str, float, int], Rates] = {}


def measured_network_rates(row: dict[str, str], gpu: GPUSpec, gpus_per_node: int) -> Rates | None:
    """The catalog's rates with the inter-node link a row's cluster was measured at
    (``network_measured_gbps_per_node``: NCCL's all-reduce bus bandwidth across nodes, Gb/s
    per node, as the cited source prints it), the way a cluster profile's measured link replaces
    the catalog's (no efficiency applied: it is an achieved figure); None where the row gives
    none. One ``Rates`` per cluster and precision (the model's caches key on its identity)."""
    measured = row.get("network_measured_gbps_per_node", "")
    if not measured:
        return None
    precision = _precision(row)
    key = (gpu.name, precision, float(measured), gpus_per_node)
    if key not in _MEASURED_RATES:
        base = catalog_rates(gpu, precision)
        per_gpu = float(measured) / 8.0 * 1e9 / gpus_per_node  # Gb/s per node -> bytes/s per GPU
        _MEASURED_RATES[key] = dataclasses.replace(base, inter=Link(per_gpu, base.inter.latency))
    return _MEASURED_RATES[key]


def _eq3_flops(model: ModelSpec, batch: int) -> float:
    """Narayanan et al. Eq. 3: 96·B·s·L·h²(1 + s/(6h) + V/(16·L·h)) (full recompute counted)."""
    s, layers, h, v = model.seq_length, model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def _precision(row: dict[str, str]) -> Precision:
    """The row's format: fp16, fp8 (Transformer Engine's linear layers, ``fp8_recipe``), else
    bf16 ("16-bit (not stated)" keeps the default)."""
    if row["precision"] in ("fp16", "fp8"):
        return row["precision"]  # type: ignore[return-value]
    return "bf16"


def _training(row: dict[str, str], config: ParallelConfig) -> TrainingSpec:
    """The row's batch and precision; ``fp8_recipe`` is read only under fp8 (delayed unless
    given, TrainingSpec's default)."""
    return TrainingSpec(
        global_batch_size=config.global_batch_size, precision=_precision(row),
        fp8_recipe=row["fp8_recipe"] or "delayed",  # type: ignore[arg-type]
        cross_entropy_fusion=row["cross_entropy_fusion"] == "yes",
    )  # fmt: skip


def _predict(case: Case) -> float:
    row, model, config = case.row, case.model, case.config
    training = _training(row, config)
    if row["precision"] not in ("fp16", "bf16", "fp8"):
        case.notes.append("precision=bf16?")
    gpn = case.gpus_per_node
    # Megatron before 2021-08 (Narayanan's runs, the BigScience fork) reduced TP synchronously
    tp_async = row["tp_bwd_overlap"] != "no"
    if row["metric"] == "layer_fwd_plus_bwd_ms":
        return 1e3 * sum(
            layer_step_times(model, training, config, case.gpu, gpn, tp_backward_overlap=tp_async)
        )
    # Megatron before 2023-10 (Korthikanti's, Narayanan's runs) waited on every pipeline transfer
    overlap = row["p2p_overlap"] != "no"
    # every torchtitan row ran its 2024 code (tuner.models.time.fsdp2 eager_elementwise_bytes)
    rates = measured_network_rates(row, case.gpu, gpn) if case.measured_network else None
    if rates is not None:
        case.notes.append(f"network measured {row['network_measured_gbps_per_node']} Gb/s/node")
    r = estimate_time(
        model, training, config, case.gpu, gpn, case.framework, rates, p2p_overlap=overlap,
        tp_backward_overlap=tp_async, torchtitan_2024=case.framework == "torchtitan",
    )  # fmt: skip
    case.predicted_step = r.step
    case.breakdown = r
    metric = row["metric"]
    if metric == "iter_time_s":
        return r.step
    if metric == "tflops_per_gpu":
        if row["flops_convention"].startswith("hardware, Narayanan Eq.3"):
            case.notes.append("Eq.3 TFLOP/s")
            return _eq3_flops(model, config.global_batch_size) / r.step / config.world_size / 1e12
        return r.model_tflops_per_gpu
    if metric == "tokens_per_s_per_gpu":
        return r.tokens_per_s_per_gpu
    if metric == "tokens_per_s_total":
        return r.tokens_per_s
    return 100.0 * r.mfu  # mfu_pct: model FLOPs, no recomputation (Korthikanti)


def load_cases(path: Path, measured_network: bool = False) -> tuple[list[Case], dict[str, int]]:
    """Usable rows as cases (predicted), and the count of skipped rows by reason;
    ``measured_network``: rows that cite their cluster's measured inter-node bandwidth are
    predicted with it (``measured_network_rates``), the others as always."""
    cases: list[Case] = []
    skipped: dict[str, int] = defaultdict(int)
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            reason = _skip_reason(row)
            if reason is not None:
                skipped[reason] += 1
                continue
            cases.append(_case(row, measured_network))
    return cases, dict(skipped)


def _case(row: dict[str, str], measured_network: bool = False) -> Case:
    """Predict one row; a row that reports the best of a micro-batch sweep gets our best too."""
    sweep = "micro-batch sweep" in row["notes"] and not row["micro_batch"]
    candidates = []
    for mbs in ("1", "2", "4", "8") if sweep else (row["micro_batch"],):
        this = {**row, "micro_batch": mbs}
        notes = ["best of micro-batch 1/2/4/8"] if sweep else []
        model = _model(this, notes)
        config, framework = _config(this, notes)
        gpu = _gpu(this, notes)
        case = Case(row, model, config, gpu, int(row["gpus_per_node"]), framework, notes)
        case.measured_network = measured_network
        case.predicted = _predict(case)
        candidates.append(case)
    return max(candidates, key=lambda c: c.speed("predicted"))
