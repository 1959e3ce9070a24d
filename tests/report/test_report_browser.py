"""The report of a real stand-in study, opened in a real headless Chromium from file://."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from tests.report.browser import SCREENSHOT_WIDTH, Browser, browser_session, png_size, screenshot
from tests.report.conftest import StudyRun
from tuner.config.parallel import ParallelConfig
from tuner.config.spelling import spell
from tuner.report.build import build_report
from tuner.report.data import gather
from tuner.report.leaderboard import leaderboard, load_optuna_study

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FIGURES = {"predicted": 2, "pareto": 1, "memory": 1, "time": 2, "progress": 2, "optuna": 2}
"""Figures each section must draw for this study (progress: best so far and payback)."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from browser_session()


@pytest.fixture(scope="module")
def report(study_run: StudyRun) -> Path:
    # The baseline is the slowest measured config, so the payback section has both ends.
    board = leaderboard(study_run.spec, results=str(study_run.results))
    slowest = str(int(board.iloc[-1]["trial"]))
    path, _ = build_report(study_run.spec, results=str(study_run.results), baseline=slowest,
                           train_tokens=1e11)  # fmt: skip
    return path


def test_the_study_has_what_the_sections_show(study_run: StudyRun) -> None:
    rows = leaderboard(study_run.spec, include_all=True, results=str(study_run.results))
    outcomes = set(rows.outcome)
    assert {"ok", "oom"} <= outcomes, outcomes
    assert outcomes - {"ok", "oom", "invalid", "pruned_memory"}, "no failed trial"
    assert (rows[rows.outcome == "ok"].pp > 1).any()


def test_the_page_loads_offline_and_draws_every_section(
    browser: Browser, report: Path, study_run: StudyRun
) -> None:  # fmt: skip
    page, view = browser.open(report)
    page.close()
    assert view.problems(FIGURES) == []
    board = leaderboard(study_run.spec, results=str(study_run.results))
    measured = len(board)
    ooms = int((leaderboard(study_run.spec, include_all=True, results=str(study_run.results))
                .outcome == "oom").sum())  # fmt: skip
    trials = gather(study_run.spec, results=str(study_run.results)).rows
    assert view.table_rows == len(trials) > measured  # every trial, failed ones included
    assert view.points["fig-step_time"] == measured
    assert view.points["fig-peak_memory"] == measured + ooms  # OOMs at their predicted peak
    assert view.points["fig-pareto"] >= measured
    # six components for each pipeline stage of the best config (the figure's first view)
    assert view.bars["fig-stage_memory"] == 6 * int(board.iloc[0].pp)
    assert view.bars["fig-time_breakdown"] == 6 * measured  # five predicted parts + measured
    study = load_optuna_study(study_run.spec, None, str(study_run.results))
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    assert view.points["fig-optuna_history"] >= len(complete)
    assert view.bars["fig-optuna_importances"] >= 1


def test_hovering_a_point_names_its_config(
    browser: Browser, report: Path, study_run: StudyRun
) -> None:  # fmt: skip
    page, view = browser.open(report)
    try:
        point = page.locator("#fig-step_time .scatterlayer .points path.point").first
        point.scroll_into_view_if_needed()
        box = point.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_selector("#fig-step_time .hoverlayer .hovertext", timeout=5000)
        text = page.locator("#fig-step_time .hoverlayer .hovertext").first.text_content() or ""
    finally:
        page.close()
    number = re.search(r"trial (\d+): ok", text)
    assert number, text
    study = load_optuna_study(study_run.spec, None, str(study_run.results))
    config = ParallelConfig(**study.trials[int(number.group(1))].user_attrs["config"])
    assert spell(config) in text  # the compact spelling a person reads (the key is for JSON)


def test_a_page_without_plotly_js_is_caught(
    browser: Browser, report: Path, tmp_path: Path
) -> None:
    """Negative control: the same page with its embedded plotly.js removed must fail the checks
    above (else they could pass on a page that draws nothing)."""
    text = report.read_text()
    broken = re.sub(r'(<script type="text/javascript" id="plotly-js">).*?(</script>)', r"\1\2",
                    text, count=1, flags=re.S)  # fmt: skip
    assert len(broken) < len(text) / 2
    path = tmp_path / "broken.html"
    path.write_text(broken)
    page, view = browser.open(path)
    page.close()
    problems = view.problems(FIGURES)
    assert any("Plotly is not defined" in p for p in problems), problems
    assert any(p.startswith("section predicted: 0 plots") for p in problems), problems


