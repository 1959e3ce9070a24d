"""Tables that fit: every table ``tune`` prints goes through :func:`render`.

The width is the terminal's; when the output is piped, ``COLUMNS`` if it is set; otherwise (a
file) there is no width and tables come out plain, one line per row, never wrapped. Columns are
given in priority order: those that do not fit at their full width are left out and named in a
footer (``--columns`` picks others), so no cell is ever cut to an ellipsis. Only a column marked
``wrap`` (free text, such as a failure's reason) may fold onto more lines.
"""

from __future__ import annotations

import codecs
import dataclasses
import errno
import io
import os
import shutil
import sys
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field

from rich import box
from rich import console as rich_console
from rich.table import Table
from rich.text import Text

from tuner.errors import ConfigError

MIN_WIDTH = 80
"""Tables are laid out for at least this many columns, even on a narrower terminal."""
WRAP_MIN = 16
"""The narrowest a folding column is made before it is left out instead."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Column:
    """One column: its name for ``--columns``, its header (with the unit) and layout."""

    name: str
    """The name ``--columns`` takes (the JSON / CSV field where there is one)."""
    header: str
    """What the table shows on top, unit included (``step s``)."""
    right: bool = True
    """Right-aligned (numbers); text columns are left-aligned."""
    wrap: int = 0
    """Free text that may fold onto at most this many lines rather than be left out (0: never
    folds)."""
    meaning: str = ""
    """What the header means, for ``tune <cmd> --help``."""
    minor: bool = False
    """A secondary figure: left out, least important first, rather than fold the text of a
    folding column."""
    number: bool = False
    """An identifier (a trial's or a stage's number), not a figure: kept when it is 0 in every
    row (trial 0 alone, the one stage of pp = 1), which says which one, not how much."""
    path: bool = False
    """File paths: a folding column may break one inside a name, after a ``/`` where it can
    (a long path, one word, otherwise kept the figures beside it out of the table)."""


CONFIG = Column(
    name="config", header="config", right=False, wrap=2,
    meaning="the knobs that differ between rows (see 'config spelling'; at most two lines)",
)  # fmt: skip
"""The config column of every table: the compact spelling (:mod:`tuner.config.spelling`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Grid:
    """A table to print: columns in priority order and rows of finished cell texts."""

    title: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[str, ...], ...]
    constant: str = ""
    """Knobs equal in every row, named once above the table."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Lines printed under the table."""
    choosable: bool = True
    """The command takes ``--columns`` for this table (the footer then says so)."""


def _size(text: str) -> int | None:
    """``COLUMNS`` or ``LINES`` as a number, None unless ASCII digits ("²" is a digit to
    ``str.isdigit``, which Rich asks too, and no number to ``int``: a ValueError's traceback)."""
    return int(text) if text.isascii() and text.isdigit() else None


OUTPUT_ERRORS = "tuner-escape"
"""The encoding error handler of stdout and stderr (:func:`prepare_output`)."""


_SURROGATEESCAPE = codecs.lookup_error("surrogateescape")


def _escape(exc: UnicodeError) -> tuple[str | bytes, int]:
    """Python's ``surrogateescape`` where it applies (the bytes of a file name that is no
    text in this locale, written back as they were), ``backslashreplace`` for the rest."""
    try:
        return _SURROGATEESCAPE(exc)
    except UnicodeError:
        return codecs.backslashreplace_errors(exc)


codecs.register_error(OUTPUT_ERRORS, _escape)


def prepare_output() -> None:
    """Before anything is printed: :func:`drop_garbage_sizes`, and a character stdout or stderr
    cannot encode (``PYTHONIOENCODING=ascii``, a Latin-1 login node, and the ``±`` of every
    dry run) written as ``\\xb1`` where it was a UnicodeEncodeError's traceback. Python's own
    ``surrogateescape`` (its choice in the C or POSIX locale without UTF-8 mode: ASCII) fails
    on such a character too; it is kept for what it can write."""
    drop_garbage_sizes()
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors in ("strict", "surrogateescape"):
            stream.reconfigure(errors=OUTPUT_ERRORS)


def drop_garbage_sizes(environ: MutableMapping[str, str] = os.environ) -> None:
    """Unset a ``COLUMNS`` or ``LINES`` that is not a number, as if the terminal had not set
    it: Rich reads both from the environment itself, for every console and progress bar."""
    for name in ("COLUMNS", "LINES"):
        if name in environ and _size(environ[name]) is None:
            del environ[name]


def output_width() -> int | None:
    """The width to fit: the terminal's, else ``COLUMNS`` (piped), else None (plain)."""
    given = _size(os.environ.get("COLUMNS", ""))
    if sys.stdout.isatty():
        return max(shutil.get_terminal_size().columns if given is None else given, MIN_WIDTH)
    return max(given, MIN_WIDTH) if given else None


