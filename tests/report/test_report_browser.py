"""The report of a real stand-in study, opened in a real headless Chromium from file://."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.report.browser import SCREENSHOT_SIZE, Browser, browser_session, png_size, screenshot
from tests.report.conftest import StudyRun
from tuner.report.build import build_report
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
    assert view.table_rows == measured
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
    assert study.trials[int(number.group(1))].user_attrs["key"] in text


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
    values = [float(c) for c in cells]
    assert values == sorted(values) and values[0] < values[-1]


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_pages_of_tiny_studies_load_without_errors(browser: Browser, tmp_path: Path) -> None:
    from tests.report.test_report_data import new_study
    from tests.test_results import SPEC, config, record
    from tuner.outcome import Outcome

    study = new_study(tmp_path)
    empty, _ = build_report(SPEC, results=str(tmp_path), out=tmp_path / "empty.html")
    record(study, SPEC, config(2, 1), Outcome.OK, 3.0, launched=True, duration_s=60.0)
    one, _ = build_report(SPEC, results=str(tmp_path), out=tmp_path / "one.html")
    for path, drawn in ((empty, {"predicted": 2}), (one, {"predicted": 2, "memory": 1})):
        page, view = browser.open(path)
        page.close()
        assert view.problems(drawn) == [], path.name


def test_the_readme_screenshot_is_what_this_browser_draws(
    browser: Browser, report: Path, tmp_path: Path
) -> None:  # fmt: skip
    """The browser that runs these tests takes the README's picture. ``make screenshot`` runs this
    test with TUNER_SCREENSHOT=REPORT.html:OUT.png to retake docs/report.png from the demo."""
    source, out = report, tmp_path / "report.png"
    if os.environ.get("TUNER_SCREENSHOT"):
        given, _, target = os.environ["TUNER_SCREENSHOT"].partition(":")
        source, out = Path(given), Path(target)
    assert screenshot(browser, source, out) == SCREENSHOT_SIZE
    # A drawn page (plots, tables, text) compresses far less than a blank or error page does.
    assert out.stat().st_size > 50_000, f"{out} looks blank ({out.stat().st_size} bytes)"
    committed = Path(__file__).resolve().parents[2] / "docs" / "report.png"
    assert png_size(committed) == SCREENSHOT_SIZE, "docs/report.png is not this browser's view"
