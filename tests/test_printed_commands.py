"""Commands tuner prints name the study as the user gave it.

A study file outside ``studies/`` (the README's ``llama3-70b.yaml`` in the current folder) is
not found by the ``name:`` inside it: ``tune profile --study mine`` is "unknown study", or
silently a shipped study of that name. Every printed ``tune ... --study X`` repeats the
argument the study was found by (:attr:`StudySpec.study_arg`), shell-quoted."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import html
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_profile import a_profile
from tests.test_profile import study as profile_study
from tests.test_stack_terms import STUDY as PROBE_STUDY
from tests.test_stack_terms import saved
from tuner.errors import ConfigError
from tuner.profile.probe_file import check_probe, load_probe
from tuner.profile.run import MAX_AGE_DAYS, ProfileError, check_profile
from tuner.profile.stack_terms import derive_terms
from tuner.spec.file import load_study, study_from_mapping
from tuner.spec.study import StudySpec

GIVEN = "my cluster.yaml"
NOW = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)


def named_studies(text: str) -> list[str]:
    """The ``--study`` argument of every ``tune COMMAND --study X`` in ``text``, unquoted."""
    found = re.findall(r"tune \w+ --study ('[^']*'|\S+)", text)
    assert found, text
    return [" ".join(shlex.split(s)) for s in found]


def assert_repeats_the_file(text: str) -> None:
    for study in named_studies(text):
        assert study == GIVEN, text
        assert load_study(study).name == "mine"  # the printed command finds the study


def written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict[str, Any]) -> StudySpec:
    """``data`` saved as ``my cluster.yaml`` (name ``mine``) in the current folder, loaded the
    way ``--study 'my cluster.yaml'`` loads it."""
    data = copy.deepcopy(data)
    data["name"] = "mine"
    (tmp_path / GIVEN).write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    return load_study(GIVEN)


def test_the_reader_keeps_what_the_study_was_found_by(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = written(tmp_path, monkeypatch, PROBE_STUDY)
    assert spec.found_by == GIVEN and spec.study_arg == "'my cluster.yaml'"
    # where it was found from changes nothing the study says or measures
    from_text = study_from_mapping(yaml.safe_load((tmp_path / GIVEN).read_text()),
                                   base_dir=tmp_path)  # fmt: skip
    assert from_text.found_by is None and from_text.study_arg == "mine"
    assert spec == from_text and spec.fingerprint() == from_text.fingerprint()
    # a file cannot say it: it is the reader's, not a key of the study
    data = {**yaml.safe_load((tmp_path / GIVEN).read_text()), "found_by": "elsewhere"}
    with pytest.raises(ConfigError, match="unknown key 'found_by'"):
        study_from_mapping(data, base_dir=tmp_path)


def test_a_stale_or_foreign_profile_names_the_study_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = profile_study(cluster={"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 2})
    data["training"]["precision"] = "bf16"
    spec = written(tmp_path, monkeypatch, data)
    late = NOW + dt.timedelta(days=MAX_AGE_DAYS + 1)
    for profile, now, versions in (
        (a_profile(gpu="a100-80gb"), NOW, None),  # foreign
        (a_profile(), late, None),  # stale by age
        (a_profile(), NOW, {"nccl": "2.28.1"}),  # stale by version
    ):
        with pytest.raises(ProfileError) as exc:
            check_profile(profile, spec, now=now, versions=versions)
        assert_repeats_the_file(str(exc.value))


def test_a_stale_or_foreign_probe_names_the_study_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = written(tmp_path, monkeypatch, PROBE_STUDY)
    data = load_probe(saved(tmp_path / "results", spec, NOW), spec)
    other = study_from_mapping({**copy.deepcopy(PROBE_STUDY), "name": "mine"}, base_dir=tmp_path)
    wider = dataclasses.replace(other.model, hidden_size=512)
    other = dataclasses.replace(other, found_by=GIVEN, model=wider)
    for study, now, versions in (
        (spec, NOW + dt.timedelta(days=MAX_AGE_DAYS + 1), None),  # stale by age
        (spec, NOW, {"torch": "9.9"}),  # stale by version
        (other, NOW, None),  # foreign: measured for another model
    ):
        with pytest.raises(ProfileError) as exc:
            check_probe(data, study, now=now, versions=versions)
        assert_repeats_the_file(str(exc.value))
    alien = dataclasses.replace(data["rows"][0], key="tp99-not-in-this-space")
    with pytest.raises(ProfileError, match="foreign probe") as exc:
        derive_terms(spec, (alien, *data["rows"][1:]))
    assert_repeats_the_file(str(exc.value))


def test_the_report_page_names_the_study_file(tmp_path: Path) -> None:
    from tests.report.test_report_views import _study
    from tests.test_results import SPEC
    from tuner.report import page
    from tuner.report.data import gather

    _study(tmp_path)
    data = gather(dataclasses.replace(SPEC, found_by=GIVEN), results=str(tmp_path))
    summary = page._summary(data)
    text = html.unescape("".join(str(t) for t in summary.tables))
    assert named_studies(text) == [GIVEN]  # the full launch script's tune best
    assert named_studies(page._payback(data).note) == [GIVEN]  # the payback's tune report


def test_no_printed_command_names_a_study_by_its_name() -> None:
    """Nothing in the package builds ``--study`` from a study's ``name`` field (what the six
    hints above did); a new hint uses ``study_arg``."""
    root = Path(__file__).resolve().parents[1] / "tuner"
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"--study \{[^}]*\bname\}", line)
    ]
    assert offenders == []


def test_a_broken_calibration_names_the_command_that_clears_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said ``tune calibrate --reset clears it``, which is refused as printed (give
    --cluster NAME or --study NAME). The command printed clears the file."""
    from tuner.calibrate.store import load_calibration
    from tuner.cli.main import main
    from tuner.layout import ClusterLayout

    monkeypatch.chdir(tmp_path)
    layout = ClusterLayout(tmp_path / "results", "my-h100s")
    layout.calibration_yaml.parent.mkdir(parents=True)
    layout.calibration_yaml.write_text("cluster: my-h100s\nobservations: 5\n")
    with pytest.raises(ConfigError) as exc:
        load_calibration(layout.calibration_yaml, layout.name)
    (printed,) = re.findall(r"(tune calibrate [^;]*) clears it", str(exc.value))
    assert main(shlex.split(printed)[1:]) == 0, capsys.readouterr().err
    assert not layout.calibration_yaml.exists()


