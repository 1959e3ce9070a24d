"""How well ``tuner.models.time.estimate`` predicts and ranks published training speeds, and how
fast it is.

Reads ``benchmarks/data/step_times.csv`` (measured step times / throughputs of real runs, each with
its citation, cluster and full config; see ``benchmarks/data/STEP_TIMES.md``) and prints, per row,
the published figure, the prediction in the *source's own* metric and FLOPs convention, and the
error; then, per group of configs measured on one cluster and per source:

- MAPE: mean absolute percentage error of the prediction in the row's metric;
- Spearman rank correlation between measured and predicted speed (model FLOPs per GPU-second, so
  rows of different GPU counts or models in one group compare fairly; for one model on one GPU
  count this is the order of the step times);
- best: whether the config the model predicts fastest is within 2% of the measured best.

Targets (issue 14): MAPE <= 10%, Spearman >= 0.9 and best within 2% in every group, with the
catalog alone. The cluster's network is a fact of the cluster, not of the GPU: a row's
``network_gbps_per_gpu`` (the node's NIC line rate / GPUs per node, from the cited hardware
description) replaces the catalog's per-GPU network share when given. Run:

    .venv/bin/python benchmarks/time_accuracy.py [--rows]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from held_out import (
    STACK,
    Residual,
    band_sigma,
    coverage,
    load_terms,
    print_loso,
    print_term_effects,
)
from scipy.stats import spearmanr

from tuner._loader import load_dataclass
from tuner.catalog import GPUSpec, get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.time.estimate import (
    TimeBreakdown,
    estimate_time,
    layer_step_times,
    model_flops_per_step,
)
from tuner.models.uncertainty import (
    CATALOG_TIME_SIGMA,
    CATALOG_TIME_STACK_SIGMA,
    TIME_GROUPS,
    TIME_SIGMA_FLOORS,
    Z_BAND,
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
}
MODERN = ("[M]", "[L]", "[T]", "[X]", "[G]")
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
    r = estimate_time(
        model, training, config, case.gpu, gpn, case.framework, p2p_overlap=overlap,
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


def load_cases(path: Path) -> tuple[list[Case], dict[str, int]]:
    """Usable rows as cases (predicted), and the count of skipped rows by reason."""
    cases: list[Case] = []
    skipped: dict[str, int] = defaultdict(int)
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            reason = _skip_reason(row)
            if reason is not None:
                skipped[reason] += 1
                continue
            cases.append(_case(row))
    return cases, dict(skipped)


def _case(row: dict[str, str]) -> Case:
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
        case.predicted = _predict(case)
        candidates.append(case)
    return max(candidates, key=lambda c: c.speed("predicted"))


def _describe(c: ParallelConfig) -> str:
    text = f"t{c.tp} p{c.pp} d{c.dp}"
    text += f" c{c.cp}" if c.cp > 1 else ""
    text += f" v{c.vp}" if c.vp > 1 else ""
    text += f" b{c.micro_batch_size} g{c.global_batch_size} {c.recompute}"
    text += " sp" if c.sequence_parallel else ""
    text += " dopt" if c.distributed_optimizer else ""
    text += " tpo" if c.tp_comm_overlap else ""
    return text + (f" z{c.zero_stage}" if c.zero_stage else "")


def print_rows(cases: list[Case]) -> None:
    print(f"{'group':34} {'config':36} {'metric':21} {'published':>10} {'predicted':>10} "
          f"{'error':>7}  assumptions")  # fmt: skip
    for case in cases:
        print(
            f"{case.row['group'][:34]:34} {_describe(case.config):36} {case.row['metric']:21} "
            f"{case.published:10.4g} {case.predicted:10.4g} {case.error:+7.1%}  "
            f"{', '.join(case.notes)}"
        )


def _mape(cases: list[Case]) -> float:
    return sum(abs(c.error) for c in cases) / len(cases)


@dataclass(frozen=True)
class GroupScore:
    """The three issue-14 figures of one group."""

    n: int
    mape: float
    worst: float
    rho: float | None
    best_gap: float | None
    """Measured shortfall of the predicted-fastest config from the measured best (0 = found)."""

    @property
    def passed(self) -> bool:
        rank_ok = self.rho is None or self.rho >= 0.9
        best_ok = self.best_gap is None or self.best_gap <= BEST_WITHIN
        return self.mape <= 0.10 and rank_ok and best_ok


def score(group: list[Case]) -> GroupScore:
    mape = _mape(group)
    worst = max(abs(c.error) for c in group)
    if len(group) < 2:
        return GroupScore(len(group), mape, worst, None, None)
    measured = [c.speed("measured") for c in group]
    rho, gap = _rank(measured, [c.speed("predicted") for c in group])
    return GroupScore(len(group), mape, worst, rho, gap)


def _rank(measured: list[float], predicted: list[float]) -> tuple[float, float]:
    """(Spearman of the two speed lists, measured shortfall of the predicted-fastest row from
    the measured best)."""
    rho = float(spearmanr(measured, predicted).statistic) if len(set(predicted)) > 1 else 0.0
    pick = max(range(len(measured)), key=lambda i: predicted[i])
    return rho, 1.0 - measured[pick] / max(measured)


def _key(case: Case) -> str:
    """What the model sees of a row: model, config, precision, GPU, framework."""
    config, precision = _describe(case.config), case.row["precision"]
    return f"{case.model!r} {config} {precision} {case.gpu.name} {case.framework}"


def repeat_bound(group: list[Case]) -> tuple[float, float] | None:
    """The figures an exact model would reach where rows it cannot tell apart (a setup measured
    again, or runs that differ only in what the model does not see) were measured at different
    speeds: it can only predict their mean, so their spread bounds its rank correlation and best
    gap: (Spearman, best gap), or None when no two rows look the same to the model."""
    runs: dict[str, list[float]] = defaultdict(list)
    for case in group:
        runs[_key(case)].append(case.speed("measured"))
    if all(len(v) == 1 for v in runs.values()):
        return None
    measured = [c.speed("measured") for c in group]
    return _rank(measured, [statistics.fmean(runs[_key(c)]) for c in group])


def step_log_error(case: Case) -> float:
    """log(measured / predicted step time) of a row, whatever its metric."""
    ratio = case.published / case.predicted
    return math.log(ratio if case.row["metric"] in TIMES else 1.0 / ratio)


def rms_step_error(cases: list[Case]) -> float:
    """The rms of ``step_log_error``, in sample (what the catalog states is the held-out sd,
    ``tuner.models.uncertainty.CATALOG_STEP_SIGMA``)."""
    return math.sqrt(statistics.fmean(step_log_error(c) ** 2 for c in cases))


def print_groups(cases: list[Case]) -> None:
    for title, key in (("group", lambda c: c.row["group"]), ("source", lambda c: _tag(c.row))):
        groups: dict[str, list[Case]] = defaultdict(list)
        for case in cases:
            groups[key(case)].append(case)
        print(f"\nby {title}: {'':28} n   MAPE  worst  Spearman  best-gap  targets")
        passed = 0
        for name, group in sorted(groups.items()):
            s = score(group)
            rho = "     -" if s.rho is None else f"{s.rho:+6.2f}"
            gap = "      -" if s.best_gap is None else f"{s.best_gap:7.1%}"
            passed += s.passed
            print(f"  {name:38} {s.n:2} {s.mape:6.1%} {s.worst:6.1%}    {rho}   {gap}  "
                  f"{'ok' if s.passed else 'MISS'}")  # fmt: skip
        print(f"  {passed}/{len(groups)} {title}s meet all three targets; "
              f"all {len(cases)} rows: MAPE {_mape(cases):.1%}")  # fmt: skip
        for name, group in sorted(groups.items()):
            bound = repeat_bound(group) if title == "group" else None
            if bound is not None:
                print(f"  {name}: rows the model cannot tell apart ran at different speeds; "
                      f"predicting their mean exactly reaches Spearman {bound[0]:+.2f}, best gap "
                      f"{bound[1]:.1%}")  # fmt: skip


TERMS_CSV = Path(__file__).resolve().parent / "data" / "time_terms.csv"


def residual(case: Case) -> Residual:
    """A row for the held-out tables: its step's log error, the compute and communication
    groups' shares of the predicted step, and each ablatable term's share
    (benchmarks/data/time_terms.csv). A one-layer row is all compute."""
    b = case.breakdown
    if b is None:
        return Residual(_tag(case.row), step_log_error(case), {"compute": 1.0})
    shares: dict[str, float] = {}
    for name, group in TIME_GROUPS.items():
        shares[group] = shares.get(group, 0.0) + getattr(b, name) / b.step
    terms = {t.name: getattr(b, t.name) / b.step for t in load_terms(TERMS_CSV)}
    return Residual(_tag(case.row), step_log_error(case), shares, terms)


def print_held_out(cases: list[Case]) -> float:
    """The leave-one-source-out tables and the stated band's coverage; returns the pooled
    held-out coverage."""
    terms = load_terms(TERMS_CSV)
    rows = [residual(c) for c in cases]
    pooled, _ = print_loso("step time", rows, terms, TIME_SIGMA_FLOORS, between=True)
    print_term_effects("step time", rows, terms)
    stated = CATALOG_TIME_SIGMA | {STACK: CATALOG_TIME_STACK_SIGMA}
    print("\nthe stated band (tuner.models.uncertainty's catalog sds) per source: rows inside")
    for source in sorted({r.source for r in rows}):
        of = [r for r in rows if r.source == source]
        sds = [band_sigma(r.shares, stated) for r in of]
        print(f"  {source:34} {len(of):>4}  {coverage([r.log_error for r in of], sds):5.0%}")
    sds = [band_sigma(r.shares, stated) for r in rows]
    print(f"  {'all':34} {len(rows):>4}  {coverage([r.log_error for r in rows], sds):5.0%}")
    mid = statistics.median(sds)
    print(f"  the stated band's sd: median {mid:.3f} (90% band x{math.exp(-Z_BAND * mid):.2f}"
          f"-{math.exp(Z_BAND * mid):.2f} of the prediction), largest {max(sds):.3f}")  # fmt: skip
    return pooled


def print_speed() -> None:
    model = ModelSpec(
        num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
        num_query_groups=8, vocab_size=128256, seq_length=4096, swiglu=True,
    )  # fmt: skip
    training = TrainingSpec(global_batch_size=1024)
    gpu = get_gpu("h100-sxm-80gb")
    configs = [
        ParallelConfig(tp=t, pp=p, cp=c, dp=512 // (t * p * c), vp=v, micro_batch_size=b,
                       global_batch_size=1024, recompute=rc, sequence_parallel=t > 1,
                       distributed_optimizer=True)  # fmt: skip
        for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) for c in (1, 2) for v in (1, 2)
        for b in (1, 2, 4) for rc in ("none", "selective")
    ]  # fmt: skip
    for config in configs:  # warm the per-shape caches, as a study's first pass does
        estimate_time(model, training, config, gpu, 8)
    start = time.perf_counter()
    rounds = 20
    for _ in range(rounds):
        for config in configs:
            estimate_time(model, training, config, gpu, 8)
    per_call = (time.perf_counter() - start) / (rounds * len(configs))
    print(f"\nspeed: {per_call * 1e6:.1f} us per estimate_time call ({1 / per_call:,.0f} "
          f"configs/s; {len(configs)} configs of a 70B space, warm caches)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", action="store_true", help="print every row's prediction")
    parser.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args()
    cases, skipped = load_cases(args.csv)
    if args.rows:
        print_rows(cases)
    print(f"{len(cases)} rows used; skipped {sum(skipped.values())}:")
    for reason, n in sorted(skipped.items()):
        print(f"  {n:3}  {reason}")
    print_groups(cases)
    print(f"\nall {len(cases)} rows: rms of log(measured / predicted step time) "
          f"{rms_step_error(cases):.3f} (in sample; held out below)")  # fmt: skip
    print_held_out(cases)
    print_speed()


if __name__ == "__main__":
    main()
