"""A real stand-in study, run once through the study loop, for the report's tests: the Megatron
stand-in under torchrun on the local executor, with real OOMs, a crash and pp = 2 configs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.test_study import SURFACE, study_data, write_study
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec
from tuner.study.build import build_loop

REPORT_SURFACE: dict[str, Any] = dict(
    SURFACE,
    memory_gib={"base": 2.0, "terms": {"mbs": 1.5}},
    behaviours=[
        {"when": {"mbs": 8, "recompute": "none"}, "kind": "oom"},
        {"when": {"tp": 1, "pp": 2, "mbs": 2, "recompute": "full"}, "kind": "crash",
         "message": "RuntimeError: stand-in crash for the report"},
    ],
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class StudyRun:
    """A finished study on disk."""

    spec: StudySpec
    results: Path
    study_file: Path


def run_study(tmp: Path) -> StudyRun:
    """Every config of a 16-point grid (tp, pp, mbs, recompute), two trials at a time."""
    data = study_data(tmp, REPORT_SURFACE, sampler="grid", n_trials=16)
    data["name"] = "report-e2e"
    data["space"] = {"tp": [1, 2], "pp": [1, 2], "micro_batch_size": [2, 8],
                     "sequence_parallel": [True], "recompute": ["none", "full"],
                     "distributed_optimizer": [False]}  # fmt: skip
    spec = study_from_mapping(data)
    results = tmp / "results"
    loop = build_loop(spec, results=str(results))
    try:
        loop.run()
    finally:
        loop.executor.close()
    return StudyRun(spec, results, write_study(tmp, data))


@pytest.fixture(scope="session")
def study_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StudyRun]:
    yield run_study(tmp_path_factory.mktemp("report-study"))
