"""The command line's parser class and the options and value types more than one ``tune``
subcommand shares (kept apart from :mod:`tuner.cli.commands` so that a subcommand's module can use
them without importing the whole command line)."""

from __future__ import annotations

import argparse
import difflib
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from tuner.layout import folder_problem
from tuner.outcome import RERUNNABLE, Outcome
from tuner.spec.bounds import read_float, read_integer


class VersionAction(argparse.Action):
    """``--version``, reading the installed metadata only when asked (it is slow to import)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:  # fmt: skip
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
        option_string: str | None = None,
    ) -> None:  # fmt: skip
        import tuner

        sys.stdout.write(f"tune {tuner.__version__} ({tuner.DISTRIBUTION})\n")
        parser.exit()


REQUIRED = "the following arguments are required: "
"""argparse's words before the arguments missing from a command line."""


class Parser(argparse.ArgumentParser):
    """argparse's parser with its usage errors as every other bad input: one line starting
    ``tune: error:`` (the usage block argparse prints first is left to ``--help``), exit 2."""

    def error(self, message: str) -> NoReturn:
        if message.startswith(REQUIRED):
            missing = message.removeprefix(REQUIRED).split(", ")
            message = self._choices_missing(missing) or message
            if missing == ["--study"]:  # `tune leaderboard`: which study, and how to name one
                from tuner.spec.file import known_studies

                message = (f"{self.prog} needs --study NAME: one of "
                           f"{', '.join(known_studies())}, or a study's YAML file")  # fmt: skip
        if m := INVALID_CHOICE.search(message):  # `tune leaderbord`, `--emit sbach`
            message += _did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        self.exit(2, f"tune: error: {message} (see {self.prog} --help)\n")

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        """argparse's, but an empty value is refused naming its option: ``--results ""`` was
        the current folder (a path made of "" is "."), ``--study ""`` "is a directory" and
        ``tune profile --study ""`` a traceback. An option whose default is "" takes it."""
        subcommand = isinstance(action, argparse._SubParsersAction)  # gets the words after it
        if arg_string == "" and action.default != "" and not subcommand:
            what = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
            raise argparse.ArgumentError(action, f"an empty value; give {what}")
        return super()._get_value(action, arg_string)

    def _choices_missing(self, names: Sequence[str]) -> str | None:
        """``tune catalog needs one of: gpus, models`` when what is missing is one argument with
        choices (argparse said "the following arguments are required: what", under a usage
        line showing ``{gpus,models}``); None otherwise."""
        found = [a for a in self._actions if not a.option_strings and a.choices
                 and (a.metavar or a.dest) in names]  # fmt: skip
        if len(names) != 1 or len(found) != 1:
            return None
        what = f"a {found[0].metavar.lower()}, " if isinstance(found[0].metavar, str) else ""
        return f"{self.prog} needs {what}one of: {', '.join(found[0].choices)}"  # type: ignore[arg-type]

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        """argparse's, but an option the command does not take (``tune leaderboard --json``)
        points at that command's ``--help``, not ``tune --help``, which does not list it."""
        known, extras = self.parse_known_args(args, namespace)
        command = getattr(known, "command", None)
        if not extras and "results" not in known and "--results" in self._options(command):
            problem = folder_problem(RESULTS_DEFAULT)  # what a type checks for --results DIR
            if problem is not None:
                self.exit(2, f"tune: error: the default results folder ./{RESULTS_DEFAULT}: "
                             f"{problem}; give --results DIR (see {self.prog} {command} "
                             "--help)\n")  # fmt: skip
        if extras:
            prog = f"{self.prog} {command}" if command else self.prog
            hint = ""
            if extras[0].startswith("--"):  # `--colums`: the option it is nearest to
                hint = _did_you_mean(extras[0].partition("=")[0], self._options(command), "--")
            self.exit(2, f"tune: error: unrecognized arguments: {' '.join(extras)}{hint} "
                         f"(see {prog} --help)\n")  # fmt: skip
        return known

    def _options(self, command: str | None) -> list[str]:
        """The long options ``tune COMMAND`` takes (the subcommand's and the global ones)."""
        parsers: list[argparse.ArgumentParser] = [self]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                parsers.append(action.choices[command])
        return [o for p in parsers for a in p._actions for o in a.option_strings
                if o.startswith("--")]  # fmt: skip


INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
"""argparse's words for a value that is not one of an argument's choices."""


