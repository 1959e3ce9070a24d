"""The `tune` command line: JSON contracts and exit codes."""

from __future__ import annotations

import json

import pytest

from tuner.cli import main


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys, "estimate", "--study", "gpt-70b", "--set", "tp=8", "--set", "pp=4",
        "--set", "sp=true", "--set", "recompute=selective", "--set", "distributed_optimizer=1",
        "--json",
    )  # fmt: skip
    assert {"config", "valid", "errors", "memory", "gpu_memory_gib", "fits"} <= set(out)
    assert out["valid"] and out["errors"] == [] and out["fits"]
    assert out["config"]["dp"] == 16 and out["config"]["grad_accum"] == 64
    mem = out["memory"]
    assert {"weights", "grads", "optimizer", "activations", "peak_gib"} <= set(mem)
    assert mem["peak_gib"] < out["gpu_memory_gib"]


def test_estimate_invalid_config_is_reported_not_raised(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_json(capsys, "estimate", "--study", "gpt-70b", "--set", "tp=3", "--json")
    assert out["valid"] is False and out["fits"] is False and out["memory"] is None
    assert any("does not divide world size 512" in e for e in out["errors"])


def test_estimate_predicted_oom(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "estimate", "--study", "gpt-70b", "--set", "tp=1", "--set", "pp=1",
                   "--json")  # fmt: skip
    assert out["valid"] and not out["fits"] and out["memory"]["peak_gib"] > 80


def test_space_json_counts(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "space", "--study", "gpt-70b", "--json")
    assert {"total", "invalid", "invalid_by_rule", "predicted_oom", "viable"} <= set(out)
    assert out["total"] == out["invalid"] + out["predicted_oom"] + out["viable"]
    assert sum(out["invalid_by_rule"].values()) == out["invalid"]


def test_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--study", "llama3-8b", "--set", "tp=2"]) == 0
    text = capsys.readouterr().out
    assert "peak_gib" in text and "fits" in text


@pytest.mark.parametrize(
    "argv",
    [["estimate", "--study", "missing-study"], ["estimate", "--study", "gpt-70b", "--set", "x=1"]],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tune: error: ")
