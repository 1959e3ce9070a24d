"""Predicted vs published measured peak memory for every usable row of published_cases.csv.

Usage: python benchmarks/memory_accuracy.py [--csv PATH]

Rows whose metric is a measured peak (``peak_mem_GB``, ``peak_mem_GB_max_allocated``,
``peak_mem_GiB_reserved``) are compared with the model's prediction of the same quantity:
``max allocated`` against the predicted allocated bytes, ``reserved`` / unspecified against the
predicted peak. Missing shape fields are filled as the row's notes say and flagged with ``*``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from tuner.catalog import get_gpu
from tuner.memory import GIB, estimate_memory
from tuner.parallel import ParallelConfig
from tuner.spec import ModelSpec

DEFAULT_CSV = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "reference" / "published_cases.csv"
)
METRICS = {
    "peak_mem_GB": "peak",
    "peak_mem_GB_max_allocated": "allocated",
    "peak_mem_GiB_reserved": "peak",
}
GPUS = {
    "A100-SXM-80GB": "a100-80gb",
    "H800-80GB": "h100-sxm-80gb",
    "H100-96GB-HBM2e-500W": "h100-sxm-80gb",
}
# Llama-2-7B shape for rows that leave it out (Megatron-LM PR #482 names a "Llama2-7B-like" model).
LLAMA2_7B = {"ffn_hidden": "11008", "vocab": "32000", "seq_len": "4096"}


def _row_model(row: dict[str, str]) -> tuple[ModelSpec, bool]:
    filled = False
    if "Llama2-7B" in row["model"]:
        for key, value in LLAMA2_7B.items():
            if not row[key]:
                row[key], filled = value, True
    llama = "llama" in row["model"].lower()
    heads, kv = int(row["heads"]), int(row["kv_heads"] or row["heads"])
    return ModelSpec(
        name=row["model"], num_layers=int(row["n_layers"]), hidden_size=int(row["hidden"]),
        ffn_hidden_size=int(row["ffn_hidden"]), num_attention_heads=heads,
        num_query_groups=kv, vocab_size=int(row["vocab"]), seq_length=int(row["seq_len"]),
        swiglu=llama, tied_embeddings=not llama, dropout=not llama, flash_attention=True,
        normalization="rmsnorm" if llama else "layernorm", add_bias_linear=not llama,
        position_embedding="rope" if llama else "learned_absolute",
    ), filled  # fmt: skip


def _row_config(row: dict[str, str]) -> tuple[ParallelConfig, str]:
    rc = row["recompute"].split()[0] if row["recompute"] else "none"
    sharding = row["distributed_optimizer"]
    framework = "deepspeed" if "ZeRO-3" in sharding else "megatron"
    tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    full = rc == "full"
    return ParallelConfig(
        tp=tp, pp=pp, dp=dp, cp=int(row["cp"] or 1), micro_batch_size=int(row["micro_batch"]),
        global_batch_size=int(row["global_batch"]), recompute=rc,  # type: ignore[arg-type]
        recompute_method="uniform" if full else None, recompute_num_layers=1 if full else None,
        sequence_parallel=row["sequence_parallel"] == "yes",
        distributed_optimizer=framework == "megatron" and sharding not in ("", "no"),
        zero_stage=3 if framework == "deepspeed" else 0,
    ), framework  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    args = parser.parse_args()
    if not args.csv.is_file():
        print(f"published_cases.csv not found at {args.csv} (pass --csv)", file=sys.stderr)
        return 2
    errors: list[float] = []
    print(f"{'model':34} {'gpu':14} {'tp':>2} {'pp':>2} {'dp':>3} {'mbs':>3} {'rc':9} {'what':9} "
          f"{'published':>9} {'predicted':>9} {'error':>7}")  # fmt: skip
    for row in csv.DictReader(args.csv.open()):
        what = METRICS.get(row["metric"])
        if what is None:
            continue
        model, filled = _row_model(row)
        config, framework = _row_config(row)
        gpu = get_gpu(GPUS[row["gpu_type"]])
        mem = estimate_memory(model, config, gpu, framework, "bf16")  # type: ignore[arg-type]
        unit = GIB if "GiB" in row["metric"] else 1e9
        published = float(row["value"])
        predicted = (mem.allocated if what == "allocated" else mem.peak) / unit
        err = (predicted - published) / published
        errors.append(abs(err))
        mark = "*" if filled else " "
        print(f"{row['model'][:33] + mark:34} {gpu.name:14} {config.tp:>2} {config.pp:>2} "
              f"{config.dp:>3} {config.micro_batch_size:>3} {config.recompute:9} {what:9} "
              f"{published:9.1f} {predicted:9.1f} {err:+7.1%}")  # fmt: skip
    if not errors:
        print("no usable rows")
        return 1
    print(f"\nrows: {len(errors)}  median |error|: {statistics.median(errors):.1%}  "
          f"max |error|: {max(errors):.1%}")  # fmt: skip
    print("* shape fields the source leaves out were filled with Llama-2-7B's (ffn, vocab, seq).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
