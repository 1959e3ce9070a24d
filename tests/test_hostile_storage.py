"""Hostile storages on ``tune``'s command line: folders, malformed URLs, files that are no
database, records Optuna cannot replay. Each is one line naming the option and what is wrong,
exit status 2, and a read command leaves nothing where it looked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuner.cli.main import main


@pytest.mark.parametrize(("record", "why"), [
    ('{"op_code": 0, "worker_id": "w"}', "KeyError: 'study_name'"),
    ("{}", "KeyError: 'op_code'"),
    ('{"op_code": 99}', "AssertionError: Should not reach."),
])  # fmt: skip
def test_a_journal_record_optuna_cannot_replay_says_so(
    record: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A whole record of another program or another Optuna was one bare word:
    ``cannot open storage 'journal:j.log': 'study_name'``."""
    journal = tmp_path / "j.log"
    journal.write_text(record + "\n")
    storage = f"journal:{journal}"
    assert main(["leaderboard", "--study", "demo", "--storage", storage]) == 2
    assert capsys.readouterr().err == (f"tune: error: cannot open storage {storage!r}: a record "
                                       f"this Optuna cannot replay ({why})\n")  # fmt: skip


@pytest.mark.parametrize("command", ["leaderboard", "best", "report"])
@pytest.mark.parametrize("storage", ["sqlite:///{}/no/such/x.db", "journal:{}/x.log",
                                     "sqlite:///{}/x.db?timeout=5"])  # fmt: skip
