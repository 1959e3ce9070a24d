"""What the figures draw past a person's reading (``tuner.report.shown``): every trial up to
the limit, each config's spread and the named trials past it, one menu entry per config, and
the same best-so-far line from fewer markers."""

from __future__ import annotations

import random
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.report.test_report_fast_paths import _study as _fast_paths_study
from tests.test_results import SPEC, config
from tuner.report import figures as F
from tuner.report import page as P
from tuner.report import shown as S
from tuner.report import views as V
from tuner.report.data import TrialRow, gather

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


def _row(number: int, tp: int, mbs: int, outcome: str = "ok", tokens: float | None = None,
         peak: float | None = None, predicted_peak: float = 40.0) -> TrialRow:  # fmt: skip
    step = 64 * 4096 / tokens / 8 if tokens else None
    return TrialRow(
        number=number, outcome=outcome, config=config(tp, mbs), reason="", launched=True,
        predicted_step_s=1.0, measured_step_s=step, predicted_peak_gib=predicted_peak,
        measured_peak_gib=peak, tokens_per_s_per_gpu=tokens, tflops_per_gpu=None, mfu=None,
        gpu_hours=1.0, start=None, end=None,
    )  # fmt: skip


def _study(n: int, seed: int = 0) -> list[TrialRow]:
    rng = random.Random(seed)
    shapes = [(tp, mbs) for tp in (1, 2, 4) for mbs in (1, 2)]
    rows = []
    for i in range(n):
        tp, mbs = shapes[i % len(shapes)]
        if i % 9 == 4:
            rows.append(_row(i, tp, mbs, "oom", predicted_peak=30.0 + rng.random()))
        else:
            rows.append(_row(i, tp, mbs, tokens=1000.0 * tp + rng.uniform(-50, 50),
                             peak=40.0 + mbs + rng.random()))  # fmt: skip
    return rows


def test_a_scatter_within_the_limit_draws_every_trial() -> None:
    rows = _study(50)
    assert S.spread(rows, lambda r: r.tokens_per_s_per_gpu, limit=50) == rows


