"""``tune report`` through the real CLI over the stand-in study: the page, PNGs, bad input."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.report.conftest import StudyRun
from tuner.cli.main import main
from tuner.report.leaderboard import leaderboard

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def tune(study_run: StudyRun, *args: str) -> int:
    return main(["report", "--study", str(study_run.study_file), "--results",
                 str(study_run.results), *args])  # fmt: skip


def test_report_writes_the_default_file(
    study_run: StudyRun, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    assert tune(study_run) == 0
    path = study_run.results / study_run.spec.name / "report.html"
    assert capsys.readouterr().out == f"tune report: wrote {path}\n"
    # tune best says the files it writes in the same form (on stderr: stdout is the export)
    assert main(["best", "--study", str(study_run.study_file), "--results",
                 str(study_run.results), "--emit", "args"]) == 0  # fmt: skip
    said = capsys.readouterr().err
    assert said.startswith(f"tune best: wrote {path.parent / 'exports'}"), said
    # the model's first pick (trial 0) ran out of memory: no baseline to pay back against
    assert "Payback needs a measured best config and a measured baseline." in path.read_text()
    board = leaderboard(study_run.spec, results=str(study_run.results))
    slowest = str(int(board.iloc[-1]["trial"]))
    assert tune(study_run, "--baseline", slowest, "--train-tokens", "2e9") == 0
    text = path.read_text()
    assert (
        "Payback needs" not in text and "2e+09" in text and f"trial {slowest} (--baseline)" in text
    )


def test_png_writes_every_figure(
    study_run: StudyRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    from tests.report.browser import chromium_path, missing

    if chromium_path() is None:
        missing("no system Chromium for kaleido")
    out = tmp_path / "figures"
    assert tune(study_run, "--out", str(tmp_path / "r.html"), "--png", str(out)) == 0
    names = sorted(p.name for p in out.iterdir())
    assert {"step_time.png", "peak_memory.png", "stage_memory.png", "tp_pp_heatmap.png",
            "optuna_history.png"} <= set(names)  # fmt: skip
    assert all((out / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


def test_png_renders_again_a_figure_kaleido_dropped(
    study_run: StudyRun, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """kaleido returns a figure's render error (its 90 s timeout on a busy machine) instead of
    raising it and plotly drops it: the figure just has no file. Played here by a real export
    that leaves out the first figure of the batch (once, then on every call)."""
    import plotly.io as pio

    from tests.report.browser import chromium_path, missing

    if chromium_path() is None:
        missing("no system Chromium for kaleido")
    real, calls = pio.write_images, []

    def dropping(figures: list[object], paths: list[Path], **kw: object) -> None:
        calls.append([p.name for p in paths])
        if len(calls) == 1 or always:
            real(figures[1:], paths[1:], **kw)
        else:
            real(figures, paths, **kw)

    monkeypatch.setattr(pio, "write_images", dropping)
    always, out = False, tmp_path / "figures"
    assert tune(study_run, "--out", str(tmp_path / "r.html"), "--png", str(out)) == 0
    assert calls[1] == [calls[0][0]] and "step_time.png" in calls[1]  # only the dropped one
    assert set(calls[0]) == {p.name for p in out.iterdir()}
    capsys.readouterr()
    always, calls = True, []
    assert tune(study_run, "--out", str(tmp_path / "r.html"), "--png", str(out)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no image rendered for step_time.png in 2 tries" in err
    assert not (out / "step_time.png").exists()  # the first run's file is not taken for this one


def test_png_without_a_browser_is_one_line_and_exit_2(
    study_run: StudyRun, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chromium"))  # kaleido's override
    assert tune(study_run, "--out", str(tmp_path / "r.html"), "--png", str(tmp_path / "p")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs Chrome or Chromium" in err


def test_bad_baseline_is_exit_2(study_run: StudyRun, capsys: pytest.CaptureFixture[str]) -> None:
    assert tune(study_run, "--baseline", "9999", "--out", "/dev/null") == 2
    assert "--baseline '9999' matches no measured trial" in capsys.readouterr().err


def test_an_unwritable_report_names_its_file(
    study_run: StudyRun, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full disk's write error carries no file name; the one line says which file failed."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    assert tune(study_run, "--out", "/dev/full") == 1
    err = capsys.readouterr().err
    assert err == "tune: error: /dev/full: No space left on device\n", err


def test_a_folder_as_out_is_refused_before_the_report_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was found only when the built page was written: exit 1, "Is a directory"."""
    assert main(["report", "--study", "no-such-study", "--out", str(tmp_path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"tune: error: --out {tmp_path} is a folder; give the report's file name "
                     f"({tmp_path / 'report.html'})"]  # fmt: skip


def _loop(tmp_path: Path) -> Path:
    (tmp_path / "loop").symlink_to("other")
    (tmp_path / "other").symlink_to("loop")
    return tmp_path / "loop"


@pytest.mark.parametrize(("option", "make", "words"), [
    ("--out", _loop, "a symbolic link loop"),
    ("--out", lambda p: _loop(p) / "r.html", "a symbolic link loop"),
    ("--png", _loop, "a symbolic link loop"),
    ("--png", lambda p: Path(shutil.copy(__file__, p)),
     "is not a folder; give the folder for the PNG files"),
])  # fmt: skip
def test_an_out_or_png_path_that_cannot_be_written_is_refused_before_the_build(
    option: str, make: Callable[[Path], Path], words: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Found once the page was built: exit 1, "Too many levels of symbolic links" or "File
    exists" (a file as --png)."""
    path = make(tmp_path)
    assert main(["report", "--study", "no-such-study", option, str(path)]) == 2
    sep = " " if words.startswith("is") else ": "
    assert capsys.readouterr().err == f"tune: error: {option} {path}{sep}{words}\n"


@pytest.mark.timeout(60)  # writing to it waited for ever
def test_a_fifo_nothing_reads_as_out_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.mkfifo(fifo := tmp_path / "r.html")
    assert main(["report", "--study", "no-such-study", "--out", str(fifo)]) == 2
    assert capsys.readouterr().err == (
        f"tune: error: --out {fifo} is a FIFO that nothing reads (writing the report to it "
        "would wait for ever)\n"
    )


@pytest.mark.timeout(120)
def test_a_fifo_read_as_out_gets_the_whole_page(study_run: StudyRun, tmp_path: Path) -> None:
    """The check that something reads it must not end the reader's stream before the page."""
    os.mkfifo(fifo := tmp_path / "r.html")
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    time.sleep(0.2)  # the reader is waiting in open()
    assert tune(study_run, "--out", str(fifo)) == 0
    reader.join(60)
    assert tune(study_run, "--out", str(tmp_path / "plain.html")) == 0
    assert got == [(tmp_path / "plain.html").read_bytes()]


def test_a_report_stopped_mid_write_leaves_the_last_one_whole(
    study_run: StudyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A full disk (or Ctrl-C) while the page was written again cut the last good report
    short in place; a link given as --out stays a link to the file it names."""
    import errno

    (link := tmp_path / "link.html").symlink_to("r.html")
    assert tune(study_run, "--out", str(link)) == 0
    before = (tmp_path / "r.html").read_bytes()
    real = Path.write_text

    def half_then_full(self: Path, data: str, *args: object, **kwargs: object) -> int:
        real(self, data[: len(data) // 2], encoding="utf-8")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full)
    assert tune(study_run, "--out", str(link)) == 1
    monkeypatch.undo()
    assert capsys.readouterr().err.endswith("No space left on device\n")
    assert (tmp_path / "r.html").read_bytes() == before and link.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["link.html", "r.html"]  # no half-written copy
