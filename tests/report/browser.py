"""A real headless Chromium (the system's, driven by Playwright) that opens a report from file://
and says what it saw: requests that left the file, JavaScript errors, plots drawn."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:")


def chromium_path() -> str | None:
    """The system Chromium, if any (never a downloaded one)."""
    for name in CANDIDATES:
        found = name if os.path.isfile(name) else shutil.which(name)
        if found and os.access(found, os.X_OK):
            return found
    return None


def missing(reason: str) -> None:
    """Skip, except in CI (CI=true), where a missing browser is a failure."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (CI: the browser tests must run)")
    pytest.skip(reason)


@dataclass
class PageView:
    """What the browser saw of one page."""

    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    svgs: dict[str, int] = field(default_factory=dict)
    """Section id -> plotly figures drawn in it (an SVG with a plot area)."""
    points: dict[str, int] = field(default_factory=dict)
    """Figure div id -> scatter markers drawn."""
    bars: dict[str, int] = field(default_factory=dict)
    """Figure div id -> bars drawn."""
    table_rows: int = 0

    def problems(self, sections: dict[str, int]) -> list[str]:
        """Everything wrong with the page, given each section's expected figure count."""
        out = [f"network request: {u}" for u in self.requests]
        out += [f"JavaScript error: {e}" for e in self.errors]
        for section, expected in sections.items():
            if self.svgs.get(section, 0) < expected:
                out.append(f"section {section}: {self.svgs.get(section, 0)} plots < {expected}")
        return out


COUNT_JS = """() => {
  const svgs = {}, points = {}, bars = {};
  document.querySelectorAll('section').forEach(s => {
    svgs[s.id] = Array.from(s.querySelectorAll('.js-plotly-plot')).filter(
      d => d.querySelector('svg.main-svg .cartesianlayer .subplot')).length; });
  document.querySelectorAll('.js-plotly-plot').forEach(d => {
    points[d.id] = d.querySelectorAll('.scatterlayer .points path.point').length;
    bars[d.id] = d.querySelectorAll('.barlayer .point path').length; });
  return {svgs, points, bars,
          rows: document.querySelectorAll('table.sortable tbody tr').length};
}"""


class Browser:
    """One Chromium for many pages."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser

    def open(self, path: Path, width: int = 1400) -> tuple[Any, PageView]:
        """Load ``path`` from file:// and wait for plotly to draw; the page stays open."""
        view = PageView()
        page = self.browser.new_page(viewport={"width": width, "height": 1000})
        page.on("request", lambda r: None if r.url.startswith(LOCAL_SCHEMES)
                else view.requests.append(r.url))  # fmt: skip
        page.on("pageerror", lambda e: view.errors.append(str(e)))
        page.on("console", lambda m: view.errors.append(m.text) if m.type == "error" else None)
        page.goto(path.resolve().as_uri(), wait_until="load")
        page.wait_for_timeout(300)  # plotly draws on load; one tick for the last figure
        counts = page.evaluate(COUNT_JS)
        view.svgs, view.points, view.bars = counts["svgs"], counts["points"], counts["bars"]
        view.table_rows = counts["rows"]
        return page, view


SCREENSHOT_WIDTH = 1280
"""The docs' screenshots: the whole report at this viewport width."""


def screenshot(browser: Browser, report: Path, out: Path) -> tuple[int, int]:
    """Draw ``report`` and save the whole page as the PNG ``out``; its (width, height)."""
    page = browser.browser.new_page(viewport={"width": SCREENSHOT_WIDTH, "height": 1000})
    try:
        page.goto(report.resolve().as_uri(), wait_until="load")
        page.wait_for_timeout(500)
        page.screenshot(path=str(out), full_page=True)
    finally:
        page.close()
    return png_size(out)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; ValueError if ``path`` is no PNG."""
    head = path.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def browser_session() -> Iterator[Browser]:
    """A Playwright-driven system Chromium, or a skip (a failure in CI)."""
    executable = chromium_path()
    if executable is None:
        missing("no system Chromium (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=ARGS)
        try:
            yield Browser(browser)
        finally:
            browser.close()
