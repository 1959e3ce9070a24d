"""Options more than one ``tune`` subcommand shares (kept apart from :mod:`tuner.cli.main` so that
a subcommand's module can use them without importing the whole command line)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_format_option(
    parser: argparse.ArgumentParser, choices: Sequence[str] = ("table", "json"),
    json_synonym: bool = True,
) -> None:  # fmt: skip
    """``--format`` (the first choice is the default); ``--json`` is ``--format json``."""
    parser.add_argument("--format", choices=list(choices), default=choices[0],
                        help=f"output format (default: {choices[0]})")  # fmt: skip
    if json_synonym:
        parser.add_argument("--json", dest="format", action="store_const", const="json",
                            help="one JSON object on stdout (same as --format json)")  # fmt: skip


STUDY_HELP = (
    "study name (studies/NAME.yaml here, else a study shipped with tuner) or a path to a YAML file"
)


def add_study_option(parser: argparse.ArgumentParser) -> None:
    """The required ``--study`` every study command takes."""
    parser.add_argument("--study", required=True, metavar="NAME", help=STUDY_HELP)


def add_columns_option(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    """``--columns a,b``: which of a table's columns to show, in that order."""
    parser.add_argument(
        "--columns", metavar="NAME[,NAME]", default=None,
        help=f"the table's columns, in this order (default: as many as fit; names: "
        f"{', '.join(names)})",
    )  # fmt: skip
