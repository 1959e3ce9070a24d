"""The Python API returns what the command line shows: ``tuner.best`` is the trial's record (the
leaderboard's figures, the config, every export), the space converts to a DataFrame with the
leaderboard's column names, and ``dir(tuner)`` lists the public names only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tuner
from tests.report.test_exports import TRAIN_ARGS, megatron_study, record_trials
from tuner.cli.main import main
from tuner.report.leaderboard import COLUMNS
from tuner.spec.file import study_from_mapping

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


def test_best_is_the_record_the_cli_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = megatron_study(tmp_path, nodes=1, train_args=TRAIN_ARGS)
    spec = study_from_mapping(data)
    results = str(tmp_path / "results")
    record_trials(spec, tmp_path / "results", {1: 3.0, 2: 2.0})
    best = tuner.best(spec, results=results)
    assert isinstance(best, tuner.TrialRecord)
    row = tuner.leaderboard(spec, results=results).iloc[0]
    assert best.trial == row["trial"] == 1 and best.best
    assert (best.config.tp, best.config.micro_batch_size) == (row["tp"], row["micro_batch"])
    assert best.measured["measured_step_s"] == row["measured_step_s"] == 2.0
    assert best.measured["mfu"] == row["mfu"] and best.predicted["predicted_peak_gib"] == 12.5
    assert tuner.best(spec, trial=0, results=results).config.tp == 1

    study = tmp_path / "study.json"
    study.write_text(json.dumps(data))
    for kind in ("args", "script"):
        export = best.export(kind)
        assert main(["best", "--study", str(study), "--results", results, "--emit", kind]) == 0
        assert capsys.readouterr().out == export.text == export.path.read_text()
    assert main(["best", "--study", str(study), "--results", results, "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {k: shown[k] for k in best.to_dict()} == json.loads(json.dumps(best.to_dict()))


def test_the_space_converts_to_a_dataframe() -> None:
    report = tuner.enumerate_space(tuner.load_study("llama3-8b"), keep_oom=True)
    frame = report.to_frame()
    ranked = report.ranked()
    assert len(frame) == len(ranked) > 1 and list(frame["rank"]) == list(range(1, len(ranked) + 1))
    first = frame.iloc[0]
    assert first["key"] == ranked[0].config.key() and first["tp"] == ranked[0].config.tp
    assert first["predicted_step_s"] == pytest.approx(ranked[0].time.step if ranked[0].time else 0)
    assert frame["predicted_step_s"].is_monotonic_increasing and frame["fits"].all()
    knobs = [c for c in frame.columns if c in COLUMNS]
    assert {"tp", "pp", "dp", "micro_batch", "grad_accum", "recompute"} <= set(knobs)
    with_oom = report.to_frame(include_oom=True)
    assert len(with_oom) == len(ranked) + len(report.oom)
    assert (~with_oom["fits"]).sum() == len(report.oom)


def test_dir_shows_only_the_public_names() -> None:
    assert dir(tuner) == sorted(tuner.__all__)
    assert not [n for n in dir(tuner) if n.startswith("_") and n != "__version__"]
