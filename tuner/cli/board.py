"""``tune leaderboard``: the leaderboard's rows as a table, each config in the compact spelling,
columns in priority order (``--columns`` takes any of the leaderboard's column names too), or as
CSV, JSON or Markdown (pandas' writers, imported only for those)."""

from __future__ import annotations

import sys
from argparse import Namespace
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tuner.cli import render
from tuner.config.spelling import split_constant
from tuner.report import units

if TYPE_CHECKING:
    from tuner.report.leaderboard import Board

BOARD_COLUMNS = (
    render.Column(
        name="rank", header="rank", meaning="place on the board, fastest first", number=True
    ),
    render.Column(
        name="trial", header="trial", meaning="the trial's number in the study", number=True
    ),
    render.Column(
        name="outcome",
        header="outcome",
        right=False,
        meaning="ok, oom, timeout, ... (--all shows the failed ones)",
    ),
    render.CONFIG,
    render.Column(
        name="measured_step_s", header="step s", meaning="measured time of one optimizer step"
    ),
    render.Column(
        name="tokens_per_s_per_gpu",
        header="tok/s/GPU",
        meaning="measured tokens per second per GPU",
    ),
    render.Column(
        name="mfu",
        header="MFU %",
        meaning="model FLOPs utilisation: model FLOP/s over the GPUs' peak",
    ),
    render.Column(
        name="measured_peak_gib",
        header="peak GiB",
        meaning="measured peak allocated memory of the busiest GPU",
    ),
    render.Column(
        name="predicted_step_s",
        header="pred step s",
        meaning="the time model's step time for this config",
    ),
    render.Column(
        name="predicted_peak_gib",
        header="pred peak GiB",
        meaning="the memory model's peak device memory",
    ),
    render.Column(
        name="tflops_per_gpu",
        header="TFLOP/s/GPU",
        minor=True,
        meaning="measured model TFLOP/s per GPU",
    ),
    render.Column(
        name="scale",
        header="scale",
        right=False,
        meaning="full: measured at full scale; proxy: extrapolated from a run at a smaller DP "
        "size (marked ~ in the step column; proxy_dp, proxy_nodes, proxy_step_s)",
    ),
    render.Column(
        name="measured_microbatches",
        header="measured m",
        meaning="micro-batches per step the trial ran, fewer than the config's: too slow for "
        "search.trial_timeout_min, its step extrapolated (marked ~; proxy_step_s: the step "
        "measured)",
    ),
    render.Column(name="nodes", header="nodes", minor=True, meaning="nodes the trial ran on"),
    render.Column(
        name="duration_s",
        header="took s",
        minor=True,
        meaning="wall time of the trial, launch to exit",
    ),
    render.Column(
        name="reason",
        header="reason",
        right=False,
        wrap=6,
        meaning="why a trial failed or was pruned",
    ),
)
"""The table's columns, most important first; the rest of the leaderboard's are there for
``--columns``."""


def _formatter(name: str) -> Callable[[Any], str]:
    """One number format per quantity, chosen by the leaderboard column's name."""
    if name in ("mfu", "predicted_mfu"):
        return units.percent
    if name.startswith("tokens_per_s"):
        return units.rate
    if name == "tflops_per_gpu":
        return units.tflops
    if name.endswith("_s"):
        return units.seconds
    if name.endswith("_gib"):
        return units.gib
    return str


def _cell(name: str, value: Any, form: Callable[[Any], str] | None = None) -> str:
    """``value`` in column ``name``'s format (``form``: :func:`_formatter`'s, found already)."""
    if value is None or value != value:  # None or NaN: nothing measured
        return ""
    if isinstance(value, float) and value.is_integer() and not name.endswith(("_s", "_gib")):
        value = int(value)  # a count stored as float (pandas' beside a NaN, once)
    return (form or _formatter(name))(value)