def test_showing_a_probe_not_yet_measured_names_the_command_that_measures_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune profile --study X --probe --show`` before any probe said ``run tune profile
    --probe``, which is refused as printed (no study)."""
    from tuner.cli.main import main

    written(tmp_path, monkeypatch, PROBE_STUDY)
    assert main(["profile", "--study", GIVEN, "--probe", "--show"]) == 2
    err = capsys.readouterr().err
    assert "no framework probe yet" in err
    assert_repeats_the_file(err)


def test_tune_runs_closing_lines_name_the_study_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune run``'s ``tune space``, ``tune leaderboard``, ``tune best`` and ``tune report``
    hints, from the loop's study; with no trial measured, ``tune leaderboard --all``."""
    from types import SimpleNamespace

    from tuner.cli.progress import LiveProgress
    from tuner.layout import ResultsLayout
    from tuner.study.record import Summary

    spec = written(tmp_path, monkeypatch, PROBE_STUDY)
    monkeypatch.setenv("COLUMNS", "300")
    space = {"total": 4, "invalid": 0, "predicted_oom": 1, "viable": 3}
    layout = ResultsLayout(tmp_path / "results", spec.name)
    loop = SimpleNamespace(spec=spec, space_counts=space, trials=list, measured=lambda t: {},
                           layout=layout)  # fmt: skip
    LiveProgress(quiet=True).final(loop, Summary(launched=1, best_step_s=1.5, best_trial=0))  # type: ignore[arg-type]
    assert len(named_studies(out := capsys.readouterr().out)) == 4
    assert_repeats_the_file(out)
    assert f"all under {layout.study_dir}" in out  # where the results are
    assert "--results" not in out  # ./results: the commands find it as printed
    loop.trials = lambda: [SimpleNamespace(user_attrs={"outcome": "oom"})]  # none measured
    LiveProgress(quiet=True).final(loop, Summary(launched=1))  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "--all says how each ended" in out
    assert_repeats_the_file(out)
    # `tune run --results /scratch/r`: the printed commands would look in ./results instead
    loop.layout = ResultsLayout(tmp_path / "scratch r", spec.name)
    loop.trials = list
    LiveProgress(quiet=True).final(loop, Summary(launched=1, best_step_s=1.5, best_trial=0))  # type: ignore[arg-type]
    out = " ".join(capsys.readouterr().out.split())
    wanted = f"--results {shlex.quote(str(tmp_path / 'scratch r'))}"
    assert out.count(wanted) == 3, out  # leaderboard, best and report


