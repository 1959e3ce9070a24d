"""Which framework a launch template is for, so a study cannot pair one with another's.

A launch template says which framework(s) it launches in a Jinja comment of its own, which
renders to nothing::

    {#- framework: megatron -#}
    {#- framework: megatron, megatron-deepspeed -#}

The templates shipped in the package all declare theirs; copy the line into your own. A study
whose ``framework`` is not among those its template declares is refused at load
(``launch.template``), because its trials would pass one framework's flags to another's script
and every one would fail at launch. A template that declares nothing is taken on trust.

The lookup order of a template name is the launch layer's (:mod:`tuner.launch.templates`), kept
here because the study file's loader needs it: ``launch.templates_dir``, then
``./launch_templates``, then the package's ``tuner/templates``.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import get_args

from tuner.errors import ConfigError
from tuner.spec.frameworks import Framework

SCRIPT_SUFFIX = ".sh.j2"
"""A launch template ``NAME`` is the file ``NAME.sh.j2``."""
_DECLARATION = re.compile(r"\{#-?\s*framework:\s*([^#]*?)\s*-?#\}")
_HEAD_CHARS = 4096  # the declaration sits at the top; a template is never read whole here


def template_dirs(templates_dir: str | None, cwd: Path | None = None) -> list[Path]:
    """The folders searched for templates before the package's own, in order."""
    cwd = cwd or Path.cwd()
    dirs: list[Path] = []
    if templates_dir:
        d = Path(templates_dir).expanduser()
        dirs.append(d if d.is_absolute() else cwd / d)
    dirs.append(cwd / "launch_templates")
    return dirs


def find_template(name: str, templates_dir: str | None, cwd: Path | None = None) -> Traversable:
    """The file of template ``name`` as the renderer would pick it; ``FileNotFoundError``."""
    filename = name + SCRIPT_SUFFIX
    for d in template_dirs(templates_dir, cwd):
        if (d / filename).is_file():
            return d / filename
    shipped = resources.files("tuner").joinpath("templates", *filename.split("/"))
    if shipped.is_file():
        return shipped
    raise FileNotFoundError(filename)


def declared_frameworks(text: str) -> tuple[str, ...] | None:
    """The frameworks a template's ``{#- framework: ... -#}`` line names, or None."""
    match = _DECLARATION.search(text[:_HEAD_CHARS])
    if match is None:
        return None
    return tuple(n.strip() for n in match.group(1).split(",") if n.strip())


def check_template_framework(
    framework: Framework, name: str, templates_dir: str | None, cwd: Path | None = None
) -> None:
    """Refuse a template that declares other frameworks than ``framework`` (see the module)."""
    try:
        template = find_template(name, templates_dir, cwd)
        with template.open("rb") as f:
            head = f.read(_HEAD_CHARS).decode("utf-8", errors="replace")
    except OSError:
        return  # not found or unreadable: the launch layer names it when it renders
    declared = declared_frameworks(head)
    if declared is None:
        return
    unknown = [n for n in declared if n not in get_args(Framework)]
    if unknown:
        raise ConfigError(
            f"{template}: declares framework {unknown[0]!r}, not one of "
            f"{', '.join(get_args(Framework))}",
            path="launch.template",
        )
    if framework not in declared:
        raise ConfigError(
            f"{name!r} is a template for {', '.join(declared)} ({template}); this study's "
            f"framework is {framework}",
            path="launch.template",
        )