class Console(rich_console.Console):
    """Every console ``tune`` prints through (tables, progress bars): a reader that went away
    (``| head -1``) is a BrokenPipeError for :func:`tuner.cli.main.main` to answer, as every
    other write's is. Rich's own answer ended the process with status 1, wherever it was."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is written to it
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def console() -> Console:
    """The console every command prints through, as wide as :func:`output_width` (a plain
    file gets lines as long as they are)."""
    width = output_width()
    return Console(highlight=False, width=width or 10_000, soft_wrap=width is None)


def parse_columns(text: str | None, form: str) -> list[str] | None:
    """``--columns a,b,c`` -> ``["a", "b", "c"]`` (None: the default choice), refused with a
    ``--format`` (``form``) other than the table, which writes every field: it was ignored
    there, a column no table has included (``--format csv --columns nope``)."""
    if text is None:
        return None
    if form not in ("table", "text"):
        raise ConfigError(f"--columns picks the table's columns; --format {form} writes every "
                          "field (give one of the two)")  # fmt: skip
    from tuner.cli.options import comma_list

    try:
        return comma_list(text)
    except ValueError as exc:
        raise ConfigError(f"--columns: {exc}") from None


def check_columns(names: Sequence[str], known: Sequence[str]) -> None:
    """A one-line error naming the first of ``names`` (``--columns``) not in ``known``."""
    for name in names:
        if name not in known:
            raise ConfigError(f"--columns: no column {name!r} here (columns: {', '.join(known)})")


def choose(grid: Grid, names: Sequence[str] | None) -> Grid:
    """The grid with only the ``--columns`` asked for, in that order."""
    if names is None:
        return grid
    known = {c.name: i for i, c in enumerate(grid.columns)}
    check_columns(names, list(known))
    index = [known[n] for n in names]
    return Grid(
        title=grid.title, columns=tuple(grid.columns[i] for i in index),
        rows=tuple(tuple(row[i] for i in index) for row in grid.rows), constant=grid.constant,
        notes=grid.notes, choosable=grid.choosable,
    )  # fmt: skip


def _natural(grid: Grid, i: int) -> int:
    heads = grid.columns[i].header.split("\n")
    return max([*(len(h) for h in heads), *(len(row[i]) for row in grid.rows)])


GAP = 2
"""Spaces between two columns (a rule under the header, no vertical lines: the width goes to
the numbers)."""


def _least(grid: Grid, i: int) -> int:
    """The narrowest a column is shown: its natural width, or for a folding one the width that
    holds each cell in ``wrap`` lines, never under its longest word or :data:`WRAP_MIN`."""
    natural = _natural(grid, i)
    column = grid.columns[i]
    if not column.wrap:
        return natural
    cut = (lambda text: text.replace("/", "/ ").split()) if column.path else str.split
    words = [len(w) for row in grid.rows for w in cut(row[i])]
    words += [len(h) for h in column.header.split("\n")]
    width = min(natural, max(WRAP_MIN, -(-natural // column.wrap), *words))
    if column.path:  # one long word: the terminal folds it inside, at any character
        return width
    return max(width, min(natural, fold_width([row[i] for row in grid.rows], column.wrap)))


def fold_width(texts: Sequence[str], lines: int) -> int:
    """The narrowest width at which each of ``texts`` folds at its spaces onto at most
    ``lines`` lines (a line breaks only between words: half a text's length may take three)."""
    width = max((len(w) for text in texts for w in text.split()), default=1)
    while any(_lines(text, width) > lines for text in texts):
        width += 1
    return width


def _lines(text: str, width: int) -> int:
    """The lines ``text`` takes folded at its spaces into ``width`` columns, a line filled
    with as many words as it holds (as the terminal table folds it; no word is wider)."""
    lines, used = 0, width
    for word in text.split():
        if used + 1 + len(word) <= width:
            used += 1 + len(word)
        else:
            lines, used = lines + 1, len(word)
    return max(lines, 1)


def fit(grid: Grid, width: int) -> tuple[list[int], list[int | None], list[str]]:
    """Which columns a table of ``width`` holds: their indexes, each folding column's width
    (None: its natural width) and the names of those left out, in priority order.

    Every column is first taken at its narrowest (a folding one may be narrower than its text),
    in priority order while they fit; the width left over then widens the folding ones. When a
    folding column is still folded, the minor columns ranked below every folding column give
    way to it, least important first."""
    kept: list[int] = []
    used = 0
    for i in range(len(grid.columns)):
        cost = _least(grid, i) + (GAP if kept else 0)
        if used + cost <= width:
            kept.append(i)
            used += cost
    while True:
        widths = _grow(grid, kept, width - used)
        folding = [i for i in kept if grid.columns[i].wrap]
        tail = [i for i in kept if folding and i > folding[-1] and grid.columns[i].minor]
        if not tail or all(w is None for i, w in zip(kept, widths, strict=True) if i in folding):
            break
        kept.remove(tail[-1])
        used -= _least(grid, tail[-1]) + GAP
    dropped = [c.name for i, c in enumerate(grid.columns) if i not in kept]
    return kept, widths, dropped


def _grow(grid: Grid, kept: list[int], spare: int) -> list[int | None]:
    """Each kept column's width (None: natural), the ``spare`` width going to the folding
    columns in priority order."""
    widths: list[int | None] = []
    for i in kept:
        least, natural = _least(grid, i), _natural(grid, i)
        grow = min(natural - least, spare)
        spare -= grow
        widths.append(None if least + grow == natural else least + grow)
    return widths


def without_zeros(grid: Grid) -> Grid:
    """The grid without the figure columns that are 0 in every row, named in a note instead."""
    zero = [i for i, c in enumerate(grid.columns) if c.right and not c.number and grid.rows
            and all(row[i] == "0" for row in grid.rows)]  # fmt: skip
    if not zero:
        return grid
    keep = [i for i in range(len(grid.columns)) if i not in zero]
    note = f"0 in every row: {', '.join(grid.columns[i].name for i in zero)}"
    return Grid(
        title=grid.title, columns=tuple(grid.columns[i] for i in keep),
        rows=tuple(tuple(row[i] for i in keep) for row in grid.rows), constant=grid.constant,
        notes=(note, *grid.notes), choosable=grid.choosable,
    )  # fmt: skip


def visible(text: str) -> str:
    """``text`` with each character a terminal acts on instead of showing (ESC and the other
    control characters, a carriage return, a bidirectional override) written as its Python
    escape (``\\x1b``). A failed trial's reason is the tail of a program's output: its colour
    codes recoloured the terminal, and a ``\\r`` or an override moved figures out of their
    columns; the one line of an error became two at a newline."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _visible(grid: Grid) -> Grid:
    """``grid`` with every text it prints made :func:`visible` (headers are tuner's own)."""
    return dataclasses.replace(
        grid, title=visible(grid.title), constant=visible(grid.constant),
        rows=tuple(tuple(visible(cell) for cell in row) for row in grid.rows),
        notes=tuple(visible(note) for note in grid.notes),
    )  # fmt: skip


def render(out: rich_console.Console, grid: Grid, names: Sequence[str] | None = None) -> None:
    """Print ``grid``: fitted to the output's width, or plain when there is none (without the
    columns that are 0 in every row, unless ``names`` asks for them)."""
    grid = _visible(grid)
    grid = choose(grid, names) if names is not None else without_zeros(grid)
    if grid.title:  # a line of its own: a table's title would wrap to the table's width
        out.print(grid.title, markup=False)
    if grid.constant:
        out.print(f"in every row: {grid.constant}", markup=False)
    width = output_width()
    if width is None:
        _plain(out, grid)
    else:
        _boxed(out, grid, width, explicit=names is not None)
    for note in grid.notes:
        out.print(note)


def _boxed(out: rich_console.Console, grid: Grid, width: int, explicit: bool) -> None:
    table, footer = fitted(grid, width, explicit)
    out.print(table)
    if footer:
        out.print(footer)


def fitted(grid: Grid, width: int, explicit: bool = False) -> tuple[Table, str]:
    """``grid``'s rows as a table ``width`` columns wide (:func:`fit`), and the line naming the
    columns left out ("" when none was): what :func:`render` prints, for a display that shows
    it itself (``tune run``'s live table)."""
    kept, widths, dropped = fit(grid, width)
    table = Table(
        box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, GAP - 1, 0, 0),
    )  # fmt: skip
    for i, fold in zip(kept, widths, strict=True):
        column = grid.columns[i]
        table.add_column(
            column.header, justify="right" if column.right else "left",
            no_wrap=fold is None, overflow="fold", max_width=fold, min_width=_natural(grid, i)
            if fold is None else None,
        )  # fmt: skip
    for row in grid.rows:
        table.add_row(*(Text(row[i]) for i in kept))
    if not dropped:
        return table, ""
    how = "; --columns chooses" if grid.choosable and not explicit else ""
    return table, f"left out to fit {width} columns: {', '.join(dropped)}{how}"


def _plain(out: rich_console.Console, grid: Grid) -> None:
    widths = [_natural(grid, i) for i in range(len(grid.columns))]
    depth = max((c.header.count("\n") + 1 for c in grid.columns), default=1)
    heads = [(["", *([""] * depth)] + c.header.split("\n"))[-depth:] for c in grid.columns]
    lines = [[h[k] for h in heads] for k in range(depth)] + [list(r) for r in grid.rows]
    text = [
        "  ".join(
            cell.rjust(w) if column.right else cell.ljust(w)
            for cell, w, column in zip(cells, widths, grid.columns, strict=True)
        ).rstrip()
        for cells in lines
    ]
    # one print of the joined lines: the console fits each line as it would a print of its own,
    # and a print per line was most of a long table's time
    out.print("\n".join(text), markup=False)


def legend(columns: Sequence[Column]) -> str:
    """The columns' headers and meanings, one per line, for a command's ``--help`` (the
    meanings in one column, past the longest header)."""
    heads = [c.header.replace("\n", " ") for c in columns]
    wide = max([16, *(len(h) + 1 for h in heads)])
    return "\n".join(
        f"  {c.name:<22} {h:<{wide}} {c.meaning}" for c, h in zip(columns, heads, strict=True)
    )


def show(out: rich_console.Console, thing: Grid | str) -> None:
    """Print a grid (fitted) or a line."""
    if isinstance(thing, Grid):
        render(out, thing)
    else:
        out.print(thing)
