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


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_with_probe_takes_the_terms_from_the_same_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--with-probe: the probe's runs go first in the same interleaved job and the terms come from
    them, not from the saved probe. A job whose every step runs 1.3 times slower than when the
    saved probe was measured (a heavier load) leaves each config where the saved probe's own
    load puts it when read against its own probe rows, and 1.3 times above it when read against
    the saved probe (the level between two jobs, which no composition knows); kept rows give
    the same figures again."""
    import statistics

    import tuner.profile.probe as probe_module
    from tests.test_stack_terms import answer_probe_jobs, true_peak, true_step
    from tools.probe_truth import compare, load_rows, measure
    from tuner.models.memory.estimate import GIB
    from tuner.profile.probe import ProbeRow

    spec = _standin_with_a_saved_probe(tmp_path, monkeypatch)
    asked: list[Any] = []

    def job(spec: Any, executor: Any, paths: Any, runs: Any = None) -> ProbeResult:
        asked.append((list(runs), probe_module.INTERLEAVE))
        rows = []
        for r in runs:
            layers = r.depth * r.config.pp * r.config.vp
            step = 1.3 * true_step(spec, r.launched, layers)
            rows.append(ProbeRow(key=r.launched.key(), depth=r.depth, step_s=step,
                                 samples_s=(step,) * 4, rounds=(2, 3, 4, 5),
                                 peak_gib=true_peak(spec, r.launched, layers) / GIB,
                                 reserved_gib=None))  # fmt: skip
        return ProbeResult(rows=tuple(rows), wall_s=1.0, nodes=1, versions={})

    answer_probe_jobs(monkeypatch, job)
    results, kept = str(tmp_path / "results"), tmp_path / "joint.json"
    joint = measure("standin", results, 6, with_probe=True, save=str(kept))
    saved = measure("standin", results, 6, interleave=True)
    (runs, interleaved), _ = asked
    first = [r.launched.key() for r in probe_module.probe_runs(spec)]
    assert [r.launched.key() for r in runs[: len(first)]] == first and interleaved
    assert len(runs) == len(first) + len(joint)
    steps = [r["step"] for r in joint]
    assert max(steps) / min(steps) < 1.10  # the stand-in's composition, at one load
    for a, b in zip(joint, saved, strict=True):
        assert b["step"] / a["step"] > 1.2, a["config"]  # the saved probe's lighter load
    study, rows, probed = load_rows(str(kept))
    assert probed is not None and len(probed) == len(first) and len(rows) == len(joint)
    again = compare(study, results, rows, probed)
    assert [r["step"] for r in again] == pytest.approx(steps, rel=1e-12)
    assert statistics.median(steps) == pytest.approx(1.0, abs=0.1)


def test_without_a_saved_probe_it_says_so_before_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run before the study's probe (``--iters 10`` on a fresh results folder), the tool measured
    every config and compared it against the catalog's terms, printed as if probed. It exits
    first, naming the command to run; kept rows without the probe's are refused alike."""
    import tuner.profile.probe as probe_module
    from tools.probe_truth import main as probe_truth

    def nothing(*args: Any, **kwargs: Any) -> ProbeResult:
        raise AssertionError("nothing is measured without a saved probe")

    monkeypatch.setattr(probe_module, "run_stack_probe", nothing)
    results, why = str(tmp_path / "results"), "run tune profile --study demo --probe first"
    with pytest.raises(SystemExit, match=why):
        probe_truth(["--study", "demo", "--results", results, "--iters", "10"])
    kept = tmp_path / "truth.json"
    kept.write_text(json.dumps({"study": "demo", "rows": [], "probe_rows": None}))
    with pytest.raises(SystemExit, match=why):
        probe_truth(["--study", "demo", "--results", results, "--rows", str(kept)])
