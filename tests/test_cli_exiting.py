"""The read commands leave what they built to the process's exit (``tuner.cli.exiting``): the
collector paused while they run, what is alive frozen when they return; any other command, and
a read command that fails, leave the collector as they found it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import yaml

from tests.report.test_leaderboard import STUDY, add
from tuner.cli.exiting import kept_to_exit
from tuner.cli.main import main
from tuner.layout import ResultsLayout
from tuner.spec.file import study_from_mapping
from tuner.study.storage import open_storage

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process goes on: its objects back to the collector


def test_a_read_command_freezes_what_it_leaves(tmp_path: Path) -> None:
    spec = study_from_mapping(STUDY)
    layout = ResultsLayout(tmp_path, spec.name)
    study = optuna.create_study(study_name=spec.name, storage=open_storage(None, layout))
    add(study, spec, 0, 1.0)
    path = tmp_path / "board.yaml"
    path.write_text(yaml.safe_dump(STUDY))
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert main(["leaderboard", "--study", str(path), "--results", str(tmp_path)]) == 0
    assert gc.isenabled() and gc.get_freeze_count() > 0


def test_other_commands_and_failures_leave_the_collector_as_it_was() -> None:
    with kept_to_exit("run"):
        assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), kept_to_exit("report"):
        assert not gc.isenabled()  # paused while a read command runs
        raise RuntimeError("the storage went away")
    assert gc.isenabled() and gc.get_freeze_count() == 0
