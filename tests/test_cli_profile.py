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


class _Job:
    """A profile job whose node-0 log is ``lines``, one more at each poll, then done."""

    def __init__(self, log: Path, lines: list[str]) -> None:
        self.log, self.lines, self.polls = log, lines, 0

    def poll(self) -> object | None:
        from types import SimpleNamespace

        self.polls += 1
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text("".join(self.lines[: self.polls]))
        return SimpleNamespace(ok=True) if self.polls >= len(self.lines) else None

    def cancel(self) -> None:
        pass


class _Executor:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def master_addr(self, hosts: object) -> str:
        return "127.0.0.1"

    def master_port(self, hosts: object, port: int) -> int:
        return port

    def submit(self, request: object) -> _Job:
        return _Job(request.paths.node_log(0), self.lines)  # type: ignore[attr-defined]


def test_a_profile_job_s_cut_lines_are_one_error_not_a_traceback(tmp_path: Path) -> None:
    """The job's log is read while it is written: a progress line cut short (or run into by
    another rank's output) was a ValueError that ended ``tune profile``; a result line that is
    not whole JSON, a JSONDecodeError's traceback."""
    from tuner.errors import LaunchError
    from tuner.layout import ClusterLayout
    from tuner.profile.plan import ProbeOptions
    from tuner.profile.run import PROGRESS, RESULT, run_probe
    from tuner.spec.file import study_from_mapping

    spec = study_from_mapping(BASE)
    lines = [f"{PROGRESS} 1 4\n", f"{PROGRESS} 2", f"[rank1]: warn {PROGRESS} x\n",
             f'{RESULT} {{"gemm": [{{"m": 1\n']  # fmt: skip
    seen: list[tuple[int, int]] = []

    def shown(done: int, total: int) -> None:
        seen.append((done, total))

    layout = ClusterLayout(tmp_path, "c")
    with pytest.raises(LaunchError, match="result line in .*node-0.log is not whole JSON"):
        run_probe(spec, _Executor(lines), layout, ProbeOptions(), on_progress=shown, poll_s=0)
    assert seen and set(seen) <= {(0, 1), (1, 4)}, seen
