"""The dry run's count of runs is the one ``tune run`` makes.

With fewer configs that may run than ``n_trials`` (the viable ones that fit the time limit, and
the memory probes), ``tune run`` stops once each has run: the dry run said "until 10 runs"
under a budget line of 7 launches."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.test_cost import TIME_SCALE, run_paced, scenario, write
from tuner.cli.main import main
from tuner.space.enumerate import enumerate_space
from tuner.spec.file import study_from_mapping

FEW = {"tp": [4, 8], "pp": [4, 8], "micro_batch_size": [1], "sequence_parallel": [True],
       "recompute": ["selective", "full"], "distributed_optimizer": [True]}  # fmt: skip
"""Eight configs of the 70B scenario: seven viable, one predicted over the GPU's memory that is
a memory probe when the study allows probes."""


def few(**search: Any) -> dict[str, Any]:
    data = scenario(**{"n_trials": 10, **search})
    data["space"] = FEW
    return data


def dry_run_text(tmp: Path, data: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> tuple[int, int]:  # fmt: skip
    """(the budget line's launches, the runs the closing line says it goes on until)."""
    monkeypatch.setenv("COLUMNS", "400")  # one line each
    code = main(["run", "--study", write(tmp, data), "--dry-run",
                 "--results", str(tmp / "results")])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0, text
    launches = re.findall(r"^budget of (\d+) launches", text, re.M)
    runs = re.findall(r"^then .* (\d+) runs?\b[^;]*; nothing was launched", text, re.M)
    assert len(launches) == len(runs) == 1, text
    return int(launches[0]), int(runs[0])


def test_the_dry_run_counts_the_runs_the_space_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for probes, expected in ((0, 7), (2, 8)):  # the probe is launched too, once the rest ran
        data = few(memory_probes=probes)
        counts = enumerate_space(study_from_mapping(data), keep_oom=True).counts()
        assert (counts["viable"], counts["memory_probes"]) == (7, expected - 7)
        assert dry_run_text(tmp_path, data, monkeypatch, capsys) == (expected, expected)
        code = main(["run", "--study", write(tmp_path, data), "--dry-run", "--json",
                     "--results", str(tmp_path / "results")])  # fmt: skip
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and out["n_trials"] == 10 and out["cost"]["launches"] == expected
    # a budget under what the space allows: the budget's own count, as before
    assert dry_run_text(tmp_path, few(n_trials=5), monkeypatch, capsys) == (5, 5)


def test_the_dry_run_names_the_limits_that_may_stop_the_run_sooner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune run`` also stops at ``max_node_hours`` and ``max_wall_time_min``
    (``StudyLoop.budget_reason``): "until 5 runs" alone promised more than a node-hour limit
    under the budget's cost allows."""
    data = few(n_trials=5, max_node_hours=4, max_wall_time_min=90)
    assert dry_run_text(tmp_path, data, monkeypatch, capsys) == (5, 5)
    main(["run", "--study", write(tmp_path, data), "--dry-run", "--results", str(tmp_path)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.endswith("until 5 runs or 4 node-hours are spent (max_node_hours) or 90 min have "
                         "passed (max_wall_time_min), whichever comes first; nothing was "
                         "launched (--dry-run)."), last  # fmt: skip


@pytest.mark.slow
def test_tune_run_makes_the_runs_its_dry_run_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The grid sampler over the seven viable configs, paced by the tuner's own predictions on
    16 local "nodes" (no memory probe: the surface is the model's own, so a probe would run
    out of memory by construction; the early stop off, so that only the space ends the run)."""
    data = few(sampler="grid", memory_probes=0, early_stop_trials=None, seed=1)
    data["cluster"] = dict(data["cluster"], executor="local")
    launches, runs = dry_run_text(tmp_path, data, monkeypatch, capsys)
    _, summary = run_paced(tmp_path, data, tmp_path / "run", TIME_SCALE / 4)
    assert summary.launched == launches == runs == 7, summary
    assert "space exhausted" in summary.stop_reason
