"""Opening a study's storage (:mod:`tuner.study.storage`): a database server that does not
answer fails in seconds, once, in one line."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
import yaml

from tests.postgres import PostgresServer
from tests.test_hostile_inputs import BASE
from tuner.cli.main import main
from tuner.layout import ResultsLayout
from tuner.study.driver import CONNECT_TIMEOUT_S, KEEPALIVE, connect_args
from tuner.study.leases import _SQLBackend
from tuner.study.storage import creation_lock, open_storage
from tuner.study.url import resolve_url


@pytest.fixture
def silent_server() -> Iterator[tuple[int, list[socket.socket]]]:
    """A port where connections are accepted and never answered (a firewall that lets the
    handshake through, another service on the database's port): its number and the
    connections it took."""
    server = socket.create_server(("127.0.0.1", 0))
    taken: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                taken.append(server.accept()[0])
            except OSError:  # closed at the end of the test
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1], taken
    server.close()
    for conn in taken:
        conn.close()


@pytest.mark.timeout(10 * CONNECT_TIMEOUT_S)  # a hang (libpq's default) fails here
def test_a_server_that_never_answers_is_one_line_after_one_connect_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
    silent_server: tuple[int, list[socket.socket]],
) -> None:  # fmt: skip
    """``tune`` waited for ever on such a port; then, with a connect timeout, retried it five
    times as if another worker had raced it for the schema."""
    pytest.importorskip("psycopg2")
    port, taken = silent_server
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(BASE))
    url = f"postgresql+psycopg2://u:secret@127.0.0.1:{port}/db"
    assert main(["leaderboard", "--study", str(study), "--storage", url]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "timeout expired" in lines[0], lines
    assert "secret" not in lines[0]
    assert len(taken) == 1  # one connect timeout, not five


def test_connect_args_bound_the_wait_and_keep_the_urls_own() -> None:
    ours = {"connect_timeout": CONNECT_TIMEOUT_S, **KEEPALIVE}
    assert connect_args("postgresql://u@db/t") == ours
    assert connect_args("postgresql+psycopg2://u@db/t?connect_timeout=3&keepalives_idle=5") == {
        k: v for k, v in ours.items() if k not in ("connect_timeout", "keepalives_idle")
    }
    assert connect_args("postgresql+pg8000://u@db/t") == {}  # not libpq: no such arguments
    assert connect_args("sqlite:///x.db") == {"timeout": 60}


def _socket_bounds(engine: sa.Engine) -> dict[str, int]:
    """The keepalive bounds the kernel holds for one of ``engine``'s connections."""
    raw = engine.raw_connection()
    try:
        with socket.socket(fileno=os.dup(raw.dbapi_connection.fileno())) as s:
            tcp = {"keepalives_idle": socket.TCP_KEEPIDLE, "keepalives_interval":
                   socket.TCP_KEEPINTVL, "keepalives_count": socket.TCP_KEEPCNT,
                   "tcp_user_timeout": socket.TCP_USER_TIMEOUT}  # fmt: skip
            out = {k: s.getsockopt(socket.IPPROTO_TCP, v) for k, v in tcp.items()}
            return {"keepalives": s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), **out}
    finally:
        raw.close()


def test_a_server_gone_silent_is_noticed_on_every_engine_and_the_urls_own_bound_wins(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """Connected, a vanished server was noticed by the kernel's defaults: after 2 h 11 min
    idle, about 15 min with a statement in flight. The study's and the leases' connections
    carry the bounds on their sockets; one the URL sets is the URL's."""
    url = postgres.create_database("keepalive")
    layout = ResultsLayout(tmp_path / "results", "s")
    storage = open_storage(url, layout)
    assert isinstance(storage, optuna.storages.RDBStorage)
    assert _socket_bounds(storage.engine) == KEEPALIVE
    assert _socket_bounds(_SQLBackend(url)._engine) == KEEPALIVE
    own = open_storage(f"{url}?keepalives_idle=7&tcp_user_timeout=9000", layout)
    assert isinstance(own, optuna.storages.RDBStorage)
    assert _socket_bounds(own.engine) == {**KEEPALIVE, "keepalives_idle": 7,
                                          "tcp_user_timeout": 9000}  # fmt: skip


def test_the_creation_lock_is_not_optunas_journal_lock(tmp_path: Path) -> None:
    """Both were ``FILE.lock``: Optuna's journal writers (a symbolic link made with O_EXCL
    semantics) found tuner's file there, waited 30 s at every start of ``tune run`` on a
    journal, then deleted it while tuner held it."""
    journal = tmp_path / "study.log"
    where = resolve_url(f"journal:{journal}", ResultsLayout(tmp_path / "results", "s"))
    with creation_lock(where):
        os.symlink(journal, f"{journal}.lock")  # what Optuna's lock does first; free


def test_an_sqlite_urls_arguments_are_no_part_of_its_file(tmp_path: Path) -> None:
    """``sqlite:///d/x.db?timeout=5`` is the file ``d/x.db`` (its creation lock was
    ``x.db?timeout=5.create-lock``, and the file looked for ``x.db?timeout=5``)."""
    where = resolve_url(f"sqlite:///{tmp_path}/x.db?timeout=5", ResultsLayout(tmp_path, "s"))
    assert where.local_file == tmp_path / "x.db"