def test_tune_runs_closing_lines_are_whole_lines_in_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped or written to a file (``make demo``'s log), the closing lines were folded at 80
    columns mid-sentence ("... 7 are predicted to run out of" / "memory ..."): their console
    was not the one every table prints through, which writes a line whole where there is no
    terminal."""
    from types import SimpleNamespace

    from tuner.cli.progress import LiveProgress
    from tuner.layout import ResultsLayout
    from tuner.study.record import Summary

    spec = written(tmp_path, monkeypatch, PROBE_STUDY)
    monkeypatch.delenv("COLUMNS", raising=False)
    space = {"total": 48, "invalid": 12, "predicted_oom": 7, "viable": 29, "memory_probes": 1}
    layout = ResultsLayout(tmp_path / ("a-long-folder-name" * 4) / "results", spec.name)
    loop = SimpleNamespace(spec=spec, space_counts=space, trials=list, measured=lambda t: {},
                           layout=layout)  # fmt: skip
    LiveProgress(quiet=True).final(loop, Summary(launched=1, best_step_s=1.5, best_trial=0))  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("space: 48 configs;") and line.endswith(")") for line in lines)
    assert any(line.startswith("next: tune best") and line.endswith(f"{layout.study_dir})")
               for line in lines), lines  # fmt: skip
    assert any(len(line) > 120 for line in lines)


BOARD = """\
name: board
model: {preset: llama2-7b}
training: {global_batch_size: 64}
cluster: {gpu: a100-80gb, gpus_per_node: 8, num_nodes: 1, executor: local}
framework: megatron
launch: {template: megatron_gpt, megatron_path: /opt/megatron, train_args: [--mock-data]}
space: {tp: [1, 2], pp: [2], micro_batch_size: [1], sequence_parallel: [true],
        distributed_optimizer: [true], pipeline_split: [%s]}
"""
SPLITS = ["first=14,last=18", "layout:Et*15|t*17L"]
"""Uneven splits of llama2-7b's 32 layers on two stages, one with a comma (the key's own
separator) and one with the shell's pipe and glob."""