def test_past_the_limit_each_configs_lowest_middle_and_highest_and_the_named() -> None:
    rows = _study(500)

    def y(r: TrialRow) -> float | None:
        return r.tokens_per_s_per_gpu

    kept = S.spread(rows, y, named={7, 8}, limit=100)
    assert kept == [r for r in rows if r in kept]  # the rows' order
    assert {7, 8} <= {r.number for r in kept}
    for key in {(r.key, r.outcome) for r in rows}:
        group = [r for r in rows if (r.key, r.outcome) == key]
        values = sorted(S._value(y(r)) for r in group)
        drawn = sorted(S._value(y(r)) for r in kept if (r.key, r.outcome) == key
                       and r.number not in (7, 8))  # fmt: skip
        assert drawn[0] == values[0] and drawn[-1] == values[-1]  # the spread's ends
        assert values[(len(values) - 1) // 2] in drawn
    assert len(kept) <= 3 * 12 + 2
    assert S.left_out(len(kept), len(rows)).startswith(f"{len(kept):,} of 500 trials drawn")
    assert S.left_out(500, 500) == ""


def test_the_memory_menu_is_one_entry_per_config_fastest_front_and_the_lowest_ooms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(S, "MENU_BEST", 2)
    monkeypatch.setattr(S, "MENU_OOMS", 1)
    rows = [
        _row(0, 4, 1, tokens=4000, peak=70), _row(1, 4, 1, tokens=4100, peak=69),
        _row(2, 2, 1, tokens=3000, peak=50), _row(3, 1, 2, tokens=2000, peak=60),
        _row(4, 1, 1, tokens=1500, peak=30),  # the front's (the least memory)
        _row(5, 2, 2, "oom", predicted_peak=60), _row(6, 2, 1, "oom", predicted_peak=20),
        _row(7, 4, 2, "oom", predicted_peak=50),
    ]  # fmt: skip
    measured = sorted([r for r in rows if r.ok], key=lambda r: -(r.tokens_per_s_per_gpu or 0))
    menu = S.menu_rows(measured, rows)
    # trial 1 stands for tp4 mbs1 (its fastest), trial 2 is second; trial 3 (slower than
    # trial 2 with more memory) is not on the front; trial 6's config (trial 2's) is in
    # the menu already, and trial 7 (50 GiB predicted) comes before trial 5 (60)
    assert [r.number for r in menu] == [1, 2, 4, 7]
    assert len({r.key for r in menu}) == len(menu)


def _line(xs: list[Any], ys: list[Any], at: float) -> float:
    """The value of a ``hv`` step line through (xs, ys) at ``at``."""
    return float([y for x, y in zip(xs, ys, strict=True) if x <= at][-1])


def test_the_best_so_far_line_past_the_limit_is_the_same_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = _study(400, seed=3)
    data: Any = SimpleNamespace(rows=rows)
    full = F.progress(data)
    monkeypatch.setattr(F, "MAX_POINTS", 100)
    thin = F.progress(data)
    for before, after in zip(full.data, thin.data, strict=True):
        assert len(after.x) < len(before.x) / 10
        assert (after.x[0], after.x[-1]) == (before.x[0], before.x[-1])
        for x, y in zip(before.x, before.y, strict=True):
            assert _line(list(after.x), list(after.y), x) == y
    assert "raised the best" in thin.layout.title.text
    assert thin.layout.margin.t > full.layout.margin.t  # its second line clear of the subplots'


def _past_a_limit_of_ten(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 48-trial study past the limits: 10 trials, one config in the memory menu and the
    figures' bars, no OOM there, one config side by side (so most configs are not drawn)."""
    monkeypatch.setattr(V, "MAX_POINTS", 10)
    monkeypatch.setattr(S, "MENU_BEST", 1)
    monkeypatch.setattr(S, "MENU_OOMS", 0)
    monkeypatch.setattr(F, "MAX_BARS", 1)
    monkeypatch.setattr(V, "SIDE_BY_SIDE", 1)


def test_past_the_limit_a_view_of_a_config_not_drawn_gives_the_screened_prediction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the limit, the views of the configs the figures break down keep their parts and
    the others give the recorded predicted peak (with its stage and phase) and step; within
    it, every view has its parts."""
    _fast_paths_study(tmp_path)
    data = gather(SPEC, results=str(tmp_path))
    within = P.render(data, P.sections(data))
    assert "as screened" not in within and within.count("optimizer states") >= 48
    _past_a_limit_of_ten(monkeypatch)
    data = gather(SPEC, results=str(tmp_path))
    page = P.render(data, P.sections(data))
    views = {int(n): v for n, v in re.findall(r'id="trial-(\d+)">(.*?)</details>', page, re.S)}
    assert len(views) == len(data.rows)
    broken_down = {r.number for r in data.rows if data.has_breakdowns(r)}
    assert broken_down and set(views) - broken_down
    for r in data.rows:
        view = views[r.number]
        if r.number in broken_down:
            assert "optimizer states" in view and "as screened" not in view
        else:
            peak = f"peak {V.fmt_gib(r.predicted_peak_gib)} GiB (stage 1, fwd_bwd), as screened"
            assert peak in view and f"{V.fmt_s(r.predicted_step_s)}, as screened" in view
    assert "Past 10 trials" in page and "tune estimate --study" in page


def test_past_the_limit_a_measured_view_of_a_config_not_drawn_links_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the limit, a measured trial of a config no figure draws links node 0's script and
    log (relative to the page, resolving to the files) instead of carrying their tails; a
    failed trial and the drawn configs' trials keep their tails, and so does every view
    within the limit."""
    from tuner.layout import ResultsLayout
    from tuner.report.build import build_report

    _fast_paths_study(tmp_path)
    layout = ResultsLayout(tmp_path, SPEC.name)
    for n in range(48):
        paths = layout.trial(n)
        paths.node_log(0).parent.mkdir(parents=True, exist_ok=True)
        paths.node_log(0).write_text(f"log of trial {n}\n")
        paths.launch_script(0).write_text(f"#!/bin/bash\necho trial {n}\n")
    out = tmp_path / "pages" / "report.html"

    def views() -> dict[int, str]:
        build_report(SPEC, results=str(tmp_path), out=out)
        found = re.findall(r'id="trial-(\d+)">(.*?)</details>', out.read_text(), re.S)
        return {int(n): v for n, v in found}

    assert all(f"log of trial {n}" in v for n, v in views().items())
    _past_a_limit_of_ten(monkeypatch)
    data = gather(SPEC, results=str(tmp_path))
    P.sections(data)  # the configs the figures draw, as the report finds them
    linked = {r.number for r in data.rows if r.ok and not data.has_breakdowns(r)}
    embedded = {r.number for r in data.rows} - linked
    assert linked and any(not r.ok for r in data.rows if r.number in embedded)
    found = views()
    for n in linked:
        hrefs = re.findall(r'href="([^"]+)"', found[n])
        assert len(hrefs) == 2 and f"log of trial {n}" not in found[n], found[n]
        assert all((out.parent / h).is_file() for h in hrefs)
        assert (out.parent / hrefs[1]).read_text() == f"log of trial {n}\n"
    for n in embedded:
        assert f"log of trial {n}" in found[n] and "href" not in found[n]
