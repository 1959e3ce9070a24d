"""The code blocks of README.md and docs/, and how each is checked (tests/test_docs_examples.py).

A page's blocks run in order in one fresh folder:

- ``console``: each ``$ `` line is a command; the lines after it, up to the next ``$ ``, are
  output that must appear, in that order, in what the command prints (blank runs of spaces
  count as one). ``tune`` runs in this process; ``make TARGET`` must name a Makefile target (the
  demos take minutes: ``make test`` itself and CI run them); ``python`` runs a script of the
  repository.
- ``yaml``: a study. Preceded by ``<!-- file: NAME -->`` it is written to ``NAME`` in the page's
  folder for the commands after it, and loaded; starting with ``# fragment of: STUDY`` it is
  merged into that shipped study and the result loaded; otherwise it is a whole study, loaded.
- ``python`` with ``>>>``: a doctest.
- ``text``: shown only (diagrams, layouts, recorded output); it may not hold a ``$ `` command.
  A block must say which of these it is.

``<!-- needs-cluster: REASON -->`` before a block that would launch on a real cluster:
``tune run`` runs with ``--dry-run`` and the other ``tune`` commands are only parsed; its output
is not compared. ``<!-- slow: REASON -->``: the block trains for real and runs only with the
slow tests.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!--\s*([a-z-]+):\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(`{3,})\s*([^\s`]*)")
KNOWN = {"console", "yaml", "python", "text", ""}
EXAMPLE_ENV = {
    "PROJECT": "/shared/project",
    "TUNER_DEMO_ROOT": str(REPO),
    "TUNER_DEMO_SSH": str(REPO / "results" / ".demo-ssh"),
}
"""Environment the examples' ``${NAME}`` references see."""


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    lang: str
    text: str
    markers: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    docs = sorted(
        p
        for p in (REPO / "docs").rglob("*.md")
        if "_build" not in p.parts and "_generated" not in p.parts
    )
    return [REPO / "README.md", *docs]


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks with the markers on the lines just above each."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        markers: dict[str, str] = {}
        k = i - 1
        while k >= 0 and (mk := MARKER.match(lines[k].strip())):
            markers[mk.group(1)] = mk.group(2)
            k -= 1
        if not lang.startswith("{"):  # a MyST directive (toctree, include), not an example
            text = textwrap.dedent("\n".join(lines[i + 1 : j]) + "\n")
            out.append(Block(page, i + 1, lang, text, markers))
        i = j + 1
    return out


def _normal(line: str) -> str:
    return " ".join(line.split())


def missing_output(expected: list[str], actual: str) -> list[str]:
    """Expected lines not found in ``actual``, in order (an empty list when all are there)."""
    got = [_normal(x) for x in actual.splitlines()]
    pos = 0
    for want in (_normal(x) for x in expected):
        if not want or want == "...":
            continue
        while pos < len(got) and got[pos] != want:
            pos += 1
        if pos == len(got):
            return [want]
        pos += 1
    return []


def run_tune(argv: list[str], cwd: Path) -> tuple[int, str]:
    """``tune ARGV`` in this process, in ``cwd``: exit status and stdout + stderr."""
    from tuner.cli.main import main

    buf = io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = main(argv)
    return code, buf.getvalue()


def parse_tune(argv: list[str]) -> None:
    """Parse ``tune ARGV`` (raises SystemExit on a bad command line)."""
    from tuner.cli.commands import build_parser, parse_args

    parse_args(build_parser()[0], argv)


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, flags=re.M))


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """``(command, expected output lines)`` of a console block."""
    out: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
    return out


def check_console(block: Block, cwd: Path) -> list[str]:
    """Run a console block; the problems found."""
    problems: list[str] = []
    cluster = "needs-cluster" in block.markers
    for command, expected in commands(block):
        words = shlex.split(command)
        where = f"{block.where}: $ {command}"
        if words[0] == "make":
            if words[1] not in make_targets():
                problems.append(f"{where}: no Makefile target {words[1]}")
            continue
        if words[0] == "python":
            proc = subprocess.run(
                [sys.executable, *words[1:]], cwd=REPO, capture_output=True, text=True,
                timeout=300,
            )  # fmt: skip
            code, printed = proc.returncode, proc.stdout + proc.stderr
        elif words[0] == "tune" and cluster and words[1] != "run":
            parse_tune(words[1:])
            continue
        elif words[0] == "tune":
            argv = words[1:] + (["--dry-run"] if cluster and "--dry-run" not in words else [])
            code, printed = run_tune(argv, cwd)
        else:
            problems.append(f"{where}: examples run tune, make or python, not {words[0]}")
            continue
        if code != 0:
            problems.append(f"{where}: exit {code}\n{printed[-2000:]}")
        elif not cluster and (lost := missing_output(expected, printed)):
            problems.append(
                f"{where}: the output has no line\n  {lost[0]}\nit printed:\n{printed}"
            )
    return problems


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in over.items()}}
    return over


def check_yaml(block: Block, cwd: Path) -> list[str]:
    """Load a study block (writing it first when it names a file); the problems found."""
    from tuner.errors import ConfigError
    from tuner.spec.file import expand_env, load_study, resolve_study_path, study_from_mapping

    first = block.text.splitlines()[0] if block.text.strip() else ""
    try:
        if "file" in block.markers:
            path = cwd / block.markers["file"]
            path.write_text(block.text)
            load_study(str(path))
        elif m := re.match(r"#\s*fragment of:\s*(\S+)", first):
            shipped = resolve_study_path(m.group(1), cwd=cwd)
            raw = _merge(yaml.safe_load(shipped.read_text()), yaml.safe_load(block.text))
            env = {**os.environ, **EXAMPLE_ENV}
            study_from_mapping(expand_env(raw, env), base_dir=shipped.parent)
        else:
            study_from_mapping(
                expand_env(yaml.safe_load(block.text), {**os.environ, **EXAMPLE_ENV}), base_dir=cwd
            )
    except ConfigError as e:
        return [f"{block.where}: the study does not load: {e}"]
    return []


def check_python(block: Block, cwd: Path) -> list[str]:
    """Run a ``>>>`` block as a doctest in ``cwd``; the problems found."""
    test = doctest.DocTestParser().get_doctest(
        block.text, {}, block.where, str(block.page), block.line
    )
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    with contextlib.chdir(cwd):
        runner.run(test, out=out.write)
    return [out.getvalue()] if runner.failures else []


def check(block: Block, cwd: Path) -> list[str]:
    """Check one block; the problems found."""
    if block.lang not in KNOWN:
        return [
            f"{block.where}: unknown block language {block.lang!r} (use one of {sorted(KNOWN)})"
        ]
    if block.lang == "console":
        return check_console(block, cwd)
    if block.lang == "yaml":
        return check_yaml(block, cwd)
    if block.lang == "python" and ">>>" in block.text:
        return check_python(block, cwd)
    if block.lang == "python":
        return [f"{block.where}: a python block must be a >>> session"]
    if not block.lang:
        return [f"{block.where}: say what the block is: console, yaml, python or text"]
    bad = [line for line in block.text.splitlines() if line.startswith("$ ")]
    return [f"{block.where}: a command in a text block (make it console): {bad[0]}"] if bad else []
