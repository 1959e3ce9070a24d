"""The version of this package (``tuner.__version__``; exports name it in their header)."""

from __future__ import annotations

import functools

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
    from pathlib import Path

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"
    return str(project["version"]) if project.get("name") == DISTRIBUTION else "0+unknown"
