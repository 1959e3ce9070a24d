"""How well ``tuner.perf`` predicts published training speeds, and how fast it is.

Reads ``<repo>/../shared/reference/published_cases.csv`` and, for every row that describes a
training speed we can model (iteration time, TFLOP/s per GPU, tokens/s, MFU, per-layer time),
prints the published figure, the prediction in the *source's own* FLOPs convention, and the error;
then the mean absolute error (overall, per metric, per source) and the Spearman rank correlation
within each group of rows that share a model shape and a metric. Run:

    .venv/bin/python benchmarks/time_accuracy.py

FLOPs conventions of the sources: Narayanan et al. (tags [N], Megatron-LM README and MT-NLG), BLOOM
[B] and the Megatron-DeepSpeed / DeepSpeed posts [D] report hardware TFLOP/s from Eq. 3,
96·B·s·L·h²(1 + s/(6h) + V/(16·L·h)), which counts full recomputation; Megatron-Core's table [M],
Llama 3 [L] and torchtitan report model FLOPs (no recomputation); Korthikanti's MFU [K] excludes
recomputation. Assumptions for fields a row leaves empty are printed beside the row.
"""

from __future__ import annotations

import csv
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from scipy.stats import spearmanr

from tuner.catalog import GPUSpec, get_gpu
from tuner.parallel import ParallelConfig
from tuner.perf import estimate_time, layer_step_times
from tuner.spec import ModelSpec, TrainingSpec

CSV = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "published_cases.csv"
METRICS = (
    "iter_time_s",
    "tflops_per_gpu",
    "tokens_per_s_per_gpu",
    "tokens_per_s_total",
    "mfu_pct",
    "layer_fwd_plus_bwd_ms",
)
GPUS = {
    "A100-SXM-80GB": "a100-80gb",
    "A100-80GB (Azure NDm A100 v4)": "a100-80gb",
    "H100-SXM-80GB": "h100-sxm-80gb",
    "H100-96GB-HBM2e-500W": "h100-sxm-80gb",
}
EQ3_TAGS = ("[N]", "[B]", "[D]")
MODERN_SOURCES = ("NVIDIA/Megatron-LM README images", "Llama3", "pytorch/torchtitan")


@dataclass
class Case:
    """One usable row: what we predict and what was published."""

    row: dict[str, str]
    model: ModelSpec
    config: ParallelConfig
    gpu: GPUSpec
    framework: str
    notes: list[str] = field(default_factory=list)
    predicted: float = 0.0

    @property
    def published(self) -> float:
        return float(self.row["value"])

    @property
    def error(self) -> float:
        return (self.predicted - self.published) / self.published


def _int(row: dict[str, str], key: str, default: int, notes: list[str]) -> int:
    if row[key].strip():
        return int(row[key])
    notes.append(f"{key}={default}?")
    return default


def _skip_reason(row: dict[str, str]) -> str | None:
    if row["metric"] not in METRICS:
        return f"metric {row['metric']} is not a speed"
    if "FP8" in row["notes"]:
        return "FP8 run (the model covers 16-bit and fp32)"
    if row["gpu_type"] not in GPUS:
        return f"GPU {row['gpu_type']} not in the catalog"
    if not row["n_layers"] or not row["hidden"] or not row["heads"]:
        return "model shape incomplete"
    return None


def _model(row: dict[str, str], notes: list[str]) -> ModelSpec:
    h = int(row["hidden"])
    llama = "llama" in row["model"].lower()
    modern = row["source"].startswith(MODERN_SOURCES)
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
        tied_embeddings=not llama,
        normalization="rmsnorm" if llama else "layernorm",
        position_embedding="rope" if llama else "learned_absolute",
        dropout=not llama,
        flash_attention=modern,
        add_bias_linear=not llama,
    )


def _recompute(text: str) -> str:
    for kind in ("none", "selective", "full"):
        if text.startswith(kind):
            return kind
    return "none"


def _sharding(text: str) -> tuple[str, bool, int]:
    """(framework, distributed_optimizer, zero_stage) from the row's optimizer-sharding column."""
    if "ZeRO-3" in text or "FSDP" in text:
        return "deepspeed", False, 3
    if "ZeRO-1-like" in text or text.startswith("yes"):
        return "megatron", True, 0
    for stage in (1, 2):
        if f"ZeRO-{stage}" in text:
            return "deepspeed", False, stage
    return "megatron", False, 0


def _config(row: dict[str, str], notes: list[str]) -> tuple[ParallelConfig, str]:
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
    sp = tp > 1 and (sp_text.startswith("yes") or (not sp_text and _modern(row)))
    framework, distopt, zero = _sharding(row["distributed_optimizer"])
    full = recompute == "full"
    config = ParallelConfig(
        tp=tp, pp=pp, cp=cp, dp=dp, vp=int(row["vp"] or 1), sequence_parallel=sp,
        micro_batch_size=mbs, global_batch_size=gbs, recompute=recompute,  # type: ignore[arg-type]
        recompute_method="uniform" if full else None, recompute_num_layers=1 if full else None,
        distributed_optimizer=distopt, zero_stage=zero,
    )  # fmt: skip
    return config, framework


def _modern(row: dict[str, str]) -> bool:
    return row["source"].startswith(MODERN_SOURCES)


