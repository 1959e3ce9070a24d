"""The abbreviations a command's output uses, for ``tune <cmd> --help`` (one place: the
columns' own definitions and the config spelling's glossary)."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.cli.render import Column, legend
from tuner.config.spelling import glossary

UNITS = ("numbers: s seconds, GiB 2^30 bytes, % percent, tok/s tokens per second, TFLOP/s 10^12 "
         "FLOP per second")  # fmt: skip


def epilog(columns: Sequence[Column] = (), extra: str = "", choose: bool = True) -> str:
    """A command's ``--help`` epilog: the config spelling, its table's columns (``choose``:
    the command takes ``--columns``) and units."""
    parts = ["config spelling (knobs equal in every row are named once above a table):",
             glossary()]  # fmt: skip
    if columns:
        how = "--columns NAME,...; " if choose else ""
        parts += [f"columns ({how}those that do not fit are named under the table):",
                  legend(columns)]  # fmt: skip
    parts.append(UNITS)
    if extra:
        parts.append(extra)
    return "\n".join(parts)
