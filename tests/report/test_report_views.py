"""The parts of the report that explain a study, over small studies written by hand (no browser):
the header, the key figures, the funnel, every trial in the leaderboard, the trial views, the
fastest configs side by side, the heat map's values and the importances' knobs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.report.test_report_data import new_study
from tests.test_results import SPEC, config, record
from tuner.layout import ResultsLayout
from tuner.outcome import Outcome
from tuner.report import figures as F
from tuner.report import units
from tuner.report import views as V
from tuner.report.data import gather
from tuner.space.enumerate import enumerate_space
from tuner.space.trials import distributions

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


def _study(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    record(study, SPEC, config(2, 1), Outcome.OK, 4.0, launched=True, duration_s=600.0)
    record(study, SPEC, config(4, 2), Outcome.OK, 2.0, launched=True, duration_s=600.0)
    record(study, SPEC, config(1, 2), Outcome.OOM, reason="CUDA out of memory on rank 3",
           launched=True, duration_s=60.0)  # fmt: skip
    record(study, SPEC, config(2, 2), Outcome.LAUNCH_ERROR, reason="No module named megatron",
           launched=True, duration_s=5.0)  # fmt: skip
    trial = ResultsLayout(tmp_path, SPEC.name).trial(3)
    trial.node_log(0).parent.mkdir(parents=True, exist_ok=True)
    trial.node_log(0).write_text("".join(f"line {i}\n" for i in range(100)) + "ModuleNotFound\n")
    trial.launch_script(0).write_text("#!/bin/bash\nexec torchrun pretrain_gpt.py --tp 2\n")


def test_the_header_names_the_study(tmp_path: Path) -> None:
    _study(tmp_path)
    text = V.header(gather(SPEC, results=str(tmp_path)))
    for fact in (SPEC.model.name, SPEC.cluster.gpu_name, SPEC.framework, SPEC.search.sampler,
                 f"budget {SPEC.search.n_trials} runs", "report written", "tuner"):  # fmt: skip
        assert fact in text, fact


def test_the_cards_and_the_funnel_count_what_happened(tmp_path: Path) -> None:
    _study(tmp_path)
    data = gather(SPEC, results=str(tmp_path))
    cards = V.cards(data)
    assert "trials launched" in cards and ">4<" in cards and "2 measured, 2 failed" in cards
    assert "+100.0%" in cards  # the best (2 s) against the first pick (4 s)
    counts = enumerate_space(SPEC, with_time=False).counts()
    funnel = V.funnel(data)
    assert f'<td class="num">{counts["total"]:,}</td>' in funnel
    assert f'<td class="num">{counts["viable"]:,}</td>' in funnel
    assert 'launched</th><td class="num">4</td>' in funnel
    assert 'measured</th><td class="num">2</td>' in funnel


def test_measured_trials_stored_without_launch_attributes_count_as_launched(
    tmp_path: Path,
) -> None:
    # As the tests' helpers (and a storage written before "launched" was) leave them: five
    # measured trials with no "launched", one OOM and one still running with it.
    study = new_study(tmp_path)
    for tp, mbs in ((1, 1), (2, 1), (4, 1), (1, 2), (2, 2)):
        record(study, SPEC, config(tp, mbs), Outcome.OK, float(tp + mbs))
    record(study, SPEC, config(4, 2), Outcome.OOM, reason="CUDA out of memory", launched=True)
    running = record(study, SPEC, config(8, 1), None)
    running.set_user_attr("launched", True)
    data = gather(SPEC, results=str(tmp_path))
    cards = V.cards(data)
    assert ">7<" in cards and "5 measured, 1 failed" in cards, cards
    assert 'launched</th><td class="num">7</td>' in V.funnel(data)


def test_peak_gib_has_one_format_measured_or_predicted(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    record(study, SPEC, config(2, 1), Outcome.OK, 2.0, peak_memory_gib=0.08149,
           predicted_peak_gib=0.081)  # fmt: skip
    data = gather(SPEC, results=str(tmp_path))
    board, side = V.leaderboard(data), V.side_by_side(data)
    for table in (board, side):
        assert "<td>0.0815</td>" in table or ">0.0815</td>" in table, table
        assert ">0.0810</td>" in table and ">0.08149<" not in table and ">0.081<" not in table
    assert units.gib(0.081) == "0.0810" and units.gib(61.27) == "61.3"


def test_on_off_knobs_read_on_and_off_side_by_side(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    record(study, SPEC, config(2, 1), Outcome.OK, 2.0)  # sequence parallel on (tp 2)
    record(study, SPEC, config(1, 1), Outcome.OK, 3.0)  # and off (tp 1)
    side = V.side_by_side(gather(SPEC, results=str(tmp_path)))
    assert "True" not in side and "False" not in side
    assert "<th>sequence_parallel</th>" in side
    row = side.split("<th>sequence_parallel</th>")[1].split("</tr>")[0]
    assert ">on</td>" in row and ">off</td>" in row, row


def test_every_trial_is_in_the_leaderboard_with_its_reason_and_view(tmp_path: Path) -> None:
    _study(tmp_path)
    data = gather(SPEC, results=str(tmp_path))
    board = V.leaderboard(data)
    assert board.count("<tr class=") == 4
    assert [r.number for r in V.board_rows(data)] == [1, 0, 2, 3]  # fastest, then the failed
    assert "CUDA out of memory on rank 3" in board and "No module named megatron" in board
    for n in range(4):
        assert f'href="#trial-{n}"' in board
    assert V.badge("oom") in board and F.OUTCOME_COLOURS["oom"] in V.badge("oom")
    # the first column is the trial's number, headed so: "#" over 1, 0, 2, 3 read as a rank
    assert board.split("<thead><tr>")[1].startswith("<th>trial</th><th>outcome</th>")
    assert "<th>#</th>" not in board


def test_a_trial_view_shows_its_command_breakdowns_and_log_tail(tmp_path: Path) -> None:
    _study(tmp_path)
    views = V.trial_views(gather(SPEC, results=str(tmp_path)))
    failed = views[views.index('id="trial-3"') :]
    assert "exec torchrun pretrain_gpt.py --tp 2" in failed
    assert "ModuleNotFound" in failed and "line 99" in failed and "line 70\n" not in failed
    assert "predicted memory</b>: stage" in failed and "compute" in failed
    assert views.count("<details") == 4


def test_the_fastest_configs_side_by_side(tmp_path: Path) -> None:
    _study(tmp_path)
    table = V.side_by_side(gather(SPEC, results=str(tmp_path)))
    assert table.index('href="#trial-1"') < table.index('href="#trial-0"')
    assert '<td class="diff">4</td>' in table  # tp differs: marked
    assert "<th>predicted compute s</th>" in table


def test_the_heat_map_shows_its_values(tmp_path: Path) -> None:
    _study(tmp_path)
    heat = F.tp_pp_heatmap(gather(SPEC, results=str(tmp_path))).data[0]
    assert heat.texttemplate == "%{z:.4g}"


def test_importances_only_over_searched_knobs_and_enough_trials(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    for i, (tp, mbs) in enumerate([(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2), (8, 1)]):
        record(study, SPEC, config(tp, mbs), Outcome.OK, 1.0 + i, launched=True)
    figures, note = F.optuna_views(gather(SPEC, results=str(tmp_path)))
    assert [n for n, _ in figures] == ["optuna_history"]
    assert f"7 completed trials, {F.MIN_IMPORTANCE_TRIALS} needed" in note
    record(study, SPEC, config(8, 2), Outcome.OK, 9.0, launched=True)
    figures, note = F.optuna_views(gather(SPEC, results=str(tmp_path)))
    assert note == "" and [n for n, _ in figures] == ["optuna_history", "optuna_importances"]
    searched = F.searched_params(study.get_trials())
    fixed = {n for n, d in distributions(SPEC).items() if len(getattr(d, "choices", ())) == 1}
    assert searched and fixed and not fixed & set(searched)
    shown = set(figures[1][1].data[0].y)
    assert shown and shown <= set(searched)


def test_a_person_reads_the_compact_spelling_and_machines_the_key(tmp_path: Path) -> None:
    """The leaderboard and trial views show ``tp4 pp2 ...``; the long key is only a tooltip."""
    import re

    from tuner.config.spelling import spell

    _study(tmp_path)
    data = gather(SPEC, results=str(tmp_path))
    html = str(V.leaderboard(data)) + str(V.trial_views(data))
    visible = " ".join(re.sub(r"<[^>]*>", " ", html).split())  # text only: no tooltip
    assert "tp=" not in visible
    for row in data.rows:
        if row.config is not None:
            assert spell(row.config) in visible
            assert f'title="{row.key}"' in html


def _tail_of_last_64k(path: Path, lines: int) -> str:
    data = path.read_bytes()[-V.TAIL_BYTES :]
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


@pytest.mark.parametrize(
    "text",
    [
        "",
        "one line, no newline",
        "".join(f"iteration {i} | loss 2.0\n" for i in range(5)),
        "".join(f"iteration {i} | loss 2.0 é€\r\n" for i in range(3000)),  # cut inside a char
        "".join(f"{i} " + "x" * 900 + "\n" for i in range(60)),  # 8 KiB holds 9 lines only
        "".join(f"{i:3d}" + "w" * 326 + "\n" for i in range(60)),  # 24 lines and a cut one
        "y" * 200_000 + "\n" + "".join(f"last {i}\n" for i in range(10)),  # a long first line
        "z" * 70_000,  # no newline at all
    ],
)
def test_a_log_tail_is_the_last_lines_of_its_last_64_kib(tmp_path: Path, text: str) -> None:
    log = tmp_path / "node0.log"
    log.write_text(text, encoding="utf-8", newline="")
    assert V._tail(log, V.LOG_TAIL_LINES) == _tail_of_last_64k(log, V.LOG_TAIL_LINES)
    assert V._tail(tmp_path / "missing.log", 5) == ""


def test_the_point_traces_unchecked_are_the_checked_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-trial traces skip plotly's item-by-item check (``figures.points``); each figure
    they are in has the JSON plotly's checked construction gives (a list plotly would have
    coerced, a numpy array say, fails this)."""
    study = new_study(tmp_path)
    for i, (tp, pp) in enumerate(((2, 1), (4, 2), (1, 2), (2, 2))):
        predicted = {"predicted_step_s": 1.5 + i, "predicted_peak_gib": 40 + 3 * i,
                     "launched": True, "duration_s": 60.0}  # fmt: skip
        if i != 1:  # the stated sds, which draw the bars (trial 1 was stored without them)
            predicted |= {"predicted_step_sd": 0.12, "predicted_peak_sd": 0.05}
        if i == 2:
            record(study, SPEC, config(tp, pp), Outcome.OOM, **predicted)
        else:  # an int peak too: plotly keeps it an int, checked or not
            peak = 50 if i == 3 else 45.5 + i
            record(study, SPEC, config(tp, pp), Outcome.OK, 3.0 - i / 2, peak_memory_gib=peak,
                   **predicted)  # fmt: skip
    data = gather(SPEC, results=str(tmp_path))
    drawn = (F.step_time, F.peak_memory, F.pareto, F.progress)
    fast = [f(data).to_json() for f in drawn]
    monkeypatch.setattr(F, "FAST_POINTS", False)
    checked = [f(data) for f in drawn]
    assert fast == [f.to_json() for f in checked]
    assert sum(len(t.x) for fig in checked for t in fig.data if t.mode == "markers") == 10


