"""A journal storage's last record (:mod:`tuner.study.journal`): a record torn by a worker that
stopped mid-write is cut off before anything is appended; a file that is no journal is refused
in one line and left as it is."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest

from tuner.errors import StudyError
from tuner.layout import ResultsLayout
from tuner.study.storage import open_storage

TORN = b'{"op_code": 4, "worker_id": "w", "trial_id": 0, "datetime_com'


def _journal_with_trials(path: Path, n: int) -> None:
    layout = ResultsLayout(path.parent / "results", "s")
    storage = open_storage(f"journal:{path}", layout)
    study = optuna.create_study(study_name="s", storage=storage, load_if_exists=True)
    for _ in range(n):
        study.tell(study.ask(), 1.0)


def _trials(path: Path) -> int:
    layout = ResultsLayout(path.parent / "results", "s")
    storage = open_storage(f"journal:{path}", layout)
    return len(optuna.load_study(study_name="s", storage=storage).trials)


def test_a_torn_last_record_is_cut_and_the_study_goes_on(tmp_path: Path) -> None:
    """Appended to, the torn record joined the next one into a line Optuna cannot parse: the
    next ``tune run`` died on a JSONDecodeError and every command after it said "cannot open
    storage" (the trials recorded after the tear lost to all of them)."""
    path = tmp_path / "study.log"
    _journal_with_trials(path, 2)
    whole = path.read_bytes()
    with path.open("ab") as f:
        f.write(TORN)
    _journal_with_trials(path, 1)  # joins the study, appends a trial
    assert path.read_bytes().startswith(whole)  # the records before the tear are kept
    assert _trials(path) == 3


@pytest.mark.parametrize(
    ("content", "words"),
    [(b"hello\n", "its last line is not an Optuna journal record: 'hello'"),
     (b"no line end", "not an Optuna journal (its last line has no line end"),
     (b"\xff\xfe\n", "its last line is not an Optuna journal record: '\\\\xff\\\\xfe'")],
)  # fmt: skip
def test_a_file_that_is_no_journal_is_refused_and_left_alone(
    tmp_path: Path, content: bytes, words: str
) -> None:
    """``hello`` as the last line made ``tune run`` append a study after it and die on the
    next read (a traceback), and the file was no journal after that either."""
    path = tmp_path / "notes.log"
    path.write_bytes(content)
    with pytest.raises(StudyError) as exc:
        open_storage(f"journal:{path}", ResultsLayout(tmp_path / "results", "s"))
    assert str(path) in str(exc.value) and words in str(exc.value), str(exc.value)
    assert path.read_bytes() == content
    assert not os.path.lexists(f"{path}.lock")  # the writers' lock given back
