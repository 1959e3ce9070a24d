"""``tune profile --cluster FILE`` (:mod:`tuner.cli.profile`): a damaged cluster file is one line
naming it, and the commands printed for such a study repeat ``--cluster FILE``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.test_hostile_inputs import BASE

CLUSTER_TEXT = yaml.safe_dump({"cluster": BASE["cluster"], "model": BASE["model"]})
FILE = "my cluster.yaml"  # a space: the printed command must quote it


def _bomb() -> str:
    """A "billion laughs": nine levels of nine aliases of the level below."""
    levels = (f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'lol'}]\n" for i in range(9))
    return CLUSTER_TEXT + "".join(levels)


# (id, the file made at the path, words of the one line). Each was a traceback (the YAML
# parser's own error) or a line without the file's name before.
BAD_CLUSTER_FILES: list[tuple[str, Callable[[Path], object], str]] = [
    ("missing", lambda p: None, "cannot read the cluster file: No such file or directory"),
    ("a-folder", Path.mkdir, "cannot read the cluster file: Is a directory"),
    ("a-fifo", os.mkfifo, "cannot read the cluster file: not a regular file"),
    ("not-utf8", lambda p: p.write_bytes(b"cluster: caf\xe9\n"), "not UTF-8 text (byte 0xe9"),
    ("alias-bomb", lambda p: p.write_text(_bomb()), "aliases (*name) are not allowed at line"),
    ("duplicate-key", lambda p: p.write_text(CLUSTER_TEXT + "model: {}\n"),
     "duplicate key 'model' at line"),
    ("tab-indent", lambda p: p.write_text("cluster:\n\tgpu: x\n"), "(a tab: write spaces there)"),
    ("unclosed-bracket", lambda p: p.write_text("cluster: [x\n"), "at line"),
    ("deep-nesting", lambda p: p.write_text("x: " + "[" * 3000 + "]" * 3000),
     "invalid YAML: nested too deeply"),
    ("a-list", lambda p: p.write_text("- cluster\n"), "a cluster file needs a cluster: section"),
]  # fmt: skip


@pytest.mark.timeout(60)  # the alias bomb must not be walked
@pytest.mark.parametrize(("make", "words"), [c[1:] for c in BAD_CLUSTER_FILES],
                         ids=[c[0] for c in BAD_CLUSTER_FILES])  # fmt: skip
def test_a_bad_cluster_file_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], object], words: str,
) -> None:  # fmt: skip
    from tuner.cli.main import main

    monkeypatch.chdir(tmp_path)
    make(tmp_path / FILE)
    assert main(["profile", "--cluster", FILE, "--show"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert lines[0].startswith(f"tune: error: {FILE}: ") and words in lines[0], lines[0]


@pytest.mark.parametrize(
    ("flags", "command"),
    [((), "tune profile --cluster 'my cluster.yaml' measures it"),
     (("--probe",), "tune profile --cluster 'my cluster.yaml' --probe measures it")],
)  # fmt: skip
def test_the_printed_command_repeats_the_cluster_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    flags: tuple[str, ...], command: str,
) -> None:  # fmt: skip
    """``tune profile --cluster FILE --probe --show`` said ``tune profile --study profile
    --probe``: a study of that name does not exist (the name is the cluster file's default)."""
    from tuner.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / FILE).write_text(CLUSTER_TEXT)
    assert main(["profile", "--cluster", FILE, *flags, "--show"]) == 2
    err = capsys.readouterr().err
    assert command in err and "--study" not in err, err


def test_a_failed_profile_prints_nothing_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile job that failed left a blank line on stdout before its error (the progress
    bar's, ended on stdout): a failing command's stdout is empty, its error one line."""
    from tuner.cli.main import main
    from tuner.errors import LaunchError
    from tuner.profile import run

    def failed(*args: object, on_progress: Callable[[int, int], None], **kw: object) -> None:
        on_progress(1, 4)
        raise LaunchError("the profile job failed (see node-0.log): no output")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run, "run_probe", failed)
    (tmp_path / FILE).write_text(CLUSTER_TEXT)
    assert main(["profile", "--cluster", FILE]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == "tune: error: the profile job failed (see node-0.log): no output\n"
