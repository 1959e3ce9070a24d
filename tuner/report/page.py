"""The report page: sections, the summary and leaderboard tables, one offline HTML file.

plotly.js is embedded once, in the page's head (no CDN: the file works opened by double-click,
with no network); every figure is a div drawn by it.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import plotly.graph_objects as go
from jinja2 import Environment
from markupsafe import Markup

from tuner.report import figures as F
from tuner.report import units
from tuner.report import views as V
from tuner.report.data import ReportData

PLOT_CONFIG = {"displaylogo": False, "responsive": True}


@dataclass(slots=True)
class Section:
    """One numbered section of the page."""

    id: str
    title: str
    intro: str = ""
    tables: list[Markup] = field(default_factory=list)
    figures: list[tuple[str, go.Figure]] = field(default_factory=list)
    note: str = ""


def _kv(pairs: list[tuple[str, str]]) -> Markup:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                   for k, v in pairs)  # fmt: skip
    return Markup(f'<table class="kv">{rows}</table>')


def payback_plan(data: ReportData) -> dict[str, float] | None:
    """GPU-hours of the full run with the best config vs the baseline, hours saved and the
    training tokens at which the search has paid for itself; None without both measured or
    without the training run's length (``--train-tokens``): a payback on an assumed length would
    be a number about nothing."""
    best, base = data.best, data.baseline
    if best is None or base is None or not best.tokens_per_s_per_gpu or not data.train_tokens:
        return None
    tokens = data.train_tokens
    found = tokens / best.tokens_per_s_per_gpu / 3600
    baseline = tokens / (base.tokens_per_s_per_gpu or best.tokens_per_s_per_gpu) / 3600
    saved_per_token = (baseline - found) / tokens
    return {
        "train_tokens": tokens, "found_gpu_hours": found, "baseline_gpu_hours": baseline,
        "saved_gpu_hours": baseline - found, "search_gpu_hours": data.gpu_hours,
        "break_even_tokens": data.gpu_hours / saved_per_token if saved_per_token > 0 else math.inf,
        "baseline_trial": base.number,
    }  # fmt: skip


def _summary(data: ReportData) -> Section:
    best, first = data.best, data.first_pick
    pairs: list[tuple[str, str]] = []
    if best is not None:  # a figure its logs lack (DeepSpeed's TFLOP/s) is left out, not empty
        figures = [
            ("tokens/s/GPU", V.fmt_rate(best.tokens_per_s_per_gpu)),
            ("TFLOP/s/GPU", V.fmt(best.tflops_per_gpu)),
            ("MFU", V.pct(best.mfu)),
        ]
        pairs += [
            ("best measured config", f"trial {best.number}: {best.label}"),
            *data.launch_args(best),
            ("full launch script",
             f"tune best {data.spec.command_args(data.results)} --emit script"),
            *((k, v) for k, v in figures if v),
            ("measured step", f"{V.fmt_s(best.measured_step_s)} s"),
        ]  # fmt: skip
    if first is not None:
        gap = ""
        if best is not None and first.ok and first.tokens_per_s_per_gpu:
            slower = (best.tokens_per_s_per_gpu or 0) / first.tokens_per_s_per_gpu - 1
            gap = f"; the best is {100 * slower:.1f}% faster"
        elif not first.ok:
            gap = f"; it measured nothing ({(first.reason or first.outcome)[:160]})"
        pairs.append(("model's first pick", f"trial {first.number}: {first.label}{gap}"))
    counts = ", ".join(f"{k} {v}" for k, v in data.outcome_counts().items()) or "none"
    pairs += [("trials by outcome", counts),
              ("search wall time", units.duration(data.wall_s)),
              ("GPU-hours spent", units.gpu_hours(data.gpu_hours))]  # fmt: skip
    note = "" if best is not None else "No trial has measured a step time yet."
    return Section("summary", "Summary", tables=[_kv(pairs)], note=note)


def _leaderboard(data: ReportData) -> Section:
    return Section("leaderboard", "Leaderboard",
                   intro="Every trial: the measured ones fastest first, then the others with "
                   "their outcome and reason. Click a column to sort, 'view' for the trial.",
                   tables=[V.leaderboard(data)])  # fmt: skip


def _explain(data: ReportData) -> list[Section]:
    return [
        Section("funnel", "From the space to the measured configs",
                intro="Every combination of the study's knobs, the framework's rules, the "
                "memory model's pruning, and what was launched and measured.",
                tables=[V.funnel(data)]),
        _leaderboard(data),
        Section("side", "The fastest configs side by side",
                intro="Cells that differ between the configs are marked.",
                tables=[V.side_by_side(data)],
                note="" if data.measured else "No measured config to compare yet."),
    ]  # fmt: skip


def _hours(value: float) -> str:
    """GPU-hours to a tenth, in exponent form past 10^12 (``--train-tokens 1e308`` wrote
    300 digits)."""
    return f"{value:,.1f}" if abs(value) < 1e12 else f"{value:.4g}"


def _break_even(tokens: float) -> str:
    """The training tokens after which the search paid for itself; never where the found
    config saves nothing over the baseline (the baseline itself: it read "inf training
    tokens")."""
    if math.isfinite(tokens):
        return f"{tokens:.3g} training tokens"
    return "never: the found config saves nothing over the baseline"


def _payback(data: ReportData) -> Section:
    section = Section("progress", "Search progress and payback", figures=[
        ("progress", F.progress(data))])  # fmt: skip
    plan = payback_plan(data)
    notes = []
    if data.best is None or data.baseline is None:
        notes.append("Payback needs a measured best config and a measured baseline.")
    if not data.train_tokens:
        notes.append("Payback is left out: it needs the full training run's length "
                     f"(tune report --study {data.spec.study_arg} --train-tokens N).")  # fmt: skip
    if plan is None:
        section.note = " ".join(notes)
        return section
    base = "--baseline" if data.baseline_request else "the model's first pick"
    section.tables.append(_kv([
        ("training tokens", f"{plan['train_tokens']:.4g}"),
        ("baseline", f"trial {int(plan['baseline_trial'])} ({base})"),
        ("GPU-hours with the found config", _hours(plan["found_gpu_hours"])),
        ("GPU-hours with the baseline", _hours(plan["baseline_gpu_hours"])),
        ("GPU-hours saved", _hours(plan["saved_gpu_hours"])),
        ("GPU-hours the search cost", f"{plan['search_gpu_hours']:,.3g}"),
        ("break-even after", _break_even(plan["break_even_tokens"])),
    ]))  # fmt: skip
    section.figures.append(("payback", F.payback(data, plan)))
    return section


def sections(data: ReportData) -> list[Section]:
    """Every section of the page, in order."""
    optuna_figures, optuna_note = F.optuna_views(data)
    return [
        _summary(data),
        *_explain(data),
        Section("predicted", "Predicted vs measured",
                intro=f"{F.BAND_NOTE} Real OOMs are drawn at their predicted peak, at the "
                "GPU's capacity.",
                figures=[("step_time", F.step_time(data)), ("peak_memory", F.peak_memory(data))]),
        Section("pareto", "Pareto front", figures=[("pareto", F.pareto(data))]),
        Section("memory", "Memory per stage",
                intro="The memory model predicts the most loaded pipeline stage (the larger of "
                "the first and the last); that stage is the bar shown. Pick a trial in the menu.",
                figures=[("stage_memory", F.stage_memory(data))]),
        Section("time", "Where the time goes",
                intro="Predicted by the time model (tuner.models.time.estimate) beside the "
                "measured step.",
                figures=[("time_breakdown", F.time_breakdown(data)),
                         ("tp_pp_heatmap", F.tp_pp_heatmap(data))]),
        _payback(data),
        Section("optuna", "Optuna views", figures=optuna_figures, note=optuna_note),
        Section("trials", "Trials",
                intro="One per trial: its reason, the command node 0 ran, the predicted memory "
                "and time, and the tail of its log." + V.screened_note(data),
                tables=[V.trial_views(data)]),
    ]  # fmt: skip


def _figure_html(name: str, fig: go.Figure) -> Markup:
    return Markup(fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{name}",
                              config=PLOT_CONFIG))  # fmt: skip


def render(data: ReportData, parts: list[Section]) -> str:
    """The whole page."""
    from plotly.offline import get_plotlyjs

    source = resources.files("tuner.report").joinpath("page.html.j2").read_text()
    template = Environment(autoescape=True).from_string(source)
    context: dict[str, Any] = {
        "study": data.spec.name,
        "header": V.header(data),
        "cards": V.cards(data),
        "plotly_js": Markup(get_plotlyjs()),
        "sections": [(s, [_figure_html(n, f) for n, f in s.figures]) for s in parts],
    }
    return template.render(**context)