def test_a_read_command_makes_no_storage_where_none_is(
    command: str, storage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune leaderboard --storage sqlite:///typo/x.db`` made the folders and an empty
    database there, then said the study was not in it; so did a URL with arguments the driver
    takes (``?timeout=5``)."""
    url = storage.format(tmp_path)
    assert main([command, "--study", "demo", "--storage", url]) == 2
    file = url.removeprefix("sqlite:///").removeprefix("journal:").partition("?")[0]
    assert capsys.readouterr().err == (f"tune: error: no results for study 'demo': {file!r} "
                                       "does not exist (tune run with that --storage makes "
                                       "it)\n")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["leaderboard", "best", "report"])
def test_a_read_command_writes_no_schema_into_an_empty_file(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--storage sqlite:///x.db`` where x.db is an empty file (``touch``-ed, or cut to
    nothing): a read command wrote Optuna's tables into it (114 KB), then said the study was
    not in it."""
    (empty := tmp_path / "x.db").touch()
    assert main([command, "--study", "demo", "--storage", f"sqlite:///{empty}"]) == 2
    assert capsys.readouterr().err == (f"tune: error: no results for study 'demo': "
                                       f"{str(empty)!r} is empty (tune run with that --storage "
                                       "makes it)\n")  # fmt: skip
    assert empty.stat().st_size == 0 and sorted(os.listdir(tmp_path)) == ["x.db"]


@pytest.mark.parametrize("command", ["leaderboard", "best", "report"])
def test_a_read_command_leaves_nothing_beside_the_database(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read of a database left its creation lock (``x.db.create-lock``) beside it: only
    a writer creates, so only a writer needs the lock."""
    import optuna

    monkeypatch.chdir(tmp_path)
    (db := tmp_path / "d" / "x.db").parent.mkdir()
    optuna.create_study(study_name="demo", storage=f"sqlite:///{db}")
    argv = [command, "--study", "demo", "--storage", f"sqlite:///{db}"]
    assert main([*argv, *(["--out", str(tmp_path / "r.html")] if command == "report" else [])]
                ) in (0, 2)  # fmt: skip
    assert os.listdir(db.parent) == ["x.db"]


@pytest.mark.parametrize("command", ["leaderboard", "best", "report", "run"])
@pytest.mark.parametrize(("url", "file"), [("sqlite:///{}", "study.db"),
                                           ("sqlite:///{}/", "study.db"),
                                           ("sqlite:///{}?timeout=5", "study.db?timeout=5"),
                                           ("journal:{}", "study.log")])  # fmt: skip
def test_a_folder_given_as_the_storage_says_it_is_a_folder(
    command: str, url: str, file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``--storage sqlite:////tmp`` said SQLite's "unable to open database file", naming
    neither the folder nor what to give instead."""
    monkeypatch.chdir(tmp_path)
    (folder := tmp_path / "shared").mkdir()
    given = url.format(folder)
    assert main([command, "--study", "demo", "--storage", given, "--results", "r"]) == 2
    assert capsys.readouterr().err == (
        f"tune: error: cannot open storage {given!r}: {str(folder)!r} is a folder; name a "
        f"file in it ({given.partition('?')[0].rstrip('/')}/{file})\n"
    )
    assert os.listdir(folder) == []


def test_a_folder_where_the_default_database_goes_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (db := tmp_path / "demo" / "study.db").mkdir(parents=True)
    for command in ("run", "leaderboard"):
        assert main([command, "--study", "demo", "--results", str(tmp_path)]) == 2
        assert capsys.readouterr().err == (
            f"tune: error: cannot open storage 'sqlite:///{db}': {str(db)!r} is a folder, where "
            "the study's database goes; move it away, or give --storage URL\n"
        )


def test_an_sqlite_uri_storage_is_its_file_not_a_folder_named_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sqlite:///file:/data/x.db?mode=ro&uri=true`` (SQLite's own URI, SQLAlchemy's way to a
    read-only open) was taken for the file ``file:/data/x.db`` under the current folder: a read
    made the folders ``file:/data`` there and a lock file in them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    url = f"sqlite:///file:{tmp_path / 'data' / 'x.db'}?mode=ro&uri=true"
    assert main(["leaderboard", "--study", "demo", "--storage", url]) == 2
    assert capsys.readouterr().err == (f"tune: error: no results for study 'demo': "
                                       f"{str(tmp_path / 'data' / 'x.db')!r} does not exist "
                                       "(tune run with that --storage makes it)\n")  # fmt: skip
    assert [p.name for p in tmp_path.rglob("*")] == ["data"]


MALFORMED_URLS = [
    ("postgresql://u@[::1", "the host's '[' has no closing ']' (an IPv6 host is written [::1])"),
    ("postgresql://u:secret@[::1/db",
     "the host's '[' has no closing ']' (an IPv6 host is written [::1])"),
    ("postgresql://u@db:abc/tuner", "the port 'abc' is not a number from 0 to 65535"),
    ("postgresql://u@db:99999/tuner", "the port '99999' is not a number from 0 to 65535"),
]  # fmt: skip


@pytest.mark.parametrize("command", ["leaderboard", "best", "report", "run"])
@pytest.mark.parametrize(("url", "words"), MALFORMED_URLS)
def test_a_malformed_storage_url_names_the_option_and_what_is_wrong(
    command: str, url: str, words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``postgresql://u@[::1`` said "invalid literal for int() with base 10: ':1'" (SQLAlchemy's
    port parsing), naming neither the option nor the bracket; its password stays hidden."""
    monkeypatch.chdir(tmp_path)
    assert main([command, "--study", "demo", "--storage", url]) == 2
    shown = url.replace(":secret@", ":***@")
    assert capsys.readouterr().err == f"tune: error: --storage {shown!r}: {words}\n"


def test_a_journal_storage_without_a_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--storage journal:`` was the folder "." as a journal: "PosixPath('.') has an empty
    name" from deep inside the opening."""
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--study", "demo", "--storage", "journal:", "--results", "r"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "tune: error: --storage journal: needs a file: journal:FILE\n"
    assert [p for p in tmp_path.rglob("*") if not p.is_dir()] == []  # no journal anywhere


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:",
                                 "sqlite:///file:s?mode=memory&uri=true"])  # fmt: skip
def test_a_storage_in_memory_is_refused(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune run --storage sqlite:///:memory:`` measured into a database gone when it ended:
    every trial lost, never seen by ``tune leaderboard`` or another worker."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--study", "demo", "--storage", url, "--results", "r"]) == 2
    assert capsys.readouterr().err == (
        f"tune: error: --storage {url!r}: an SQLite database in memory keeps nothing once tune "
        "ends; give a file (sqlite:///PATH)\n"
    )
    assert not (tmp_path / "r").exists()


