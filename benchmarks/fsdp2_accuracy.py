"""FSDP2 (torchtitan) accuracy: the memory and time models on the published torchtitan rows.

Reads the torchtitan rows of ``benchmarks/data/memory_peaks.csv`` (framework ``torchtitan-fsdp2``:
torchtitan's logged max reserved memory) and ``benchmarks/data/step_times.csv`` (framework
``torch-fsdp2``: torchtitan docs/performance.md tokens/s per GPU), predicts them with tuner's
``torchtitan`` framework exactly as ``memory_accuracy.py`` and ``time_accuracy.py`` do, and
prints each row and, per source, the median and max absolute error. The time rows are grouped by
source and by what they exercise (eager FSDP2, torch.compile, compile + float8, CP), and the H100
rows are also predicted at both ends of the peak interval their source states (``PEAK_BAND``).
No time term was developed on these rows (tuner/models/time/fsdp2.py reads the code that runs),
so each source is held out from all of them. For comparison the same rows are also predicted the
way they were before the framework existed (DeepSpeed ZeRO-3, on the same GPU entry). Run:

    .venv/bin/python benchmarks/fsdp2_accuracy.py
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
from pathlib import Path

import memory_rows as mem
import time_rows as tim

DATA = Path(__file__).resolve().parent / "data"


def _line(label: str, errors: list[float]) -> str:
    a = [abs(e) for e in errors]
    return f"  {label:76} {len(a):4} {100 * statistics.median(a):7.1f}% {100 * max(a):7.1f}%"


def memory_table() -> None:
    rows = [r for r in csv.DictReader((DATA / "memory_peaks.csv").open())
            if r["framework"] == "torchtitan-fsdp2"]  # fmt: skip
    print("memory (max reserved GiB)                          measured  torchtitan  error  "
          "as ZeRO-3  error")  # fmt: skip
    errs: dict[str, list[float]] = {}
    old: dict[str, list[float]] = {}
    for row in rows:
        new = mem.predict(row, 0.92)
        mem.FRAMEWORKS["torchtitan-fsdp2"] = "deepspeed"
        was = mem.predict({**row, "zero_stage": "3"}, 0.92)
        mem.FRAMEWORKS["torchtitan-fsdp2"] = "torchtitan"
        label = row["citation"].split(" (")[0].split(" ")[-1].split("/")[-1][:48]
        figures = f"{new.measured / mem.GIB:8.2f} {new.predicted / mem.GIB:10.2f}"
        before = f"{was.predicted / mem.GIB:9.2f} {100 * was.error:+6.1f}%"
        print(f"  {label:48} {figures} {100 * new.error:+6.1f}% {before}")
        errs.setdefault(row["source"], []).append(new.error)
        old.setdefault(row["source"], []).append(was.error)
    print(f"  {'source':76} {'rows':>4} {'median':>8} {'max':>8}")
    for source in errs:
        print(_line(f"{source} (torchtitan)", errs[source]))
        print(_line(f"{source} (as DeepSpeed ZeRO-3, before)", old[source]))


def _feature(row: dict[str, str]) -> str:
    """What a torchtitan row exercises beyond eager FSDP2 (its source's own words)."""
    notes = row["notes"]
    if "CP" in notes:
        return "CP + compile + float8"
    if "Float8" in notes:
        return "compile + float8"
    return "compile" if "torch.compile" in notes else "eager"


PEAK_BAND = (835.0, 989.0)
"""The H100 rows' part: "the actual peak TFLOPs number is between SXM and NVL" (the benchmark's
footnote 2): NVL's and SXM's dense BF16 datasheet peaks. The catalog entry interpolates them at
500 W; the rows are also predicted at both ends (the MAMF share kept)."""


def _at_peak(case: tim.Case, peak: float) -> float:
    gpu = case.gpu
    scale = peak / gpu.peak_tflops
    part = dataclasses.replace(
        gpu, peak_tflops=peak, mamf_tflops=gpu.mamf_tflops * scale,
        fp8_peak_tflops=gpu.fp8_peak_tflops * scale, mamf_fp8_tflops=gpu.mamf_fp8_tflops * scale,
    )  # fmt: skip
    moved = dataclasses.replace(case, gpu=part, notes=[])
    return (tim._predict(moved) - case.published) / case.published


def time_table() -> None:
    cases, _ = tim.load_cases(DATA / "step_times.csv")
    cases = [c for c in cases if c.row["framework"] == "torch-fsdp2"]
    print("\ntime (tokens/s per GPU)                            measured  torchtitan  error  "
          "as ZeRO-3  error  (peak 835 / 989)")  # fmt: skip
    errs: dict[str, list[float]] = {}
    old: dict[str, list[float]] = {}
    for case in cases:
        was = dataclasses.replace(
            case, config=dataclasses.replace(case.config, zero_stage=3, compile=False),
            framework="deepspeed", notes=[],
        )  # fmt: skip
        was.predicted = tim._predict(was)
        group = f"{case.row['group']} {_feature(case.row)}"
        rc = case.row["recompute"].split(" (")[0]
        label = f"{case.row['model']} {rc} {_feature(case.row)} {case.row['gpus']}g"
        label += f" s{int(case.row['seq_len']) // 1024}k" if case.config.cp > 1 else ""
        figures = f"{case.published:8.0f} {case.predicted:10.0f}"
        before = f"{was.predicted:9.0f} {100 * was.error:+6.1f}%"
        band = ""
        if case.row["gpu_type"].endswith("500W"):
            lo, hi = (_at_peak(case, p) for p in PEAK_BAND)
            band = f"  ({100 * lo:+.0f}% / {100 * hi:+.0f}%)"
        print(f"  {label[:48]:48} {figures} {100 * case.error:+6.1f}% {before}{band}")
        errs.setdefault(group, []).append(case.error)
        old.setdefault(group, []).append(was.error)
    print(f"  {'source':76} {'rows':>4} {'median':>8} {'max':>8}")
    for group in errs:
        print(_line(f"{group} (torchtitan)", errs[group]))
        print(_line(f"{group} (as DeepSpeed ZeRO-3, before)", old[group]))


if __name__ == "__main__":
    memory_table()
    time_table()
