"""Software versions, for the header of an exported full run: this package's own, and the ones
a trial's training log names.

Two kinds of line are read: ``tuner-versions: name=version name=version ...``, which a training
script prints to have its software named (the repository's DeepSpeed workload prints python,
torch and deepspeed), and DeepSpeed's own ``DeepSpeed info: version=0.19.8, git-hash=...``, which
``deepspeed.initialize`` logs when DeepSpeed's logger is at INFO from the start (Megatron-DeepSpeed
sets that up). Megatron-LM prints no version line, so a Megatron log yields nothing, and the
export says so rather than guess.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path

DISTRIBUTION = "paratune"
"""The name this package is installed under (``pip install paratune``); it imports as ``tuner``."""


@functools.cache
def tuner_version() -> str:
    """The installed distribution's version; in a source checkout, the one in pyproject.toml.

    Why the fallback: running from a checkout (``PYTHONPATH=.``, or a venv holding an older
    install) has no metadata for this code, and pyproject.toml stays the one place the version
    is written.
    """
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"
    return str(project["version"]) if project.get("name") == DISTRIBUTION else "0+unknown"


_PATTERNS = {
    "deepspeed": re.compile(r"DeepSpeed info: version=([0-9][0-9A-Za-z.+_-]{0,40})"),
}
#: How much of a log's start is read: the version lines come before the first iteration.
HEAD_BYTES = 1 << 20


_OWN_LINE = re.compile(r"^tuner-versions:(.*)$", re.M)
_PAIR = re.compile(r"\s([A-Za-z][A-Za-z0-9_.-]{0,40})=([0-9][0-9A-Za-z.+_-]{0,40})(?=\s|$)")


def versions_in_text(text: str) -> dict[str, str]:
    """``{"torch": "2.13.0", "deepspeed": "0.19.8"}``: the versions ``text`` names (the first
    of each name)."""
    out: dict[str, str] = {}
    line = _OWN_LINE.search(text)
    if line:
        for name, version in _PAIR.findall(" " + line.group(1)):
            out.setdefault(name, version)
    for name, pattern in _PATTERNS.items():
        match = pattern.search(text)
        if match:
            out.setdefault(name, match.group(1).rstrip(".,"))
    return out


def versions_in_logs(paths: Iterable[Path]) -> dict[str, str]:
    """The versions named at the start of the logs ``paths`` (missing files are skipped)."""
    out: dict[str, str] = {}
    for path in paths:
        try:
            with path.open("rb") as f:
                head = f.read(HEAD_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        for name, version in versions_in_text(head).items():
            out.setdefault(name, version)
    return out
