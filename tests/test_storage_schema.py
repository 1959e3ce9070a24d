"""Reading a stored study without Optuna's alembic import (:mod:`tuner.study.schema`): only a
storage at Optuna's head schema skips it; one of another schema version fails with Optuna's own
message in one line, and a new one is stamped as Optuna stamps it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa

from tests.postgres import PostgresServer
from tests.report.test_leaderboard import STUDY, add
from tuner.errors import StudyError
from tuner.layout import ResultsLayout
from tuner.report.leaderboard import leaderboard
from tuner.spec.file import study_from_mapping
from tuner.study.schema import CheckedVersions, at_head, head_revision, schema_checked
from tuner.study.storage import open_storage

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")
SPEC = study_from_mapping(STUDY)


def _stored(results: Path, trials: int = 3) -> Path:
    layout = ResultsLayout(results, SPEC.name)
    study = optuna.create_study(study_name=SPEC.name, storage=open_storage(None, layout))
    for i in range(trials):
        add(study, SPEC, i, 1.0 + i)
    return ResultsLayout(results, SPEC.name).storage_path


def _stamp(db: Path, revision: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = ?", (revision,))


def test_the_head_revision_is_alembics(tmp_path: Path) -> None:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'x.db'}")
    assert head_revision() == storage.get_head_version()
    assert at_head(storage.engine)
    assert CheckedVersions(storage.url, storage.engine, storage.scoped_session)._manager is None


def test_a_current_storage_is_read_without_importing_alembic(tmp_path: Path) -> None:
    _stored(tmp_path)
    code = (
        "import sys\nfrom tests.test_storage_schema import SPEC\n"
        "from tuner.report.leaderboard import leaderboard\n"
        f"board = leaderboard(SPEC, results={str(tmp_path)!r})\n"
        "print(len(board), 'alembic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[1]).stdout  # fmt: skip
    assert out.split() == ["3", "False"]


@pytest.mark.parametrize(("revision", "words"), [
    ("v3.0.0.d", "optuna storage upgrade"), ("v99.0.0.a", "updating optuna"),
])  # fmt: skip
def test_a_storage_of_another_schema_version_is_one_clear_line(
    tmp_path: Path, revision: str, words: str
) -> None:
    db = _stored(tmp_path)
    _stamp(db, revision)
    with pytest.raises(StudyError) as read:
        leaderboard(SPEC, results=str(tmp_path))
    with pytest.raises(StudyError) as optunas:  # Optuna's own check, alembic and all
        open_storage(None, ResultsLayout(tmp_path, SPEC.name))
    message = str(read.value)
    assert message == str(optunas.value)
    assert "\n" not in message and words in message and "no longer compatible" in message


def test_a_new_storage_is_stamped_as_optuna_stamps_it(tmp_path: Path) -> None:
    with schema_checked():
        storage = open_storage(None, ResultsLayout(tmp_path, SPEC.name))
    assert isinstance(storage, optuna.storages.RDBStorage)
    with storage.engine.connect() as conn:
        stamped = [r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))]
    assert stamped == [head_revision()] and at_head(storage.engine)
    assert storage.get_current_version() == storage.get_head_version()  # Optuna's manager


def test_on_postgresql_too(postgres: PostgresServer, tmp_path: Path) -> None:
    """The head read on PostgreSQL; an older revision still fails with Optuna's message."""
    url = postgres.create_database("schema")
    layout = ResultsLayout(tmp_path, SPEC.name)
    storage = open_storage(url, layout)
    assert isinstance(storage, optuna.storages.RDBStorage) and at_head(storage.engine)
    optuna.create_study(study_name=SPEC.name, storage=storage)
    assert leaderboard(SPEC, storage=url, results=str(tmp_path)).empty
    with storage.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'v3.0.0.d'"))
    assert not at_head(storage.engine)
    with pytest.raises(StudyError) as read, schema_checked():
        open_storage(url, layout)
    assert "\n" not in str(read.value) and "optuna storage upgrade" in str(read.value)
