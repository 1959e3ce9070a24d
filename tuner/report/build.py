"""Building the report: gather, draw, write the page (and the PNGs)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.layout import ResultsLayout
from tuner.report.data import ReportData, gather
from tuner.report.page import Section, render, sections
from tuner.space.collection import paused_collection
from tuner.spec.study import StudySpec

logger = logging.getLogger(__name__)


class BrowserMissingError(TunerError):
    """``--png`` needs Chrome or Chromium (kaleido drives it) and none is installed."""

    exit_code = 2


def default_path(spec: StudySpec, results: str) -> Path:
    """``results/<study>/report.html``."""
    return ResultsLayout(Path(results), spec.name).study_dir / "report.html"


@dataclass(frozen=True, slots=True)
class Written:
    """A report written: its file, the sections drawn, and what they were drawn from."""

    path: Path
    """The file written."""
    parts: list[Section]
    """The sections drawn, in order."""
    data: ReportData
    """The study as the report read it."""


def build_report(
    spec: StudySpec, *, out: Path | None = None, storage: str | None = None,
    results: str = "results", baseline: str | None = None, train_tokens: float | None = None,
) -> tuple[Path, list[Section]]:  # fmt: skip
    """Write the report of ``spec``'s study; the file written and the sections drawn."""
    written = write_report(spec, out=out, storage=storage, results=results, baseline=baseline,
                           train_tokens=train_tokens)  # fmt: skip
    return written.path, written.parts


def write_report(
    spec: StudySpec, *, out: Path | None = None, storage: str | None = None,
    results: str = "results", baseline: str | None = None, train_tokens: float | None = None,
) -> Written:  # fmt: skip
    """Write the report of ``spec``'s study (:func:`build_report`, with the data read)."""
    path = out or default_path(spec, results)
    with paused_collection():  # tens of thousands of objects a view, none of them garbage
        data = gather(spec, storage=storage, results=results, baseline=baseline,
                      train_tokens=train_tokens)  # fmt: skip
        data.page_dir = str(path.parent)
        parts = sections(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        _write_page(path, render(data, parts))
    except OSError as exc:  # a full disk's write error names no file: say which one
        exc.filename = exc.filename or str(path)
        raise
    logger.info("report of %s written to %s", spec.name, path)
    return Written(path, parts, data)


def _write_page(path: Path, text: str) -> None:
    """The page written whole or the file left as it was (a report written again and stopped
    by Ctrl-C or a full disk cut the last good one short in place): beside it, then renamed
    over it, through a symbolic link to its target. A FIFO or a device (``--out /dev/stdout``)
    is written as it is: it cannot be renamed over, and holds nothing to lose."""
    if path.is_fifo() or path.is_char_device() or path.is_block_device():
        path.write_text(text, encoding="utf-8")
        return
    from tuner.launch.base import write_atomic

    write_atomic(path.resolve() if path.is_symlink() else path, text)


def write_pngs(parts: list[Section], directory: Path) -> list[Path]:
    """Every figure as ``<directory>/<name>.png`` (kaleido, one browser for all of them)."""
    import importlib.util

    if importlib.util.find_spec("kaleido") is None:
        raise BrowserMissingError("--png needs kaleido: pip install 'paratune[report]'")
    named = [(n, f) for s in parts for n, f in s.figures]
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{n}.png" for n, _ in named]
    for p in paths:
        p.unlink(missing_ok=True)  # what exists afterwards was written by this call
    todo = list(range(len(named)))
    for _ in range(PNG_ATTEMPTS):
        _write_images([named[i][1] for i in todo], [paths[i] for i in todo])
        todo = [i for i in todo if not paths[i].exists()]
        if not todo:
            return paths
    missing = ", ".join(paths[i].name for i in todo)
    raise TunerError(
        f"--png: no image rendered for {missing} in {PNG_ATTEMPTS} tries (kaleido gives up on a "
        "figure after 90 s); run again on a less busy machine"
    )


PNG_ATTEMPTS = 2
"""Renders of a figure before ``--png`` gives up. kaleido (1.x) returns a figure's render error,
its 90 s per-figure timeout included, instead of raising it, and plotly's ``write_images``
drops that return: a figure that timed out on a busy machine just has no file. One more try
covers a passing stall."""


def _write_images(figures: list[object], paths: list[Path]) -> None:
    """plotly's batch export (one browser for all), with Chromium's absence said in one line."""
    import plotly.io as pio

    if not figures:
        return
    try:
        pio.write_images(figures, paths, width=1200, height=600)
    except Exception as exc:  # kaleido's and choreographer's errors share no base class
        if "chrome" in f"{type(exc).__name__} {exc}".lower():
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            detail = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:200]
            raise BrowserMissingError(
                "--png needs Chrome or Chromium installed (apt-get install chromium); "
                f"none could be started ({detail})"
            ) from exc
        raise
