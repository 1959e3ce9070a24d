"""tools/probe_truth.py --save / --rows: one measurement of every config, compared against the
models of any version of the code (the models' change, not two runs' loads, is what differs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.test_stack_terms import _standin_with_a_saved_probe, standin_truth_jobs
from tuner.profile.probe import ProbeResult


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_kept_rows_compare_again_without_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tuner.profile.probe as probe_module
    from tools.probe_truth import main as probe_truth

    _standin_with_a_saved_probe(tmp_path, monkeypatch)
    standin_truth_jobs(monkeypatch)
    results, kept = str(tmp_path / "results"), tmp_path / "truth.json"
    assert probe_truth(["--study", "standin", "--results", results, "--save", str(kept)]) == 0
    measured = capsys.readouterr().out
    assert len(json.loads(kept.read_text())["rows"]) >= 20

    def nothing(*args: Any, **kwargs: Any) -> ProbeResult:
        raise AssertionError("--rows measures nothing")

    monkeypatch.setattr(probe_module, "run_stack_probe", nothing)
    assert probe_truth(["--study", "standin", "--results", results, "--rows", str(kept)]) == 0
    again = capsys.readouterr().out
    assert "load (1-minute average)" in measured
    assert "load (1-minute average)" not in again
    assert again.splitlines() == measured.splitlines()[:-1]  # the same table, no load line
    with pytest.raises(SystemExit, match="not demo's"):
        probe_truth(["--study", "demo", "--results", results, "--rows", str(kept)])