def test_a_trial_whose_folder_cannot_be_made_runs_again_not_running_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``results/X/trials`` a file (or any folder the results cannot hold): tune stopped with
    the one line, and the trial it had asked for stayed "running" in the storage for ever
    (never launched, so no later worker took it for a dead one's): recorded ``interrupted``, it
    runs again on resume."""
    import optuna

    from tests.test_study import SURFACE, study_data, write_study
    from tuner.layout import ResultsLayout

    monkeypatch.chdir(tmp_path)
    data = study_data(tmp_path, SURFACE, n_trials=1)
    data["space"] = {"tp": [2], "pp": [1], "micro_batch_size": [4]}  # one config: quick to make
    study, layout = write_study(tmp_path, data), ResultsLayout(tmp_path / "results", "e2e")
    layout.study_dir.mkdir(parents=True)
    layout.trials_dir.write_text("")
    argv = ["run", "--study", str(study), "--results", str(layout.root), "--skip-preflight"]
    assert main([*argv, "--quiet"]) == 1
    assert capsys.readouterr().err.endswith("trials/0: Not a directory\n")
    (trial,) = optuna.load_study(study_name="e2e", storage=layout.storage_url).trials
    assert trial.state == optuna.trial.TrialState.FAIL  # FAIL: queued again on resume
    assert trial.user_attrs["outcome"] == "interrupted"


DAMAGED_LEASES = [
    ('{"study\\nhost:n1": {"resource": "host:n1", "hol', "Unterminated string"),  # cut short
    ("[1, 2]", "not a JSON object of leases"),
    ("null", "not a JSON object of leases"),
    ('{"x": 5}', "'x' is no lease"),
    ('{"e2e\\nhost:n1": {"resource": "host:n1", "holder": "w", "renewed_at": "soon"}}',
     "'e2e\\nhost:n1' is no lease"),
    ("caf\xe9", "can't decode byte 0xe9"),
]  # fmt: skip


@pytest.mark.parametrize(("content", "words"), DAMAGED_LEASES, ids=[
    "cut-short", "a-list", "null", "no-lease", "a-time-that-is-text", "not-utf8"])  # fmt: skip
def test_a_damaged_journal_leases_file_is_one_line_and_exit_2(
    content: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The node leases beside a journal storage (``FILE.leases``), damaged: a worker killed
    while it rewrote the file in place left it cut short, and every later ``tune run`` on the
    study was a JSONDecodeError's (or a TypeError's) traceback, exit 1."""
    from tests.test_study import SURFACE, study_data, write_study

    study = write_study(tmp_path, study_data(tmp_path, SURFACE, n_trials=1))
    journal = tmp_path / "j.log"
    (tmp_path / "j.log.leases").write_bytes(content.encode("latin-1"))
    argv = ["--quiet", "--storage", f"journal:{journal}", "--results", str(tmp_path / "r"),
            "run", "--study", str(study)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tune: error: the node leases {journal}.leases cannot be read (")
    assert words in err and err.count("\n") == 1, err


def test_the_journal_leases_file_is_replaced_whole_never_rewritten_in_place(
    tmp_path: Path,
) -> None:
    """Each change was written over the open file (truncate, then write): a kill or a full disk
    between the two left it cut short (above). Now each change is a new file renamed over the
    old one, so a reader sees the old leases or the new, whole."""
    from tuner.layout import ResultsLayout
    from tuner.study.leases import open_leases

    leases = open_leases(f"journal:{tmp_path / 'j.log'}", ResultsLayout(tmp_path, "s"))
    leases.claim(["host:n1"], "w1")
    first = os.stat(tmp_path / "j.log.leases").st_ino
    leases.claim(["host:n2"], "w1")
    assert os.stat(tmp_path / "j.log.leases").st_ino != first
    assert {x.resource for x in leases.held()} == {"host:n1", "host:n2"}
