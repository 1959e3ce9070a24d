"""The abbreviations a command's output uses, for ``tune <cmd> --help`` (one place: the
columns' own definitions and the config spelling's glossary)."""

from __future__ import annotations

import argparse
import re
import textwrap
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


class EpilogFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter with the epilog's lines kept as written (their columns line up) but
    each folded to the terminal's width: a legend line of 120 characters ran past an 80-column
    terminal, which broke it mid-word at the left margin. A folded line continues under its
    description column (the text after the last gap of two spaces), else two past its indent;
    a line that begins in the description column (a long name's meaning, on a line of its own)
    continues under itself."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for line in text.splitlines():
            gaps = list(re.finditer(r"\S  +(?=\S)", line))
            depth = len(line) - len(line.lstrip())
            lead = depth if depth > 2 else depth + 2  # no column to hang under
            hang = gaps[-1].end() if gaps and gaps[-1].end() < width * 2 // 3 else lead
            out.append(textwrap.fill(line, width, initial_indent=indent,
                                     subsequent_indent=indent + " " * hang,
                                     break_on_hyphens=False) or indent)  # fmt: skip
        return "\n".join(out)
