"""Where ``tune`` writes its output, when that place fails: the reader of a pipe gone
(``| head -1``), a full device. Each is one way for every command, decided in
:mod:`tuner.cli.main`, never a traceback or an "Exception ignored" line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_hostile_inputs import HANG_GUARD_S, REPO
from tuner.cli import commands
from tuner.cli.main import READER_GONE, main


def _tune_into(stdout: int, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``tune ARGV`` with its standard output on descriptor ``stdout``, stderr captured."""
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli.main", *argv], cwd=cwd, stdout=stdout,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=HANG_GUARD_S, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [["catalog", "gpus"], ["catalog", "gpus", "--format", "json"], ["--version"]],
    ids=["rich table", "json", "argparse action"],
)
def test_a_reader_gone_is_the_same_quiet_status_for_every_command(
    tmp_path: Path, argv: list[str]
) -> None:
    """``tune X | head -1`` where head has gone before tune writes: a table was rich's exit
    status 1 with nothing said, a JSON document "tune: error: Broken pipe" and 1,
    ``--version`` a traceback. Each is SIGPIPE's status, 141, with stderr empty."""
    read, write = os.pipe()
    os.close(read)  # the reader gone: every write is EPIPE, at once and every time
    try:
        done = _tune_into(write, argv, tmp_path)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (READER_GONE, ""), done.stderr
    assert READER_GONE == 141


def test_a_broken_pipe_not_stdout_s_is_still_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only stdout's or stderr's reader gone is quiet: a pipe to a child (ssh's stdin) that
    breaks is an error to report, in its one line."""

    def child_gone(_args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    real = commands.build_parser

    def parser() -> tuple[object, dict[str, object]]:
        built, handlers = real()
        return built, {**handlers, "catalog": child_gone}

    monkeypatch.setattr(commands, "build_parser", parser)
    assert main(["catalog", "gpus"]) == 1
    assert capsys.readouterr().err == "tune: error: Broken pipe\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize(
    "argv",
    [["catalog", "gpus"], ["catalog", "gpus", "--format", "json"], ["--version"]],
    ids=["rich table", "json", "argparse action"],
)
def test_a_full_standard_output_is_one_line_naming_it(tmp_path: Path, argv: list[str]) -> None:
    """``tune X > /dev/full`` (a full disk or quota under ``> out.txt``) said "No space left
    on device" and 1, naming no file: it read as the results folder's. ``--version`` was a
    traceback. One line naming standard output, exit status 2 (where it was sent is the bad
    input, as a closed stdout), and no "Exception ignored" at exit."""
    with open("/dev/full", "w") as full:
        done = _tune_into(full.fileno(), argv, tmp_path)
    said = "tune: error: standard output: No space left on device\n"
    assert (done.returncode, done.stderr) == (2, said), done.stderr


@pytest.mark.slow
def test_a_study_whose_reader_is_gone_runs_on_and_records_every_trial(tmp_path: Path) -> None:
    """``tune -v run ... 2>&1 | head -2``: head goes after the first log lines, with trials
    running. What a user expects of a study is its trials, not its output: the loop runs on,
    every trial is run and recorded (none left running, none dropped) and the status is the
    reader's gone (141), with nothing said on the gone stderr."""
    import json

    from tests.test_study import SURFACE, standin_processes, study_data, write_study

    study = write_study(tmp_path, study_data(tmp_path, SURFACE, n_trials=2))
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tuner.cli.main", "-v", "--results", str(tmp_path / "r"),
             "run", "--study", str(study)],
            cwd=tmp_path, stdout=write, stderr=write, timeout=HANG_GUARD_S, check=False,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == READER_GONE
    listed = subprocess.run(
        [sys.executable, "-m", "tuner.cli.main", "--results", str(tmp_path / "r"),
         "leaderboard", "--study", str(study), "--format", "json", "--all"],
        cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    rows = json.loads(listed.stdout)
    assert sorted(r["outcome"] for r in rows) == ["ok", "ok"], listed.stdout[-2000:]
    assert standin_processes(tmp_path) == []
