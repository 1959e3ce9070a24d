"""The help texts beyond each option's line: the abbreviations a command's output uses, for
``tune <cmd> --help`` (one place: the columns' own definitions and the config spelling's
glossary), and what ``tune --help`` says after the commands (first steps, where each framework
and each output is explained, the FLOPs convention)."""

from __future__ import annotations

import argparse
import re
import textwrap
from collections.abc import Sequence

from tuner.cli.render import Column, legend
from tuner.config.spelling import glossary
from tuner.spec.frameworks import Framework

FLOPS_HELP = (
    "FLOPs convention: 2 per multiply-add, backward = 2x forward, attention scores counted in "
    "full, LM head included (Korthikanti's 72BsLh^2(1 + s/6h + V/12Lh) for GPT); MFU counts no "
    "recomputation, HFU does."
)

FRAMEWORK_PAGES: dict[str, tuple[Framework, ...]] = {
    "docs/guides/frameworks.md": ("megatron", "deepspeed", "megatron-deepspeed"),
    "docs/megatron-bridge.md": ("megatron-bridge",),
    "docs/torchtitan.md": ("torchtitan",),
}
"""The page that says how to run each framework (``tune --help`` names it)."""

FIRST_STEPS = "\n".join((
    "first steps (every command also takes --help):",
    "  tune space --study demo --top 5       a shipped study's space, ranked (tune catalog "
    "models lists the model presets)",
    "  tune run --study my.yaml --dry-run    your study file: what would run first, at what cost",
    "  tune run --study my.yaml              the search; then tune leaderboard, tune best and "
    "tune report, each with --study my.yaml",
    "a study file: docs/guides/studies.md (the shipped studies are examples); every field: "
    "docs/reference/study.md (make docs builds the site into docs/_build/html)",
    "the framework (the study's framework:): "
    + "; ".join(f"{', '.join(names)}: {page}" for page, names in FRAMEWORK_PAGES.items()),
    "reading the tables, the cost of the trials and the leaderboard: docs/output.md; the "
    "report: docs/guides/report.md",
))  # fmt: skip

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
