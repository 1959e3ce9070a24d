"""The screenshots of the report in the docs are taken from the current template."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.report import screenshots


def test_the_docs_screenshots_are_current() -> None:
    assert screenshots.problems() == []


def test_a_changed_template_makes_them_stale(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    changed = tmp_path / "page.html.j2"
    changed.write_text(screenshots.TEMPLATE[0].read_text() + "<!-- changed -->")
    monkeypatch.setattr(screenshots, "TEMPLATE", (changed, *screenshots.TEMPLATE[1:]))
    assert any("make screenshot" in p for p in screenshots.problems())
