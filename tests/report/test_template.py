"""The kept ``plotly_white`` properties are plotly's checked copy's, key order and all; on
another plotly version the copy is plotly's own."""

from __future__ import annotations

import copy
import json
import sys
from importlib import resources

import plotly
import plotly.io as pio
import pytest

from tuner.report import template as T


def _plotlys() -> str:
    """The installed plotly's checked copy of the template (its template validator's)."""
    return json.dumps(copy.deepcopy(pio.templates["plotly_white"])._props)


def test_the_kept_properties_are_plotlys_checked_copy() -> None:
    assert plotly.__version__ == T.KEPT_FROM  # else the comparison compares nothing
    kept = resources.files("tuner.report").joinpath(T.KEPT).read_text()
    assert kept == T.kept_text()
    assert json.dumps(T.checked_props()) == _plotlys()  # the same keys in the same order
    assert json.dumps(T.checked_props()) != json.dumps(pio.templates["plotly_white"]._props)


def test_the_kept_properties_are_read_without_plotlys_copy() -> None:
    """No graph-object module of a trace type the report does not draw is loaded to read them
    (the copy loads every trace type the template styles)."""
    code = ("import sys; from tuner.report.template import checked_props; checked_props(); "
            "print('plotly.graph_objs._barpolar' in sys.modules)")  # fmt: skip
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert out.strip() == "False"


def test_another_plotly_gets_plotlys_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(T, "KEPT", "no-such-file.json")  # read, it would fail
    monkeypatch.setattr(T, "KEPT_FROM", "0.0.0")
    props = T.checked_props()
    assert json.dumps(props) == _plotlys()
    assert props is not T.checked_props()  # a new dict each time: the caller's to keep