def _eq3_flops(model: ModelSpec, batch: int) -> float:
    """Narayanan et al. Eq. 3: 96·B·s·L·h²(1 + s/(6h) + V/(16·L·h)) (full recompute counted)."""
    s, layers, h, v = model.seq_length, model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def _predict(case: Case) -> float:
    row, model, config = case.row, case.model, case.config
    training = TrainingSpec(global_batch_size=config.global_batch_size)
    if row["metric"] == "layer_fwd_plus_bwd_ms":
        return 1e3 * sum(layer_step_times(model, training, config, case.gpu, 8))
    r = estimate_time(model, training, config, case.gpu, 8, case.framework)
    metric = row["metric"]
    if metric == "iter_time_s":
        return r.step
    if metric == "tflops_per_gpu":
        if row["notes"].startswith(EQ3_TAGS):
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
            if reason is None and int(row["gpus"]) != int(row["tp"]) * int(row["pp"]) * int(
                row["dp"]
            ) * int(row["cp"] or 1):
                reason = "tp x pp x dp x cp differs from the GPU count"
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
        if row["gpu_type"].startswith("H100-96GB"):
            notes.append("as H100 SXM 80GB")
        model = _model(this, notes)
        config, framework = _config(this, notes)
        case = Case(row, model, config, get_gpu(GPUS[row["gpu_type"]]), framework, notes)
        case.predicted = _predict(case)
        candidates.append(case)
    return max(candidates, key=lambda c: c.predicted)


def _tag(case: Case) -> str:
    notes = case.row["notes"]
    return notes[: notes.index("]") + 1] if notes.startswith("[") else "?"


def _describe(c: ParallelConfig) -> str:
    text = f"t{c.tp} p{c.pp} d{c.dp}"
    text += f" c{c.cp}" if c.cp > 1 else ""
    text += f" v{c.vp}" if c.vp > 1 else ""
    text += f" b{c.micro_batch_size} g{c.global_batch_size} {c.recompute}"
    text += " sp" if c.sequence_parallel else ""
    text += " dopt" if c.distributed_optimizer else ""
    return text + (f" z{c.zero_stage}" if c.zero_stage else "")


def print_rows(cases: list[Case]) -> None:
    print(f"{'src':4} {'model':28} {'config':38} {'metric':22} {'published':>10} "
          f"{'predicted':>10} {'error':>7}  assumptions")  # fmt: skip
    for case in cases:
        print(
            f"{_tag(case):4} {case.row['model'][:28]:28} {_describe(case.config):38} "
            f"{case.row['metric']:22} {case.published:10.4g} {case.predicted:10.4g} "
            f"{case.error:+7.1%}  {', '.join(case.notes)}"
        )


def _mae(cases: list[Case]) -> float:
    return sum(abs(c.error) for c in cases) / len(cases)


def print_errors(cases: list[Case]) -> None:
    print(f"\nmean absolute error, all {len(cases)} rows: {_mae(cases):.1%}")
    for title, key in (("metric", lambda c: c.row["metric"]), ("source", _tag)):
        groups: dict[str, list[Case]] = defaultdict(list)
        for case in cases:
            groups[key(case)].append(case)
        for name, group in sorted(groups.items()):
            worst = max(abs(c.error) for c in group)
            print(f"  by {title} {name:24} n={len(group):2}  MAE {_mae(group):6.1%}  "
                  f"worst {worst:6.1%}")  # fmt: skip
    korthikanti = [c for c in cases if _tag(c) == "[K]" and c.row["metric"] == "iter_time_s"]
    print(f"  Korthikanti's eight iteration times: MAE {_mae(korthikanti):.1%} "
          f"(Calculon reports 3.7%)")  # fmt: skip


def print_rank_correlation(cases: list[Case]) -> None:
    """Spearman within rows sharing a model shape (L, h, heads, s) and a metric."""
    print("\nrank correlation within groups sharing a model shape and metric (n >= 2):")
    groups: dict[tuple[str, ...], list[Case]] = defaultdict(list)
    for case in cases:
        r = case.row
        groups[(r["n_layers"], r["hidden"], r["heads"], r["seq_len"], r["metric"])].append(case)
    for key, group in sorted(groups.items(), key=lambda kv: (int(kv[0][0]), kv[0][4])):
        if len(group) < 2:
            continue
        published = [c.published for c in group]
        predicted = [c.predicted for c in group]
        label = f"L={key[0]} h={key[1]} s={key[3]} {key[4]} ({group[0].row['model'][:24]})"
        if len(set(published)) < 2 or len(set(predicted)) < 2:
            which = "published" if len(set(published)) < 2 else "predicted"
            print(f"  {label:70} n={len(group)}  {which} values tie")
            continue
        rho = spearmanr(published, predicted).statistic
        print(f"  {label:70} n={len(group)}  Spearman {rho:+.2f}")


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
    if not CSV.is_file():
        sys.exit(f"time_accuracy: {CSV} not found (expected <repo>/../shared/reference/)")
    cases, skipped = load_cases(CSV)
    print_rows(cases)
    print(f"\nskipped {sum(skipped.values())} rows:")
    for reason, n in sorted(skipped.items()):
        print(f"  {n:3}  {reason}")
    print_errors(cases)
    print_rank_correlation(cases)
    print_speed()


if __name__ == "__main__":
    main()