def test_a_cdn_page_is_caught(browser: Browser, report: Path, tmp_path: Path) -> None:
    """Negative control: plotly.js from a CDN is a network request (and draws nothing offline)."""
    text = report.read_text()
    cdn = re.sub(r'<script type="text/javascript" id="plotly-js">.*?</script>',
                 '<script src="https://cdn.plot.ly/plotly-3.0.1.min.js"></script>', text,
                 count=1, flags=re.S)  # fmt: skip
    path = tmp_path / "cdn.html"
    path.write_text(cdn)
    page, view = browser.open(path)
    page.close()
    assert any("cdn.plot.ly" in p for p in view.problems(FIGURES))


def test_the_memory_menu_and_the_leaderboard_sort_work(browser: Browser, report: Path) -> None:
    page, _ = browser.open(report)
    try:
        title = page.locator("#fig-stage_memory .gtitle")
        first = title.text_content() or ""
        page.locator("#fig-stage_memory .updatemenu-header").click()
        page.locator("#fig-stage_memory .updatemenu-dropdown-button").nth(1).click()
        page.wait_for_timeout(300)
        second = title.text_content() or ""
        speed = page.locator("table.sortable th", has_text="tok/s/GPU")
        speed.click()  # ascending: the slowest first
        cells = page.locator("table.sortable tbody tr td:nth-child(4)").all_text_contents()
    finally:
        page.close()
    assert first.startswith("Predicted memory of trial") and second != first, (first, second)
    values = [float(c.replace(",", "")) for c in cells if c.strip()]  # 6,715; failed: none
    assert values == sorted(values) and values[0] < values[-1]
    assert all(c.strip() for c in cells[: len(values)])


MARKUP_REASON = '<a href="javascript:alert(1)">here</a> <b onmouseover="alert(2)">x</b> & <img>'
"""A failure's reason that quotes markup (a program's output may): plotly read hover labels as
its own markup, and made this one a link (a JavaScript error on hovering it among others)."""


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_pages_of_tiny_studies_load_without_errors(browser: Browser, tmp_path: Path) -> None:
    """Also: the OOM of the second page hovers as its reason's text, markup and all."""
    from tests.report.test_report_data import new_study
    from tests.test_results import SPEC, config, record
    from tuner.outcome import Outcome

    study = new_study(tmp_path)
    empty, _ = build_report(SPEC, results=str(tmp_path), out=tmp_path / "empty.html")
    record(study, SPEC, config(2, 1), Outcome.OK, 3.0, launched=True, duration_s=60.0)
    record(study, SPEC, config(2, 2), Outcome.OOM, reason=MARKUP_REASON, launched=True,
           predicted_peak_gib=70.0, duration_s=60.0)  # fmt: skip
    one, _ = build_report(SPEC, results=str(tmp_path), out=tmp_path / "one.html")
    for path, drawn in ((empty, {"predicted": 2}), (one, {"predicted": 2, "memory": 1})):
        page, view = browser.open(path)
        hover = _hover_first(page, "#fig-peak_memory") if path == one else ("", 0)
        page.close()
        assert view.problems(drawn) == [], path.name
    text, links = hover
    assert MARKUP_REASON in text and links == 0, (text, links)


def _hover_first(page: Any, figure: str) -> tuple[str, int]:
    """Hover the first point of ``figure``: its label's text and the links drawn in it."""
    point = page.locator(f"{figure} .scatterlayer .points path.point").first
    point.scroll_into_view_if_needed()
    box = point.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    label = page.locator(f"{figure} .hoverlayer .hovertext").first
    label.wait_for(timeout=5000)
    return label.text_content() or "", page.locator(f"{figure} .hoverlayer a").count()


LAYOUT_JS = """() => ({
  overflow: document.documentElement.scrollWidth - window.innerWidth,
  meta: (document.querySelector('#meta') || {}).textContent || '',
  cards: document.querySelectorAll('.cards .card').length,
  funnel: Array.from(document.querySelectorAll('#funnel tr')).map(r => r.textContent),
  side: document.querySelectorAll('#side-by-side thead a').length,
  wide: Array.from(document.querySelectorAll('body *')).filter(
    e => e.getBoundingClientRect().right > window.innerWidth + 1).map(e => e.tagName).slice(0, 5),
})"""


def test_header_cards_funnel_and_side_by_side_fit_1280_px(
    browser: Browser, report: Path, study_run: StudyRun
) -> None:  # fmt: skip
    page, view = browser.open(report, width=1280)
    try:
        seen = page.evaluate(LAYOUT_JS)
    finally:
        page.close()
    assert view.problems(FIGURES) == []
    assert seen["overflow"] <= 0 and seen["wide"] == [], seen
    spec = study_run.spec
    for fact in (spec.model.name, spec.cluster.gpu, spec.framework, "report written"):
        assert fact in seen["meta"], fact
    assert seen["cards"] >= 4
    data = gather(spec, results=str(study_run.results))
    total = f"{data.space_counts['total']:,}"
    assert seen["funnel"][0] == f"configs in the space{total}", seen["funnel"]
    assert any(f"launched{sum(r.launched for r in data.rows)}" in row for row in seen["funnel"])
    assert seen["side"] == min(3, len(data.measured))


