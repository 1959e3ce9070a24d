"""``tune leaderboard`` as a table: the leaderboard DataFrame's rows, each config in the compact
spelling, columns in priority order (``--columns`` takes any of the DataFrame's names too)."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console

from tuner.cli import render, units
from tuner.config.parallel import ParallelConfig
from tuner.config.spelling import split_constant
from tuner.spec.study import StudySpec

BOARD_COLUMNS = (
    render.Column(name="rank", header="rank", meaning="place on the board, fastest first"),
    render.Column(name="trial", header="trial", meaning="the trial's number in the study"),
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
"""The table's columns, most important first; the rest of the DataFrame's are there for
``--columns``."""


def _formatter(name: str) -> Callable[[Any], str]:
    """One number format per quantity, chosen by the DataFrame column's name."""
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
        value = int(value)  # a count pandas stored as float beside a NaN
    return (form or _formatter(name))(value)


def board_grid(
    title: str, board: Any, configs: Sequence[ParallelConfig | None], include_all: bool,
    names: Sequence[str] | None = None, framework: str | None = None,
) -> render.Grid:  # fmt: skip
    """The leaderboard as a :class:`render.Grid`: the default columns (outcome only with
    ``--all``, empty ones left out) or, with ``names``, those asked for."""
    known = [c.name for c in BOARD_COLUMNS]
    extra = tuple(render.Column(name=n, header=n, right=n not in ("recompute", "dispatcher"))
                  for n in board.columns if n not in known)  # fmt: skip
    present = [c for c in configs if c is not None]
    constant, spelled = split_constant(present, framework)
    spelling = iter(spelled)
    by_config = [next(spelling) if c is not None else "" for c in configs]
    columns = []
    order: tuple[render.Column, ...] = BOARD_COLUMNS
    if include_all:  # failures shown: why they failed comes before the secondary figures
        order = tuple(c for c in order if c.name != "reason")
        at = [c.name for c in order].index("predicted_peak_gib") + 1
        order = (*order[:at], BOARD_COLUMNS[-1], *order[at:])
    for column in order + extra:
        if names is not None:
            columns.append(column)
        elif column in extra:
            continue
        elif column.name in ("rank", "config") or (
            column.name in board.columns and board[column.name].notna().any()
            and (column.name != "outcome" or include_all)
        ):  # fmt: skip
            columns.append(column)
    from tuner.space.collection import paused_collection

    rows = []
    position = {name: i for i, name in enumerate(board.columns)}
    # each shown column's place in the frame's rows and its format, found once, not per cell
    shown = [(c.name, position.get(c.name), _formatter(c.name)) for c in columns]
    scale, step = position.get("scale"), position.get("measured_step_s")
    # the frame's values as ``iterrows`` gives them (its rows are built from ``.values``), read
    # by position: a Series per row was most of the table's time at thousands of rows
    with paused_collection():  # thousands of rows of cells, none of them garbage
        for rank, (config, values) in enumerate(zip(by_config, board.values, strict=True), 1):
            cells = {"rank": str(rank), "config": config}
            if scale is not None and values[scale] == "proxy":  # an extrapolated figure
                measured = values[step] if step is not None else None
                cells["measured_step_s"] = "~" + _cell("measured_step_s", measured)
            rows.append(tuple(
                cells.get(name) or ("" if i is None else _cell(name, values[i], form))
                for name, i, form in shown
            ))  # fmt: skip
    return render.Grid(title=title, columns=tuple(columns), rows=tuple(rows), constant=constant)


def print_board(out: Console, title: str, board: Any, configs: Sequence[ParallelConfig | None],
                include_all: bool, names: Sequence[str] | None,
                framework: str | None = None) -> None:  # fmt: skip
    """Print the leaderboard table (``names``: ``--columns``; ``framework``: the study's)."""
    grid = board_grid(title, board, configs, include_all, names, framework)
    render.render(out, grid, names)


def show_board(out: Console, spec: StudySpec, board: Any, args: Namespace) -> None:
    """``tune leaderboard``'s table; a board with no row says why and what to do instead (an
    empty table with a header was all a study with no measured trial printed)."""
    from tuner.report.leaderboard import stored_trials, why_empty

    if board.empty:
        trials = stored_trials(spec, args.storage, args.results)
        out.print(f"leaderboard of {spec.name}: {why_empty(spec, trials, args.all, args.results)}",
                  markup=False)  # fmt: skip
        return
    title = f"leaderboard of {spec.name} ({units.plural(len(board), 'config')})"
    configs = stored_configs(spec, board, args.storage, args.results)
    columns = render.parse_columns(args.columns)
    print_board(out, title, board, configs, args.all, columns, spec.framework)


def stored_configs(
    spec: Any, board: Any, storage: str | None, results: str
) -> list[ParallelConfig | None]:
    """Each leaderboard row's config, read back from its stored trial (None: it has none)."""
    from tuner.report.leaderboard import stored_trials

    if board.empty:
        return []
    trials = {t.number: t for t in stored_trials(spec, storage, results)}
    out: list[ParallelConfig | None] = []
    for number in board["trial"]:
        data = trials[int(number)].user_attrs.get("config")
        out.append(ParallelConfig(**data) if data else None)
    return out