def test_each_prediction_carries_its_stated_band(tmp_path: Path) -> None:
    """The predicted-vs-measured points carry each prediction's stated 90% band as an x bar
    (log-normal: wider above than below); a point is inside its band exactly when its bar
    reaches y = x; a trial stored without its sd has no bar."""
    from tuner.models.uncertainty import band, inside

    study = new_study(tmp_path)
    cases = ((2, 1, 2.0, 2.1, 0.1), (4, 2, 2.0, 3.0, 0.1), (1, 2, 3.0, 3.2, None))
    for tp, pp, predicted, measured, sd in cases:
        attrs: dict[str, object] = {"predicted_step_s": predicted, "launched": True}
        if sd is not None:
            attrs["predicted_step_sd"] = sd
        record(study, SPEC, config(tp, pp), Outcome.OK, measured, **attrs)
    data = gather(SPEC, results=str(tmp_path))
    (trace,) = [t for t in F.step_time(data).data if t.mode == "markers"]
    bars = trace.error_x
    assert not bars.symmetric
    for x, y, up, down, (_, _, predicted, measured, sd) in zip(
        trace.x, trace.y, bars.array, bars.arrayminus, cases, strict=True
    ):
        assert (x, y) == (predicted, measured)
        if sd is None:
            assert up == down == 0
            continue
        low, high = band(predicted, sd)
        assert (x - down, x + up) == pytest.approx((low, high)) and up > down > 0
        assert (x - down <= y <= x + up) == inside(measured, predicted, sd)
    assert [inside(m, p, sd) for _, _, p, m, sd in cases[:2]] == [True, False]