def test_a_failed_trial_has_a_row_and_its_view_opens_with_its_log(
    browser: Browser, report: Path, study_run: StudyRun
) -> None:  # fmt: skip
    data = gather(study_run.spec, results=str(study_run.results))
    failed = next(r for r in data.rows if r.launched and not r.ok)
    page, _ = browser.open(report, width=1280)
    try:
        row = page.locator(f"table.sortable tr.outcome-{failed.outcome}").first
        row_text = row.text_content() or ""
        row.locator("a", has_text="view").click()
        view = page.locator(f"#trial-{failed.number}")
        page.wait_for_timeout(200)
        opened = view.get_attribute("open") is not None and view.is_visible()
        text = view.text_content() or ""
    finally:
        page.close()
    assert failed.outcome in row_text and failed.reason[:40] in row_text
    assert opened, f"trial {failed.number}'s view did not open"
    assert "log tail" in text and "command" in text and "(no log)" not in text


def test_the_docs_screenshots_are_what_this_browser_draws(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:  # fmt: skip
    """The browser that runs these tests takes the docs' pictures. ``make screenshot`` runs this
    test with TUNER_SCREENSHOT="REPORT.html:OUT.png ..." to retake docs/images/ and record the
    template they show (tests/report/screenshots.py)."""
    from tests.report import screenshots

    if not os.environ.get("TUNER_SCREENSHOT"):  # the stand-in study's report (runs it)
        pairs = [(request.getfixturevalue("report"), tmp_path / "report.png")]
    else:
        pairs = [(Path(a), Path(b)) for a, _, b in
                 (p.partition(":") for p in os.environ["TUNER_SCREENSHOT"].split())]  # fmt: skip
    for source, out in pairs:
        width, height = screenshot(browser, source, out)
        assert width == SCREENSHOT_WIDTH and height > 1000, (out, width, height)
        # A drawn page (plots, tables, text) compresses far less than a blank or error page.
        assert out.stat().st_size > 50_000, f"{out} looks blank ({out.stat().st_size} bytes)"
    if os.environ.get("TUNER_SCREENSHOT"):
        screenshots.record()
    for name in screenshots.SHOTS:
        assert png_size(screenshots.IMAGES / name)[0] == SCREENSHOT_WIDTH, name


BROKEN_WORDS_JS = """() => Array.from(document.querySelectorAll('.sortable th')).flatMap(th => {
  const node = th.firstChild, text = node ? node.textContent : '', out = [];
  for (const m of text.matchAll(/\\S+/g)) {
    const range = document.createRange();
    range.setStart(node, m.index);
    range.setEnd(node, m.index + m[0].length);
    const tops = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top)));
    if (tops.size > 1) { out.push(m[0]); }
  }
  return out;
})"""
"""The leaderboard's header words drawn on more than one line (a word broken inside)."""


BROKEN_TOKENS_JS = """() => {
  const out = [], cells = document.querySelectorAll('.sortable td span.config');
  let lines = 0;
  cells.forEach(cell => {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT), tops = new Set();
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.textContent.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const rows = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top)));
        if (rows.size > 1) { out.push(m[0]); }
        rows.forEach(t => tops.add(t));
      }
    }
    lines = Math.max(lines, tops.size);
  });
  const board = document.querySelector('.board');
  return {broken: out, cells: cells.length, lines: lines,
          board_right: board.getBoundingClientRect().right, page: window.innerWidth};
}"""
"""The leaderboard's config tokens (``tp2``, ``mbs8``) drawn on more than one line, the most
lines a config cell took, and where the board's right edge is."""


def test_the_leaderboard_headers_break_only_between_words_at_800_px(
    browser: Browser, report: Path
) -> None:  # fmt: skip
    page, _ = browser.open(report, width=800)
    try:
        broken = page.evaluate(BROKEN_WORDS_JS)
        heads = page.locator("table.sortable th").count()
        configs = page.evaluate(BROKEN_TOKENS_JS)
    finally:
        page.close()
    assert heads >= 10 and broken == [], broken
    # a config wraps between its tokens (tp2 / pp2), never inside one (t / p2); the board
    # scrolls sideways where it must, inside the page
    assert configs["cells"] >= 10 and configs["broken"] == [], configs
    assert configs["board_right"] <= configs["page"], configs
