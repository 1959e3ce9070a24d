"""The public memory calibration set (benchmarks/data/memory_peaks.csv) parses and covers what the
memory benchmark needs: cited rows from several sources, both GPU generations, both frameworks,
pipeline parallelism, an uneven split and runs that went out of memory."""

from __future__ import annotations

import csv
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
CSV = DATA / "memory_peaks.csv"
METRICS = {"allocated", "reserved", "device"}
UNITS = {"bytes", "MiB", "GiB", "GB"}
POSITIVE = ("value", "n_layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "seq_len",
            "gpus", "tp", "pp", "dp", "cp", "vp", "micro_batch", "global_batch")  # fmt: skip
# A citation names a repository at a commit and a file, or an issue / paper / document.
CITATION = re.compile(r"[\w.-]+/[\w.-]+@[0-9a-f]{7,40} \S+|issue #\d+|arXiv:\d|https?://")


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    with CSV.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_every_row_is_complete_and_cited(rows: list[dict[str, str]]) -> None:
    for i, row in enumerate(rows, start=2):
        where = f"memory_peaks.csv line {i}"
        assert None not in row and None not in row.values(), f"{where}: wrong column count"
        assert CITATION.search(row["citation"]), f"{where}: no citation"
        assert row["metric"] in METRICS, f"{where}: metric {row['metric']!r}"
        assert row["unit"] in UNITS, f"{where}: unit {row['unit']!r}"
        assert row["outcome"] in ("ok", "oom"), f"{where}: outcome {row['outcome']!r}"
        assert row["gpu_type"] and row["framework"] and row["stage"], where
        for key in POSITIVE:
            assert float(row[key]) > 0, f"{where}: {key} must be > 0, got {row[key]!r}"
        world = int(row["tp"]) * int(row["pp"]) * int(row["dp"]) * int(row["cp"])
        assert world == int(row["gpus"]), f"{where}: tp*pp*dp*cp = {world} != gpus"
        assert int(row["hidden"]) % int(row["heads"]) == 0, where
        assert row["recompute"] in ("none", "selective", "full"), where
        assert row["precision"] in ("bf16", "fp16", "fp32"), where


def test_coverage(rows: list[dict[str, str]]) -> None:
    assert len(rows) >= 40
    assert len({r["source"] for r in rows}) >= 3
    gpus = {r["gpu_type"] for r in rows}
    assert any(g.startswith("A100") for g in gpus) and any(g.startswith("H100") for g in gpus)
    frameworks = {r["framework"] for r in rows}
    assert "megatron" in frameworks
    assert frameworks & {"deepspeed", "megatron-deepspeed"}
    assert any(int(r["pp"]) > 1 for r in rows)
    assert any(r["pipeline_split"] for r in rows)
    assert any(r["outcome"] == "oom" for r in rows)
    assert {r["metric"] for r in rows} == METRICS


def test_uneven_split_adds_up(rows: list[dict[str, str]]) -> None:
    for row in rows:
        match = re.match(r"megatron:first=(\d+),last=(\d+)", row["pipeline_split"])
        if match is None:
            continue
        first, last = int(match.group(1)), int(match.group(2))
        rest, middle = int(row["n_layers"]) - first - last, int(row["pp"]) - 2
        assert rest > 0 and rest % middle == 0, row["model"]


def _benchmark() -> ModuleType:
    path = DATA.parent / "memory_accuracy.py"
    spec = importlib.util.spec_from_file_location("memory_accuracy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_rows_build_model_inputs(rows: list[dict[str, str]]) -> None:
    """Every row is a valid ModelSpec, and every even-split row a valid ParallelConfig."""
    bench = _benchmark()
    for row in rows:
        model = bench.row_model(row)
        assert model.num_layers == int(row["n_layers"])
        assert row["gpu_type"] in bench.GPUS and row["framework"] in bench.FRAMEWORKS
        if not row["pipeline_split"]:
            config = bench.row_config(row)
            assert config.world_size == int(row["gpus"])


class _Figures:
    def __init__(self, allocated: float, reserved: float | None = None) -> None:
        self.allocated, self.peak = allocated, allocated + 10
        if reserved is not None:
            self.reserved = self.device = reserved


def test_benchmark_compares_like_with_like() -> None:
    """A last-stage row reads the model's last stage; reserved and device rows read those
    figures, allocated rows the allocated one."""
    bench = _benchmark()
    first, last = _Figures(8.0, 9.0), _Figures(3.0, 4.0)
    new = _Figures(8.0, 9.0)
    new.stages = (first, last)  # type: ignore[attr-defined]
    part, which = bench._stage_part(new, "last pipeline stage (rank 7)")
    assert (part, which) == (last, "last")
    assert bench._figure(part, "device") == 4.0 and bench._figure(part, "allocated") == 3.0
    assert bench._stage_part(new, "pipeline stage 0 (rank 0)") == (first, "0")
    assert bench._stage_part(new, "rank 0") == (new, "peak")
