"""Which stack versions decide the eager CUDA context (tuner.models.memory.stack.study_stack):
the study's ``cluster.overheads.stack`` where it states one, else the versions its cluster's
valid saved profile recorded; ``CUDA_MODULE_LOADING`` (the study's ``launch.env``, or as the
profile's job ran with it) over the version rule; a disagreement is one warning line; ``tune
estimate`` says where they came from. Read through the real study loader and a saved profile."""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.test_memory_stages import STUDY
from tests.test_profile import a_profile
from tuner.catalog import get_gpu
from tuner.cli.main import main
from tuner.layout import ClusterLayout
from tuner.models.memory.stack import EAGER_CONTEXT_GIB, study_stack
from tuner.profile import job
from tuner.profile.recorded import study_with_profile
from tuner.profile.run import MAX_AGE_DAYS, save_profile
from tuner.space.enumerate import study_gpu
from tuner.spec.file import load_study

H100 = get_gpu("h100-sxm-80gb")
OLD = {"torch": "1.11.0+cu115", "cuda": "11.5", "nccl": "2.10.3", "backend": "nccl"}
"""A 2022 stack (BigScience tr11's): its CUDA runtime predates lazy module loading."""
NEW = {"torch": "2.13.0", "cuda": "12.8", "nccl": "2.27.3", "backend": "nccl"}


def saved(
    tmp: Path, versions: dict[str, str], *, stack: str | None = None,
    env: dict[str, str] | None = None, age_days: float = 0.0, gpu: str = "h100-sxm-80gb",
) -> tuple[Path, Path]:  # fmt: skip
    """(study file, results folder) with the cluster's profile saved, recording ``versions``."""
    data: dict[str, Any] = copy.deepcopy(STUDY)
    data["cluster"]["name"] = "c"
    if stack is not None:
        data["cluster"]["overheads"] = {"stack": stack}
    if env is not None:
        data["launch"]["env"] = env
    path, results = tmp / "study.yaml", tmp / "results"
    path.write_text(yaml.safe_dump(data))
    when = dt.datetime.now(dt.UTC) - dt.timedelta(days=age_days)
    profile = a_profile(cluster="c", gpu=gpu, created=when.isoformat(timespec="seconds"),
                        versions={**versions, "gpu_name": "NVIDIA H100 80GB HBM3"})  # fmt: skip
    save_profile(profile, ClusterLayout(results.resolve(), "c").profile_yaml)
    return path, results


def context_gib(path: Path, results: Path) -> float:
    return study_gpu(study_with_profile(str(path), results)).cuda_context_gib


