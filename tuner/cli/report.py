"""``tune report``: the subcommand's options and handler (plotly loads only when it runs)."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tuner.cli.options import add_study_option, positive_number
from tuner.errors import ConfigError
from tuner.layout import folder_problem


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``report`` subcommand."""
    p = subparsers.add_parser(
        "report", help="one self-contained HTML report of a study (works offline)",
        description="Write an offline HTML report of a study: summary, leaderboard, predicted vs "
        "measured, Pareto front, memory per stage, where the time goes, search progress and "
        "payback, Optuna's views.",
    )  # fmt: skip
    add_study_option(p)
    p.add_argument("--out", type=Path, default=None, metavar="FILE.html",
                   help="where to write it (default: RESULTS/STUDY/report.html)")  # fmt: skip
    p.add_argument("--png", type=Path, default=None, metavar="DIR",
                   help="also write every figure as DIR/NAME.png (needs Chromium)")  # fmt: skip
    p.add_argument("--baseline", default=None, metavar="CONFIG",
                   help="payback baseline: a trial number or config words (tp=2,pp=2,mbs=4); "
                   "default: the model's first pick")  # fmt: skip
    p.add_argument(
        "--train-tokens",
        type=positive_number,
        default=None,
        metavar="N",
        help="tokens of the full training run; the payback is shown only with it",
    )


def run(args: argparse.Namespace) -> int:
    """Write the report (and the PNGs); print where."""
    from tuner.profile.recorded import profiled_study
    from tuner.report.build import write_pngs, write_report
    from tuner.spec.file import load_study

    if args.out is not None and args.out.is_dir():  # found once the report was built: exit 1
        raise ConfigError(f"--out {args.out} is a folder; give the report's file name "
                          f"({args.out / 'report.html'})")  # fmt: skip
    _check_paths(args.out, args.png)
    with _reader_kept(args.out):
        spec = profiled_study(load_study(args.study), args.results)
        written = write_report(spec, out=args.out, storage=args.storage,
                               results=args.results, baseline=args.baseline,
                               train_tokens=args.train_tokens)  # fmt: skip
    path, parts, trials = written.path, written.parts, written.data.stored
    from tuner.cli.tables import wrote
    from tuner.report.leaderboard import on_board, why_empty
    from tuner.report.units import plural

    sys.stdout.write(wrote("report", [path]) + "\n")
    if not any(on_board(t) for t in trials):  # an empty leaderboard: what the study lacks
        sys.stdout.write(f"tune report: {why_empty(spec, trials, results=args.results)}\n")
    if args.png is not None:
        pngs = write_pngs(parts, args.png)
        sys.stdout.write(wrote("report", [args.png], plural(len(pngs), "PNG file")) + "\n")
    return 0


def _check_paths(out: Path | None, png: Path | None) -> None:
    """``--out`` and ``--png`` refused before the report is built, naming the option: a
    symbolic link loop ("Too many levels of symbolic links", exit 1, once it was built) and a
    ``--png`` that is a file ("File exists"), an ``--out`` under a file ("File exists", exit
    1)."""
    for option, path in (("--out", out), ("--png", png)):
        try:
            if path is not None:
                path.resolve()
        except (RuntimeError, OSError):  # Python 3.11: RuntimeError; 3.13: ELOOP
            raise ConfigError(f"{option} {path}: a symbolic link loop") from None
    if png is not None and png.exists() and not png.is_dir():
        raise ConfigError(f"--png {png} is not a folder; give the folder for the PNG files")
    if out is not None and (problem := folder_problem(str(out.parent))) is not None:
        raise ConfigError(f"--out {out}: the folder {out.parent}: {problem}")


@contextmanager
def _reader_kept(out: Path | None) -> Iterator[None]:
    """A FIFO as ``--out`` (``--out >(gzip > r.gz)``, a named pipe): refused when nothing reads
    it, where writing the report waited for ever; else held open for writing while the report
    is built and written, so that the reader sees one stream, not an end after a probe."""
    if out is None or not out.is_fifo():
        yield
        return
    try:
        fd = os.open(out, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ENXIO:
            raise
        raise ConfigError(f"--out {out} is a FIFO that nothing reads (writing the report to it "
                          "would wait for ever)") from None  # fmt: skip
    try:
        yield
    finally:
        os.close(fd)