def _did_you_mean(given: str, known: Sequence[str], prefix: str = "") -> str:
    """``; did you mean 'leaderboard'?`` for the known word nearest a mistyped one, else "";
    words are compared without their common ``prefix`` (``--json`` is not near ``--version``)."""
    bare = [k.removeprefix(prefix) for k in known]
    close = difflib.get_close_matches(given.removeprefix(prefix), bare, n=1)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""


def describe_subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Each subcommand's ``--help`` begins with what it does, its line in ``tune --help``
    (``tune run --help`` began with its usage: what ``run`` does was only in ``tune --help``);
    one that has a description of its own keeps it."""
    said = {a.dest: a.help for a in sub._choices_actions}
    for name, command in sub.choices.items():
        text = said.get(name)
        if command.description is None and text:
            command.description = f"{text[0].upper()}{text[1:]}."


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


RESULTS_DEFAULT = "results"
"""The results folder of a command given no ``--results`` (``./results``)."""


def folder(text: str) -> str:
    """An argparse ``type``: a results folder's path as given, ``~`` expanded (as ``--study``'s:
    the shell expands none in ``--results=~/r``; the check was of the home's folder, the
    results went to ``./~/r``), refused when it cannot hold results (:func:`folder_problem`):
    ``--results LOOP`` was a RuntimeError's traceback from the first command that resolved it,
    exit 1, and so was ``--results=~nobody/r``."""
    problem = folder_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return str(Path(text).expanduser()) if text.startswith("~") else text


def whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``minimum`` (to ``maximum``), else argparse's
    one-line usage error naming the option (``--n-trials -3`` used to print a budget of -3
    launches, and ``--n-trials 0`` silently meant the study's own count). ASCII digits only, as
    in the study file (:func:`read_integer`: ``--n-trials ４`` was 4)."""

    def parse(text: str) -> int:
        value = read_integer(text)
        if value is None:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"{minimum} to {maximum:,}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def positive_number(text: str) -> float:
    """An argparse ``type``: a finite number > 0 in ASCII (:func:`read_float`; ``float`` took
    ``４.５``), else argparse's one-line usage error naming the option (``--train-tokens inf``
    and ``nan`` made a payback of no meaning)."""
    value = read_float(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def comma_list(text: str) -> list[str]:
    """``a,b,c`` -> ``["a", "b", "c"]``: the one rule of every comma list on the command line
    (``--columns``, ``--rerun``, ``--message-bytes``). A piece that is empty (``tp,,pp``,
    ``timeout,``, ``,,``) or given twice (``tp,tp``) is refused, a ValueError naming it: a name
    typed and lost, or a slip, not a wish. Before, ``--rerun ,,`` was accepted as no outcome
    and ``--columns ,,,`` refused; ``--columns tp,tp`` showed the column twice."""
    names = [piece.strip() for piece in text.split(",")]
    if "" in names:
        raise ValueError(f"an empty item in {text!r} (items separated by single commas)")
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise ValueError(f"{twice!r} given twice in {text!r}")
    return names


def _listed(text: str) -> list[str]:
    """:func:`comma_list` as an argparse ``type`` step (its usage error names the option)."""
    try:
        return comma_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def wholes(minimum: int) -> Callable[[str], tuple[int, ...]]:
    """An argparse ``type``: a comma-separated list ``N[,N]`` of whole numbers from ``minimum``."""
    one = whole(minimum)

    def parse(text: str) -> tuple[int, ...]:
        values = tuple(one(part) for part in _listed(text))
        if len(set(values)) < len(values):  # 1024,1_024 and 1024,01024: one size
            raise argparse.ArgumentTypeError(f"a number given twice in {text!r}")
        return values

    return parse


def rerun_outcomes(text: str) -> frozenset[Outcome]:
    """An argparse ``type``: ``--rerun timeout,hang``, the outcomes whose configs run again (a
    measured failure only: :data:`tuner.outcome.RERUNNABLE`)."""

    out = set()
    for name in _listed(text) if text else ():  # "": the default, no outcome
        outcome = next((o for o in RERUNNABLE if o.value == name), None)
        if outcome is None:
            allowed = ", ".join(sorted(str(o) for o in RERUNNABLE))
            raise argparse.ArgumentTypeError(f"{name!r} is not one of {allowed}")
        out.add(outcome)
    return frozenset(out)


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