def test_the_summary_leaves_out_a_figure_the_logs_lack(tmp_path: Path) -> None:
    """DeepSpeed logs no TFLOP/s: the demo's report showed a "TFLOP/s/GPU" row with nothing in
    it, beside the MFU the tuner computes. A figure no trial has is left out of the summary."""
    import re

    from tuner.report.page import _summary

    _study(tmp_path)  # trials with a step and tokens/s, no TFLOP/s and no MFU
    tables = "".join(str(t) for t in _summary(gather(SPEC, results=str(tmp_path))).tables)
    rows = dict(re.findall(r"<tr><th>([^<]*)</th><td>([^<]*)</td></tr>", tables))
    assert rows["tokens/s/GPU"] and rows["measured step"].strip() != "s"
    assert "TFLOP/s/GPU" not in rows and "MFU" not in rows
    assert [k for k, v in rows.items() if not v.strip()] == []


def test_rates_steps_and_hours_read_as_the_terminal_tables_print_them(tmp_path: Path) -> None:
    """Tokens/s in the cards, the board, the summary and side by side is ``16,384`` (units.rate),
    never ``1.638e+04``; the search's wall time and GPU-hours never in exponent form."""
    from tuner.report.page import sections

    study = new_study(tmp_path)
    record(study, SPEC, config(2, 1), Outcome.OK, 2.0, launched=True, duration_s=0.2)
    record(study, SPEC, config(1, 1), Outcome.OK, 4.0, launched=True, duration_s=0.3)
    data = gather(SPEC, results=str(tmp_path))
    best = data.best
    assert best is not None and best.tokens_per_s_per_gpu == 16384.0
    summary = str(sections(data)[0].tables[0])
    parts = {"cards": str(V.cards(data)), "board": str(V.leaderboard(data)),
             "side": str(V.side_by_side(data)), "summary": summary}  # fmt: skip
    exponent = re.compile(r"\d[eE][+-]\d")  # 1.638e+04, 9.5e-05
    for name, text in parts.items():
        assert "16,384" in text and not exponent.search(text), (name, text)
    views = str(V.trial_views(data))  # the predicted step's parts in seconds, as the tables
    assert "predicted step (s)</b>: compute " in views and not exponent.search(views), views
    assert f"{units.duration(data.wall_s)} wall" in parts["cards"]
    assert units.gpu_hours(data.gpu_hours) in parts["cards"] and " h wall" not in parts["cards"]


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0.3, "0.3 s"), (0.034, "0.034 s"), (12.0, "12 s"), (90.0, "1.5 min"), (720.0, "12 min"),
     (3569.0, "59 min"), (5040.0, "1.4 h"), (0.0, "0 s"), (0.00009, "under 0.001 s")],
)  # fmt: skip
def test_a_wall_time_reads_in_seconds_minutes_or_hours(seconds: float, said: str) -> None:
    assert units.duration(seconds) == said
