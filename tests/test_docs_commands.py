"""Every ``tune`` command the README and docs/ quote names a real subcommand, options that
subcommand takes and values its choices accept, checked against the real parser.

tests/test_docs_examples.py runs the console blocks; the commands quoted in the prose
(```tune run --dry-run```, ```COLUMNS=120 tune leaderboard --study demo | less```) and in text
blocks (``tune best`` synopsis of docs/exports.md) ran nowhere, and are often abridged (no
``--study``), so they are checked word by word here rather than run: a renamed or removed option
or choice, or a misspelled subcommand, in any of them fails.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs_examples import REPO, blocks, pages
from tuner.cli.commands import build_parser

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
PLACEHOLDER = re.compile(r"[<>A-Z]|\.\.\.")
"""A word that stands for what the reader types (``<cmd>``, ``COMMAND``, ``NAME``, ``N``)."""


def _prose(text: str) -> str:
    """The page without its fenced blocks (their lines blanked, so that paragraphs stay)."""
    out, fence = [], ""
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence:
            fence = "" if m and m.group(1).startswith(fence[:3]) else fence
            out.append("")
        elif m:
            fence = m.group(1)
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def quoted() -> Iterator[tuple[str, str]]:
    """``(where, command)`` for every ``tune ...`` in an inline code span of a page's prose
    and on a line of its console and text blocks (output lines such as ``tune best: wrote``
    are not commands: their second word is not a plain word)."""
    for page in pages():
        name = str(page.relative_to(REPO))
        for paragraph in re.split(r"\n\s*\n", _prose(page.read_text())):
            for span in paragraph.split("`")[1::2]:
                if re.search(r"(^|\s|/)tune \S", span):
                    yield name, " ".join(span.split())
        for block in blocks(page):
            if block.lang not in ("console", "text"):
                continue
            for line in block.text.splitlines():
                line = line.removeprefix("$ ").strip()
                if re.match(r"(\S+=\S+ )*(\S*/)?tune [a-zA-Z<\[]", line):
                    yield block.where, line


def _words(command: str) -> list[str]:
    """The words after ``tune``, up to a pipe, a comment or a second command."""
    tail = re.split(r"(?:^|\s|/)tune ", command, maxsplit=1)[1]
    tail = re.split(r"\s(?:\||;|&&|#)\s?", tail)[0]
    try:
        return shlex.split(tail)
    except ValueError:  # an unbalanced quote in an abridged command
        return tail.split()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def problems(command: str, parser: argparse.ArgumentParser) -> list[str]:
    """What in ``command`` the parser does not know: its subcommand, an option, a choice."""
    words = _words(command)
    subs = _subparsers(parser)
    if not words or words[0].startswith("-"):  # `tune --help`, `tune --version`
        known = {o for a in parser._actions for o in a.option_strings}
        return [f"tune has no option {w}" for w in words if w.startswith("-") and w not in known]
    if PLACEHOLDER.search(words[0]) or words[0].startswith("["):
        return []  # `tune <cmd> --help`, `tune COMMAND --study NAME ...`
    if words[0] not in subs:
        return [f"no subcommand {words[0]!r}"]
    sub = subs[words[0]]
    options = {o: a for a in sub._actions for o in a.option_strings}
    found = []
    positional = [a for a in sub._actions if not a.option_strings and a.choices]
    if positional and len(words) > 1 and not words[1].startswith("-"):
        value = words[1]
        if not PLACEHOLDER.search(value) and value not in positional[0].choices:  # type: ignore[operator]
            found.append(f"tune {words[0]}: {value!r} is not one of {list(positional[0].choices)}")  # type: ignore[arg-type]
    for i, word in enumerate(words):
        word = word.strip("[]")
        if not word.startswith("--"):
            continue
        name, _, value = word.partition("=")
        if name not in options:
            found.append(f"tune {words[0]} has no option {name}")
            continue
        action = options[name]
        if not value and action.nargs != 0 and i + 1 < len(words):
            value = words[i + 1].strip("[]")
        if action.choices is None or not value or value.startswith("-"):
            continue
        for one in value.split("|"):  # a synopsis's `script|sbatch|args`
            if not PLACEHOLDER.search(one) and one not in action.choices:
                found.append(f"tune {words[0]} {name}: {one!r} is not one of "
                             f"{list(action.choices)}")  # fmt: skip
    return found


COMMANDS = sorted(set(quoted()))


def test_the_docs_quote_commands() -> None:
    """The extraction finds what the pages quote (a regression in it would check nothing)."""
    commands = {c for _, c in COMMANDS}
    assert len(commands) > 40
    assert "tune run --dry-run" in commands  # prose
    assert "COLUMNS=120 tune leaderboard --study demo | less" in commands  # prose, piped
    assert any(c.startswith("tune best --study S [--trial N]") for c in commands)  # text block
    assert "tune run --study llama3-70b.yaml --dry-run" in commands  # console block


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[f"{w}: {c}" for w, c in COMMANDS])
def test_a_quoted_command_is_one_the_parser_takes(where: str, command: str) -> None:
    parser = build_parser()[0]
    assert problems(command, parser) == [], f"{where}: {command}"


@pytest.mark.parametrize(
    "command",
    ["tune leaderbord --study demo", "tune run --dryrun", "tune best --emit sbach",
     "tune catalog gpu", "tune best --study S [--emit script|sbatch|arg]", "tune --verison"],
)  # fmt: skip
def test_a_wrong_command_is_found(command: str) -> None:
    assert problems(command, build_parser()[0])


def test_the_exports_page_names_every_kind_and_its_files() -> None:
    """docs/exports.md's synopsis and table listed four of the seven ``--emit`` kinds (the
    Megatron-Bridge and torchtitan ones only on their own pages)."""
    from tuner.layout import EXPORT_KINDS, ExportPaths

    text = (REPO / "docs" / "exports.md").read_text()
    assert f"[--emit {'|'.join(EXPORT_KINDS)}]" in text
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z-]+)`.*$", text, re.M)}
    for kind in EXPORT_KINDS:
        written = getattr(ExportPaths(Path("x")), kind.replace("-", "_")).name
        assert kind in rows and f"`{written}`" in rows[kind], kind


def _script_invocations() -> Iterator[tuple[str, str]]:
    """``(page, span)`` for every inline code span that runs a repository script with
    arguments (``python tools/local_slurm.py start --dir DIR``), as a reader would type it."""
    for page in pages():
        for paragraph in re.split(r"\n\s*\n", _prose(page.read_text())):
            for span in paragraph.split("`")[1::2]:
                span = " ".join(span.split())
                if re.search(r"(?:^|\s)(?:tools|benchmarks)/\S+\.py \S", span):
                    yield str(page.relative_to(REPO)), span


def test_quoted_scripts_are_run_with_python() -> None:
    """The scripts of tools/ and benchmarks/ are not executable: ``tools/loopback_sshd.py start``
    typed as the SSH guide quoted it answered ``Permission denied``."""
    spans = list(_script_invocations())
    assert any("tools/local_slurm.py start" in s for _, s in spans)  # the extraction works
    bare = [
        f"{page}: {span}"
        for page, span in spans
        if not re.match(r"(\w+=\S* )*(\S+/)?python3? ", span)
    ]
    assert bare == []


class _Parsed(Exception):
    """A script's parser read the words it was given; nothing of the script ran."""


