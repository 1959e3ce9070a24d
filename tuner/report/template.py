"""The properties of plotly's checked copy of its ``plotly_white`` template, kept as JSON.

Every figure of the report is styled with ``plotly_white`` (:func:`tuner.report.figures.styled`),
and its layout holds the template as plotly's template validator makes it: a copy rebuilt from
the registered template's properties, checked, its keys in plotly's order (each object's
properties in the order its class sets them, which the page's JSON of every figure follows).
Making that copy imports some 170 of plotly's modules (every trace type the template styles:
bar polar, carpet, choropleth and the rest; the report draws three) and checks each property:
about 0.13 s of CPU, once a report. Those properties are kept here (``plotly_white.json``),
written from the plotly version :data:`KEPT_FROM` by :func:`kept_text`; on another version
the copy is plotly's own (``tests/report/test_report_fast_paths.py`` holds the kept text to
the copy of the installed plotly).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import plotly

KEPT_FROM = "7.1.0"
"""The plotly version whose checked copy ``plotly_white.json`` is."""

KEPT = "plotly_white.json"
"""The kept properties' file, beside this module."""


def checked_props() -> dict[str, Any]:
    """A new dict of the properties of plotly's checked copy of ``plotly_white``: read from the
    kept file on plotly :data:`KEPT_FROM`, from plotly's copy on another version."""
    text = kept_text() if plotly.__version__ != KEPT_FROM else _kept_file()
    return dict(json.loads(text))


def _kept_file() -> str:
    return resources.files("tuner.report").joinpath(KEPT).read_text()


def kept_text() -> str:
    """The properties of the installed plotly's checked copy as the kept file's JSON (the file
    is this text; write it again when plotly's version changes, and :data:`KEPT_FROM`)."""
    import copy

    import plotly.io as pio

    props = copy.deepcopy(pio.templates["plotly_white"])._props  # what the validator makes
    return json.dumps(props) + "\n"
