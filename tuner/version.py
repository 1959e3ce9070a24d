"""The tuner's own version and distribution name (``tune --version``, the report's header, an
exported run's header), in a module of their own: :mod:`tuner.logs.versions`, where they were,
is in the log parsers' package, whose import loads every parser (a few hundredths of a second
that ``tune --version`` and the report paid for one string).

May import: nothing of the tuner.
"""

from __future__ import annotations

import functools
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

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"
    return str(project["version"]) if project.get("name") == DISTRIBUTION else "0+unknown"
