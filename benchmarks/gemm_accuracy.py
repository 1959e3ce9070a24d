"""How the time model's catalog GEMM rate compares with measured GEMM throughput by shape.

Reads ``benchmarks/data/gemm_rates.csv`` (measured matmul TFLOP/s from public benchmark tables,
each row with its citation) and prints, per row, the measured rate, the rate of
``tuner.models.rates.gemm_seconds`` on the catalog GPU (tile / wave quantization and the additive
roofline, the terms every step-time prediction uses) and their ratio; then the median ratio per
source. Nothing in the model reads this file: it shows where the catalog GEMM model stands
against measurements, so a revision of it can cite them. Run:

    .venv/bin/python benchmarks/gemm_accuracy.py
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from pathlib import Path

from tuner.catalog import get_gpu
from tuner.models.rates import catalog_rates, gemm_seconds

CSV = Path(__file__).resolve().parent / "data" / "gemm_rates.csv"


def model_tflops(row: dict[str, str]) -> float:
    """TFLOP/s of the row's GEMM under the catalog rates of its GPU and precision."""
    rates = catalog_rates(get_gpu(row["catalog_gpu"]), row["precision"])
    b, m, n, k = (float(row[key]) for key in ("batch", "m", "n", "k"))
    return 2.0 * b * m * n * k / gemm_seconds(rates, m, n, k, b) / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args()
    with args.csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    ratios: dict[str, list[float]] = defaultdict(list)
    print(f"{'source':20} {'prec':5} {'b':>2} {'m':>6} {'n':>6} {'k':>6} "
          f"{'measured':>9} {'model':>7} {'meas/model':>10}")  # fmt: skip
    for row in rows:
        measured, model = float(row["tflops"]), model_tflops(row)
        ratios[row["source"]].append(measured / model)
        print(f"{row['source']:20} {row['precision']:5} {row['batch']:>2} {row['m']:>6} "
              f"{row['n']:>6} {row['k']:>6} {measured:9.0f} {model:7.0f} "
              f"{measured / model:10.3f}")  # fmt: skip
    print()
    for source, values in ratios.items():
        median = statistics.median(values)
        print(f"{source:20} n={len(values):2}  median measured/model {median:.3f}"
              f"  range {min(values):.3f}-{max(values):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