def board_grid(
    title: str, board: Board, include_all: bool, names: Sequence[str] | None = None,
    framework: str | None = None,
) -> render.Grid:  # fmt: skip
    """The leaderboard as a :class:`render.Grid`: the default columns (outcome only with
    ``--all``, empty ones left out) or, with ``names``, those asked for."""
    from tuner.report.leaderboard import COLUMNS
    from tuner.space.collection import paused_collection

    known = [c.name for c in BOARD_COLUMNS]
    extra = tuple(render.Column(name=n, header=n, right=n not in ("recompute", "dispatcher"))
                  for n in COLUMNS if n not in known)  # fmt: skip
    present = [c for c in board.configs if c is not None]
    constant, spelled = split_constant(present, framework)
    spelling = iter(spelled)
    by_config = [next(spelling) if c is not None else "" for c in board.configs]
    order: tuple[render.Column, ...] = BOARD_COLUMNS
    if include_all:  # failures shown: why they failed comes before the secondary figures
        order = tuple(c for c in order if c.name != "reason")
        at = [c.name for c in order].index("predicted_peak_gib") + 1
        order = (*order[:at], BOARD_COLUMNS[-1], *order[at:])
    filled = {name for name in COLUMNS if any(_given(row[name]) for row in board.rows)}
    columns = []
    for column in order + extra:
        if names is not None:
            columns.append(column)
        elif column in extra:
            continue
        elif column.name in ("rank", "config") or (
            column.name in filled and (column.name != "outcome" or include_all)
        ):
            columns.append(column)
    rows = []
    # each shown column's name (None: not a leaderboard column) and format, found once
    shown = [(c.name if c.name in COLUMNS else None, c.name, _formatter(c.name)) for c in columns]
    with paused_collection():  # thousands of rows of cells, none of them garbage
        for rank, (config, row) in enumerate(zip(by_config, board.rows, strict=True), 1):
            cells = {"rank": str(rank), "config": config}
            if row["scale"] == "proxy" or row["measured_microbatches"]:  # extrapolated
                cells["measured_step_s"] = "~" + _cell("measured_step_s", row["measured_step_s"])
            rows.append(tuple(
                cells.get(name) or ("" if key is None else _cell(name, row[key], form))
                for key, name, form in shown
            ))  # fmt: skip
    return render.Grid(title=title, columns=tuple(columns), rows=tuple(rows), constant=constant)


def _given(value: Any) -> bool:
    """Whether a cell holds a value (not None, not NaN): a column with none is left out."""
    return value is not None and value == value


def print_board(out: Console, title: str, board: Board, include_all: bool,
                names: Sequence[str] | None, framework: str | None = None) -> None:  # fmt: skip
    """Print the leaderboard table (``names``: ``--columns``; ``framework``: the study's)."""
    grid = board_grid(title, board, include_all, names, framework)
    render.render(out, grid, names)


def _markdown_cell(value: object) -> object:
    return render.visible(value).replace("|", "\\|") if isinstance(value, str) else value


def markdown(board: Board) -> str:
    """The rows as a Markdown table, each text cell made :func:`render.visible` and its ``|``
    escaped: a failed trial's reason quotes its log (Megatron's lines are ``|``-separated), and
    such a cell split into columns of its own, a newline in it into a row of its own."""
    frame = board.frame()
    for column in frame.columns:
        frame[column] = frame[column].map(_markdown_cell)
    return frame.to_markdown(index=False, floatfmt=".4g")


def run(out: Callable[[], Console], args: Namespace) -> int:
    """``tune leaderboard``: the table on ``out()``, or the rows in ``--format``'s form."""
    from tuner.profile.recorded import profiled_study
    from tuner.report.leaderboard import board_rows, board_trials, why_empty
    from tuner.spec.file import load_study

    columns = render.parse_columns(args.columns, args.format)
    spec = profiled_study(load_study(args.study), args.results)
    trials = board_trials(spec, args.storage, args.results)
    board = board_rows(spec, trials, include_all=args.all)
    if args.format == "csv":
        sys.stdout.write(board.frame().to_csv(index=False))
    elif args.format == "json":
        sys.stdout.write(board.frame().to_json(orient="records", indent=2) + "\n")
    elif args.format == "markdown":
        sys.stdout.write(markdown(board) + "\n")
    elif not board.rows:  # says why and what to do (an empty table was all it printed once)
        why = why_empty(spec, trials, args.all, args.results)
        out().print(f"leaderboard of {spec.name}: {why}", markup=False)
    else:
        title = f"leaderboard of {spec.name} ({units.plural(len(board.rows), 'config')})"
        print_board(out(), title, board, args.all, columns, spec.framework)
    return 0
