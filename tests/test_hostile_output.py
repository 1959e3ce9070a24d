"""What ``tune`` prints must survive stored state that is odd or hostile: a trial numbered 0, a
figure that is not finite, control characters in a failure's reason, markup in the report's
hover texts. Each case was a defect found by feeding such state to the real commands."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState, create_trial

from tests.test_hostile_inputs import BASE
from tuner.cli.main import main
from tuner.config.parallel import ParallelConfig
from tuner.layout import ResultsLayout


def _strict_json(text: str) -> Any:
    """``text`` parsed as JSON proper: ``NaN`` and ``Infinity`` are no JSON (jq, a browser's
    ``JSON.parse`` and most parsers refuse them; Python's accepts them by default)."""

    def refuse(word: str) -> None:
        raise ValueError(f"{word} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _study(tmp_path: Path, attrs: list[dict[str, Any]]) -> Path:
    """BASE's study file with one trial stored per ``attrs`` (a measured one where it has a
    step time); returns the study file."""
    data = copy.deepcopy(BASE)
    data["launch"] |= {"train_args": ["--mock-data"], "megatron_path": "/opt/megatron"}
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(data))
    layout = ResultsLayout(tmp_path / "results", data["name"])
    layout.storage_path.parent.mkdir(parents=True)
    stored = optuna.create_study(study_name=data["name"], storage=layout.storage_url)
    config = ParallelConfig(tp=2, micro_batch_size=1, global_batch_size=8)
    for a in attrs:
        full = {"config": dataclasses.asdict(config), "key": config.key(), "launched": True,
                "hosts": ["n1"], "duration_s": 60.0, "predicted_step_s": 1.0,
                "predicted_peak_gib": 10.0, **a}  # fmt: skip
        step = full.get("step_time_s")
        state = TrialState.COMPLETE if step is not None else TrialState.FAIL
        stored.add_trial(create_trial(state=state, value=step, user_attrs=full))
    return study


def test_trial_0_and_the_one_stage_keep_their_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A column that is 0 in every row is left out and named (a figure: no bubble at pp = 1);
    a trial's or a stage's number is no figure: the board of a study whose one trial is trial 0
    said "0 in every row: trial" and showed no trial, the per-stage table of a pp = 1 config
    "0 in every row: stage"."""
    ok = {"outcome": "ok", "step_time_s": 1.2, "tokens_per_s": 1706.0, "mfu": 0.3,
          "peak_memory_gib": 11.0}  # fmt: skip
    study = _study(tmp_path, [ok])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["leaderboard", "--study", str(study)]) == 0
    out = capsys.readouterr().out
    assert "in every row: trial" not in out and " trial " in out.splitlines()[1], out
    assert main(["estimate", "--study", str(study), "--set", "tp=2"]) == 0
    out = capsys.readouterr().out
    assert "in every row: stage" not in out and "stage" in out, out


def test_json_of_a_figure_that_is_not_finite_is_null(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune best --format json`` wrote a stored infinity or NaN as ``Infinity`` / ``NaN``: no
    JSON (jq and ``JSON.parse`` refuse the document). It is null, as the leaderboard's JSON
    (pandas) already wrote it. A trial whose tokens/s is no figure is never the best
    (``tuner.outcome.figure``): ``tune best`` then says there is none, in one line."""
    odd = {"outcome": "ok", "step_time_s": 1.2, "tokens_per_s": float("inf"),
           "mfu": float("nan"), "peak_memory_gib": 11.0}  # fmt: skip
    (tmp_path / "odd").mkdir()
    (tmp_path / "ranked").mkdir()
    study = _study(tmp_path / "odd", [odd])
    monkeypatch.chdir(tmp_path / "odd")
    assert main(["leaderboard", "--format", "json", "--study", str(study)]) == 0
    row = _strict_json(capsys.readouterr().out)[0]
    assert row["mfu"] is None and row["tokens_per_s"] is None, row
    assert main(["best", "--format", "json", "--study", str(study)]) == 2
    assert "no measured trial has a finite step time" in capsys.readouterr().err
    ranked = {**odd, "tokens_per_s": 1706.0}  # the best, with a stored NaN MFU
    study = _study(tmp_path / "ranked", [ranked])
    monkeypatch.chdir(tmp_path / "ranked")
    assert main(["best", "--format", "json", "--study", str(study)]) == 0
    best = _strict_json(capsys.readouterr().out)["measured"]
    assert best["mfu"] is None and best["tokens_per_s"] == 1706.0, best


def test_a_database_another_process_holds_is_one_wait_then_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SQLite's busy timeout (60 s) waits for another process's lock; opening the storage then
    tried four times more, each waiting as long: ``tune leaderboard`` on a database held by an
    ``sqlite3`` shell said nothing for 314 s before its line. One wait, then the line."""
    import sqlite3
    import time

    from tuner.study import driver

    study = _study(tmp_path, [{"outcome": "ok", "step_time_s": 1.2, "tokens_per_s": 1706.0}])
    holder = sqlite3.connect(tmp_path / "results" / "hostile" / "study.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # as another program's open write transaction
    monkeypatch.setattr(driver, "SQLITE_BUSY_TIMEOUT_S", 0.05)
    pauses: list[float] = []
    monkeypatch.setattr(time, "sleep", pauses.append)  # the retries' pauses, not the driver's
    monkeypatch.chdir(tmp_path)
    try:
        assert main(["leaderboard", "--study", str(study)]) == 2
    finally:
        holder.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "database is locked" in lines[0], lines
    assert pauses == [], pauses


@pytest.mark.parametrize("columns", ["120", None])
def test_a_reason_s_control_characters_are_shown_not_obeyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    columns: str | None,
) -> None:  # fmt: skip
    """A failed trial's reason is the tail of a program's output; the board printed its colour
    code, carriage return and right-to-left override raw: the terminal turned red, and the
    rest of the row was drawn over its start or backwards. Each is shown as its escape."""
    reason = "\x1b[31mRuntimeError: CUDA error\x07\rcut\u202eoof"
    study = _study(tmp_path, [{"outcome": "launch_error", "reason": reason}])
    monkeypatch.chdir(tmp_path)
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)  # a file: the plain table
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert main(["leaderboard", "--study", str(study), "--all", "--columns", "trial,reason"]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\r\u202e"), repr(out)
    shown = "\\x1b[31mRuntimeError: CUDA error\\x07\\rcut\\u202eoof"
    assert shown in out.replace("\n ", "").replace(" \n", ""), out


def test_an_error_quoting_a_newline_stays_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune: error:`` is one line: a ``--results`` folder named with a newline made it two."""
    study = _study(tmp_path, [])
    monkeypatch.chdir(tmp_path)
    assert main(["leaderboard", "--study", str(study), "--results", "new\nline"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "new\\nline" in lines[0], lines


def test_a_character_yaml_refuses_is_named_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A NUL or a terminal's bell in a study file said only "invalid YAML": which character,
    and where in a file of hundreds of lines, was for the user to find."""
    text = yaml.safe_dump(BASE)
    lines = text.count("\n")
    for char in ("\0", "\x07"):
        study = tmp_path / "study.yaml"
        study.write_text(text + f"description: a{char}b\n")
        assert main(["space", "--study", str(study)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        said = f"a character YAML does not allow ({char!r}) at line {lines + 1}"
        assert len(err) == 1 and err[0].endswith(said), err


@pytest.mark.parametrize(("host", "line"), [("gpu1:2222", 2), ("[gpu1]:22", 1)])
def test_a_host_with_a_port_is_refused_naming_where_a_port_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str, line: int
) -> None:
    """``gpu1:2222`` in a hostfile was taken for a host of that name (':' is allowed for IPv6
    addresses): only the preflight's connection said "cannot connect to user@gpu1:2222:22"."""
    hosts = tmp_path / "hosts"
    hosts.write_text("gpu0\ngpu1:2222\n" if line == 2 else f"{host}\n")
    data = copy.deepcopy(BASE)
    data["cluster"] = {"gpu": "h100-sxm-80gb", "gpus_per_node": 2, "hostfile": str(hosts)}
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(data))
    assert main(["space", "--study", str(study)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"hosts:{line}: '{host}' is not a host name" in err[0], err
    assert "a port is cluster.ssh.port" in err[0], err


@pytest.mark.parametrize(("damage", "words"), [
    ("random-bytes", "cannot open storage 'sqlite:///"),
    ("another-programs-database", "cannot read the study's storage: no such column"),
])  # fmt: skip
def test_the_dry_run_of_a_study_whose_storage_is_unusable_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, words: str
) -> None:
    """``tune run --dry-run`` planned the study (exit 0) over a storage ``tune run`` could not
    open (bytes that are no database) or read (another program's database): the plan was of a
    run that could not start. As the read commands, it says so in one line, exit 2."""
    import sqlite3

    study = _study(tmp_path, [])
    db = tmp_path / "results" / "hostile" / "study.db"
    db.unlink()
    if damage == "random-bytes":
        db.write_bytes(bytes(range(256)) * 64)
    else:
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE studies (owner TEXT)")
    argv = ["run", "--study", str(study), "--dry-run", "--results", str(tmp_path / "results")]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines


def test_a_log_s_huge_figure_keeps_the_table_in_its_width(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``elapsed time per iteration (ms): 1e300`` (finite, above zero: a step time) was a
    301-digit cell, the table 370 columns wide at COLUMNS=80."""
    from tests.test_proxy import _megatron_log

    log = tmp_path / "node-0.log"
    _megatron_log(log, 1e300)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["parse-log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "e+300" in out and max(len(line) for line in out.splitlines()) <= 80, out


def test_a_reason_s_bars_and_line_breaks_keep_the_markdown_table_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reason quoting a Megatron line (``|``-separated) split its cell into columns of the
    Markdown table, and a line break in it split the row."""
    reason = " iteration 3/ 5 | lm loss: nan |\n\x1b[31mRuntimeError"
    study = _study(tmp_path, [{"outcome": "diverged", "reason": reason}])
    monkeypatch.chdir(tmp_path)
    assert main(["leaderboard", "--study", str(study), "--all", "--format", "markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines  # the header, its rule, the one trial
    bars = {line.replace("\\|", "").count("|") for line in lines}
    assert len(bars) == 1, lines  # as many cells in the row as in the header
    assert "iteration 3/ 5 \\| lm loss: nan \\|\\n\\x1b[31mRuntimeError" in lines[2]