def estimate_json(path: Path, results: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    assert main(["estimate", "--study", str(path), "--results", str(results),
                 "--format", "json"]) == 0  # fmt: skip
    return json.loads(capsys.readouterr().out)


def test_a_profiles_versions_decide_where_the_study_states_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, results = saved(tmp_path, OLD)
    assert load_study(str(path)).cluster.overheads.stack is None
    assert study_gpu(load_study(str(path))).cuda_context_gib == H100.cuda_context_gib
    assert context_gib(path, results) == EAGER_CONTEXT_GIB  # the profile's 11.5 runtime
    stack = estimate_json(path, results, capsys)["stack"]
    assert stack["source"].startswith("cluster profile c (measured ")
    assert stack["versions"] == "torch=1.11.0+cu115 cuda=11.5 nccl=2.10.3"
    assert "eager module loading" in stack["summary"]
    assert main(["estimate", "--study", str(path), "--results", str(results)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console wraps at its width
    assert "stack versions: torch=1.11.0+cu115 cuda=11.5 nccl=2.10.3 from cluster profile c" in out
    new = saved(tmp_path, NEW)
    assert context_gib(*new) == H100.cuda_context_gib  # lazy: the catalog's context


def test_the_studys_statement_wins_and_a_disagreement_is_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, results = saved(tmp_path, OLD, stack="torch=2.4 cuda=12.4")
    with caplog.at_level(logging.WARNING, logger="tuner"):
        spec = study_with_profile(str(path), results)
    assert study_gpu(spec).cuda_context_gib == H100.cuda_context_gib  # the study's: lazy
    said = [r.getMessage() for r in caplog.records if r.name.startswith("tuner")]
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith("stack versions disagree: torch 2.4 in the study's "
                              "cluster.overheads.stack (used), 1.11.0+cu115 in cluster "
                              "profile c")  # fmt: skip
    assert "cuda 12.4" in said[0] and "11.5 in cluster profile c" in said[0]
    assert study_stack(spec).source == "the study's cluster.overheads.stack"
    caplog.clear()
    agree = saved(tmp_path, OLD, stack="torch=1.11 cuda=11.5")  # major.minor: the same stack
    with caplog.at_level(logging.WARNING, logger="tuner"):
        assert context_gib(*agree) == EAGER_CONTEXT_GIB
    assert not [r for r in caplog.records if r.name.startswith("tuner")]


def test_the_disagreement_reaches_the_command_line_as_one_line(tmp_path: Path) -> None:
    path, results = saved(tmp_path, OLD, stack="torch=2.4 cuda=12.4")
    out = subprocess.run(
        [sys.executable, "-m", "tuner.cli.main", "estimate", "--study", str(path), "--results",
         str(results), "--format", "json"],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tune: warning: stack versions disagree: ")


@pytest.mark.parametrize(
    ("versions", "env", "eager"),
    [
        ({**NEW, "module_loading": "EAGER"}, None, True),  # the profile's switch, not torch's
        ({**OLD, "torch": "1.12.1", "cuda": "11.8"}, None, True),  # opt-in, unset: eager
        ({**OLD, "torch": "1.12.1", "cuda": "11.8"}, {"CUDA_MODULE_LOADING": "LAZY"}, False),
        ({**NEW, "module_loading": "LAZY"}, {"CUDA_MODULE_LOADING": "EAGER"}, True),
        (OLD, {"CUDA_MODULE_LOADING": "LAZY"}, True),  # an 11.5 runtime cannot load lazily
    ],
)
def test_cuda_module_loading_decides_over_the_version_rule(
    tmp_path: Path, versions: dict[str, str], env: dict[str, str] | None, eager: bool
) -> None:
    path, results = saved(tmp_path, versions, env=env)
    expected = EAGER_CONTEXT_GIB if eager else H100.cuda_context_gib
    assert context_gib(path, results) == expected
    choice = study_stack(study_with_profile(str(path), results))
    if env is not None:
        assert choice.loading_source == "the study's launch.env"
    elif "module_loading" in versions:
        assert choice.loading_source is not None and "cluster profile c" in choice.loading_source


@pytest.mark.parametrize(("age_days", "gpu"), [(MAX_AGE_DAYS + 2, "h100-sxm-80gb"),
                                               (0.0, "a100-80gb")])  # fmt: skip
def test_a_stale_or_foreign_profiles_versions_are_not_read(
    tmp_path: Path, age_days: float, gpu: str
) -> None:
    path, results = saved(tmp_path, OLD, age_days=age_days, gpu=gpu)
    spec = study_with_profile(str(path), results)
    assert spec.cluster.recorded_stack is None
    assert study_gpu(spec).cuda_context_gib == H100.cuda_context_gib


def test_the_record_changes_no_study_fingerprint(tmp_path: Path) -> None:
    path, results = saved(tmp_path, OLD)
    spec = study_with_profile(str(path), results)
    assert spec.cluster.recorded_stack is not None
    assert spec.fingerprint() == load_study(str(path)).fingerprint()


def test_the_profile_job_records_the_module_loading_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU the job records ``CUDA_MODULE_LOADING`` as its process ran with it (the launch's,
    or torch's LAZY where it was unset, pytorch#86509); unset, it records none."""
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    gpu = torch.device("cuda", 0)
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    assert job.versions(gpu, "nccl")["module_loading"] == "EAGER"
    monkeypatch.delenv("CUDA_MODULE_LOADING")
    assert "module_loading" not in job.versions(gpu, "nccl")
