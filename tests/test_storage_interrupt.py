"""A Ctrl-C while ``tune run`` creates its study leaves no storage without the study
(:func:`tuner.study.storage.start_study`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tests.test_study import SURFACE, study_data, write_study
from tuner.cli.main import main
from tuner.layout import ResultsLayout
from tuner.spec.file import load_study
from tuner.study.storage import FINGERPRINT_ATTR, start_study

PAUSED = """
import signal, sys, time
from pathlib import Path

import optuna

from tuner.cli.main import main

# Ctrl-C as a terminal delivers it: a suite started in the background by a shell (``cmd &``)
# starts with SIGINT ignored, which Python then leaves ignored, and the test's SIGINT was lost
signal.signal(signal.SIGINT, signal.default_int_handler)

made = optuna.storages.RDBStorage.create_new_study


def paused(self, *args, **kwargs):  # Optuna's schema is in the database, the study not yet
    Path(sys.argv[1]).touch()
    time.sleep(600)  # the Ctrl-C lands here
    return made(self, *args, **kwargs)


optuna.storages.RDBStorage.create_new_study = paused
sys.exit(main(sys.argv[2:]))
"""
"""``tune run`` (its arguments after the flag file's path) paused where the study is about to
be created, the flag file made then."""


def test_ctrl_c_while_the_study_is_created_leaves_no_storage_without_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(tmp_path, study_data(tmp_path, SURFACE, n_trials=1))
    results, paused = tmp_path / "results", tmp_path / "paused"
    run = subprocess.Popen(
        [sys.executable, "-c", PAUSED, str(paused), "run", "--study", str(path), "--results",
         str(results), "--skip-preflight", "--quiet"], cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 120  # a guard against a hang, not a measure
    while not paused.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not paused.exists():
        run.kill()
        pytest.fail(f"tune run never reached the study's creation: {run.communicate()[0]}")
    spec = load_study(str(path))
    db = ResultsLayout(results, spec.name).storage_path
    assert db.exists()  # the schema made: what a Ctrl-C here used to leave behind
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 130, out
    assert not db.exists(), sorted(p.name for p in db.parent.iterdir())
    # the next read says there are no results yet (not that the study is not in the storage)
    assert main(["leaderboard", "--study", str(path), "--results", str(results)]) == 2
    assert "no results for study 'e2e'" in capsys.readouterr().err
    # and the next run creates the study
    _, study = start_study(spec, optuna.samplers.RandomSampler(), url=None, heartbeat_s=30,
                           layout=ResultsLayout(results, spec.name), force=False)  # fmt: skip
    assert study.user_attrs[FINGERPRINT_ATTR] == spec.fingerprint()