def _script_problem(span: str, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """What the script of ``span`` (``python tools/x.py ARGS``) says of ``ARGS`` when its own
    parser reads them, or None: its ``main`` runs with ``parse_args`` stopped at the parse. A
    word in capitals (``DIR``, ``N``) stands for any value; ``[...]`` is an optional part."""
    words = shlex.split(span)
    while not re.match(r"(\S+/)?python3?$", words[0]):  # `VAR=value python ...`
        words.pop(0)
    script, args = REPO / words[1], [w.strip("[]") for w in words[2:]]
    args = ["1" if re.fullmatch(r"[A-Z]+", w) else w for w in args if w]
    choices = [w.split("|") if "|" in w and not w.startswith("-") else [w] for w in args]
    for one in itertools.product(*choices):  # a synopsis's `own|other`: each of them
        if why := _parsed(script, list(one), monkeypatch):
            return why
    return None


def _parsed(script: Path, args: list[str], monkeypatch: pytest.MonkeyPatch) -> str | None:
    """``script``'s usage error on ``args`` (its last line), or None once its parser read them."""
    import importlib.util
    import io
    import sys

    spec = importlib.util.spec_from_file_location(f"_quoted_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a script puts the repository first
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", [str(script), *args])
    monkeypatch.setattr(sys, "stderr", err := io.StringIO())
    try:
        module.main()
    except _Parsed:
        return None
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return "ran without reading its arguments"


def test_a_quoted_script_takes_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/guides/calibration.md quoted ``python tools/probe_truth.py --iters 10``, without the
    ``--study`` the script requires: typed as written it stopped at a usage error. Every quoted
    script invocation is read by the script's own parser."""
    original = argparse.ArgumentParser.parse_args

    def parse(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parsed(original(self, *args, **kwargs))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)
    spans = sorted(set(_script_invocations()))
    assert any("tools/probe_truth.py" in s for _, s in spans)  # the extraction works
    found = [f"{page}: {span}: {why}" for page, span in spans
             if (why := _script_problem(span, monkeypatch))]  # fmt: skip
    assert found == []
    assert _script_problem("python tools/probe_truth.py --iters 10", monkeypatch)


def _first_paragraph(script: Path) -> str:
    import ast

    doc = ast.get_docstring(ast.parse(script.read_text()), clean=False) or ""
    return " ".join(doc.split("\n\n")[0].split())


_SCRIPTS = sorted(
    p.relative_to(REPO).as_posix()
    for d in ("tools", "benchmarks")
    for p in (REPO / d).glob("*.py")
    if "argparse.ArgumentParser(" in p.read_text()
)


def test_the_scripts_with_a_parser_are_found() -> None:
    assert len(_SCRIPTS) > 20 and "tools/probe_truth.py" in _SCRIPTS


@pytest.mark.parametrize("name", _SCRIPTS)
def test_a_scripts_help_gives_its_whole_first_paragraph(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scripts of tools/ and benchmarks/ described themselves with their docstring's first
    line, so ``--help`` cut the sentence mid-way (``tools/probe_truth.py``: "... against the
    models with the" and no more). Every script's parser, built by its own ``main`` (stopped at the
    parse), carries its docstring's whole first paragraph."""
    built: list[argparse.ArgumentParser] = []

    def parse(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        built.append(self)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)
    script = REPO / name
    monkeypatch.syspath_prepend(str(script.parent))  # as ``python benchmarks/x.py`` has it
    assert _parsed(script, [], monkeypatch) is None
    assert " ".join((built[0].description or "").split()) == _first_paragraph(script)


def test_the_studies_guide_names_every_shipped_study() -> None:
    """docs/guides/studies.md lists the studies ``--study NAME`` finds (``demo-fsdp`` was not)."""
    from tuner.spec.file import shipped_study_names

    text = (REPO / "docs" / "guides" / "studies.md").read_text()
    listed = re.search(r"`tune` finds them by name: ([^)]*)\)", text)
    assert listed is not None
    assert sorted(re.findall(r"`([\w-]+)`", listed.group(1))) == sorted(shipped_study_names())


def _board_header(line: str) -> bool:
    """Whether ``line`` is the leaderboard's header: some of its columns, in its order."""
    from tuner.cli.board import BOARD_COLUMNS

    rest = " ".join(line.split())
    for column in BOARD_COLUMNS:
        if rest == column.header:
            return True
        rest = rest.removeprefix(column.header + " ")
    return False


def test_a_recorded_leaderboard_has_the_columns_tune_prints() -> None:
    """A page's recorded ``tune leaderboard`` (a ``text`` block: its figures are one run's, so
    no test reruns it) had kept a format tune no longer printed (boxed, ``#``, ``pred s``)."""
    recorded = [
        b
        for page in pages()
        for b in blocks(page)
        if b.lang == "text" and b.text.startswith("leaderboard of ")
    ]
    assert recorded, "docs/guides/frameworks.md records demo-moe's"
    for block in recorded:
        lines = block.text.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("rank"))
        assert _board_header(lines[header]), f"{block.where}: {lines[header]}"
    assert not _board_header("#  outcome  tp  pp  pred s  step s")


def test_every_framework_has_a_page_in_the_guides_and_a_shipped_study() -> None:
    """A newcomer picking a framework found Megatron-Bridge among the site's guides but
    torchtitan, "Reading tune's output" and "node-hours" only under "More" (pages the index did
    not place), the studies guide and the frameworks guide naming three of the five frameworks,
    and no study to start from for Bridge or a torchtitan cluster. Every framework is named in
    both guides with a link to its page, that page is in the index's Guides, and a shipped study
    uses it (or, for megatron-deepspeed, the guide says none is shipped)."""
    import yaml

    from tuner.spec.file import resolve_study_path, shipped_study_names
    from tuner.spec.frameworks import FRAMEWORKS

    index = (REPO / "docs" / "index.md").read_text()
    guides = re.search(r":caption: Guides\n\n(.*?)```", index, flags=re.S)
    assert guides is not None
    placed = set(guides.group(1).split())
    assert {"torchtitan", "megatron-bridge", "output", "guides/report"} <= placed
    studies = (REPO / "docs" / "guides" / "studies.md").read_text()
    frameworks = (REPO / "docs" / "guides" / "frameworks.md").read_text()
    shipped = {yaml.safe_load(resolve_study_path(name).read_text())["framework"]
               for name in shipped_study_names()}  # fmt: skip
    for framework in FRAMEWORKS:
        assert f"`{framework}`" in studies and f"`{framework}`" in frameworks, framework
        assert framework in shipped or f"| `{framework}` | none shipped" in studies, framework
