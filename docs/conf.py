"""Sphinx configuration of tuner's documentation site (``make docs``).

The pages are Markdown (MyST). The references are written from the code when the site is built
(``tuner.cli.reference``): nothing in ``reference/_generated/`` is kept by hand or committed.
"""

from __future__ import annotations

import re
from pathlib import Path

from tuner.cli.reference import catalog_reference, cli_reference, study_reference

project = "tuner"
author = "the tuner authors"
copyright = "the tuner authors"  # noqa: A001 (Sphinx reads this name)
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# _generated holds the references, included by reference/*.md; _build is the output.
exclude_patterns = ["_build", "**/_generated", "README.md"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
html_theme = "alabaster"
html_theme_options = {
    "description": "Parallel configs for Megatron-LM, DeepSpeed, Megatron-Bridge and torchtitan"
}
html_static_path: list[str] = []
html_last_updated_fmt = None
# Offline: no intersphinx, no external fetches at build time.

_DOCS = Path(__file__).parent
_GENERATED = _DOCS / "reference" / "_generated"
_GENERATED.mkdir(parents=True, exist_ok=True)
for _name, _make in (("study", study_reference), ("cli", cli_reference),
                     ("catalog", catalog_reference)):  # fmt: skip
    _text = _make()
    _path = _GENERATED / f"{_name}.md"
    if not _path.exists() or _path.read_text() != _text:  # keeps incremental builds quick
        _path.write_text(_text)


def _more_toctree() -> str:
    """A toctree of the pages at the top of docs/ that index.md does not list yet, so that a new
    page is in the navigation (under "More") until it is given its place."""
    index = (_DOCS / "index.md").read_text()
    listed = set()
    for block in re.findall(r"```\{toctree\}\n(.*?)```", index, flags=re.S):
        listed |= {line.strip() for line in block.splitlines() if line and line[0] not in ":"}
    extra = sorted(p.stem for p in _DOCS.glob("*.md") if p.stem not in listed | {"index"})
    if not extra:
        return ""
    return "```{toctree}\n:maxdepth: 1\n:caption: More\n\n" + "\n".join(extra) + "\n```\n"


_MORE = _GENERATED / "more.md"
if not _MORE.exists() or _MORE.read_text() != _more_toctree():
    _MORE.write_text(_more_toctree())