def _in_a_shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``command`` as a user pastes it into bash, with this tree's ``tune`` first on PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
@pytest.mark.parametrize("split", SPLITS)
def test_the_reports_commands_run_as_printed(
    split: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary's "full launch script" left out ``--results`` (a study kept elsewhere was
    "no results for study"), and the trial views' ``tune estimate`` hint cut an uneven split
    at its comma and left a layout's ``|`` and ``*`` to the shell (a pipe)."""
    import optuna

    from tests.test_results import record
    from tuner.config.parallel import ParallelConfig
    from tuner.layout import ResultsLayout
    from tuner.outcome import Outcome
    from tuner.report import page
    from tuner.report import views as V
    from tuner.report.data import gather
    from tuner.report.shown import MAX_POINTS

    (tmp_path / "board.yaml").write_text(BOARD % ", ".join(f"'{s}'" for s in SPLITS))
    monkeypatch.chdir(tmp_path)
    spec = load_study("board.yaml")
    results = "kept elsewhere"
    layout = ResultsLayout(tmp_path / results, spec.name)
    layout.storage_path.parent.mkdir(parents=True)
    study = optuna.create_study(study_name=spec.name, storage=layout.storage_url)
    c = ParallelConfig(
        tp=2,
        pp=2,
        dp=2,
        micro_batch_size=1,
        global_batch_size=64,
        sequence_parallel=True,
        distributed_optimizer=True,
        pipeline_split=split,
    )
    record(study, spec, c, Outcome.OK, 2.0, launched=True, duration_s=60.0)  # fmt: skip
    data = gather(spec, results=results)

    summary = html.unescape("".join(str(t) for t in page._summary(data).tables))
    best = re.search(r"tune best [^<]*--emit script", summary)
    assert best is not None, summary
    done = _in_a_shell(best.group(0), tmp_path)
    assert done.returncode == 0, done.stderr
    assert (layout.study_dir / "exports" / "trial-0" / "launch.sh").is_file()

    many = dataclasses.replace(data, rows=data.rows * (MAX_POINTS + 1))
    hint = re.search(r"(tune estimate .*) \(the best", V.screened_note(many))
    assert hint is not None, V.screened_note(many)
    done = _in_a_shell(hint.group(1) + " --json", tmp_path)
    assert done.returncode == 0, done.stderr
    estimated = json.loads(done.stdout)["config"]
    assert (estimated["tp"], estimated["pp"], estimated["pipeline_split"]) == (2, 2, split)


def test_tune_runs_closing_lines_name_the_variables_the_study_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make demo-ssh`` sets TUNER_DEMO_ROOT and TUNER_DEMO_SSH for ``tune run`` alone; the
    ``tune best --study demo-ssh`` its closing lines suggested failed as printed (``environment
    variable TUNER_DEMO_SSH is not set``), and nothing had said the commands needed them."""
    from types import SimpleNamespace

    from tuner.cli.progress import LiveProgress
    from tuner.layout import ResultsLayout
    from tuner.study.record import Summary

    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv("TUNER_T_ROOT", str(tmp_path))
    monkeypatch.setenv("TUNER_T_PY", "/usr/bin/python3")
    data = copy.deepcopy(PROBE_STUDY)
    data["launch"].update(script="${TUNER_T_ROOT}/train.py", python="${TUNER_T_PY}",
                          extra_args=["$${TUNER_T_LITERAL}", "${TUNER_T_ROOT}"])  # fmt: skip
    text = "# ${TUNER_T_COMMENT}: a comment, no reference\n" + yaml.safe_dump(data)
    (tmp_path / "env.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    spec = load_study("env.yaml")
    loop = SimpleNamespace(spec=spec, space_counts={}, trials=list, measured=lambda t: {},
                           layout=ResultsLayout(tmp_path / "results", spec.name))  # fmt: skip
    LiveProgress(quiet=True).final(loop, Summary(launched=1, best_step_s=1.5, best_trial=0))  # type: ignore[arg-type]
    out = " ".join(capsys.readouterr().out.split())
    assert "tune best --study env.yaml" in out
    assert "need TUNER_T_ROOT and TUNER_T_PY set as for this run" in out, out
    assert "COMMENT" not in out and "LITERAL" not in out
    loop.spec = written(tmp_path, monkeypatch, PROBE_STUDY)  # no ${NAME}: no such line
    LiveProgress(quiet=True).final(loop, Summary(launched=1, best_step_s=1.5, best_trial=0))  # type: ignore[arg-type]
    assert "set as for this run" not in capsys.readouterr().out
