"""The report's plotly figures, one function each, built from :class:`ReportData`.

Every point of a trial carries the trial's hover text (config, number, outcome, reason).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Container, Sequence
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState
from plotly.graph_objs.layout import Template
from plotly.subplots import make_subplots

from tuner.models.uncertainty import BAND_LEVEL, band
from tuner.report.data import MEMORY_PARTS, MOE_FP8_TIME_PARTS, TIME_PARTS, ReportData, TrialRow
from tuner.report.importances import plot_param_importances
from tuner.report.shown import MAX_POINTS, left_out, memory_x, menu_rows, pareto_front, spread
from tuner.report.template import checked_props

BAND_NOTE = (
    f"Bars: each prediction's stated {BAND_LEVEL:.0%} band (where the model said the "
    "measurement would fall); a point whose bar crosses y = x was inside it."
)
"""How the predicted-vs-measured plots' bars read (the page says it above them)."""

MAX_BARS = 40
"""Configs in the where-the-time-goes bars (the fastest ones)."""

OUTCOME_COLOURS = {
    "ok": "#2ca02c", "oom": "#d62728", "pruned_memory": "#ff9896", "invalid": "#c7c7c7",
    "timeout": "#9467bd", "hang": "#8c564b", "nccl_timeout": "#e377c2",
    "launch_error": "#7f7f7f", "no_metrics": "#bcbd22", "diverged": "#17becf",
    "node_error": "#aec7e8", "interrupted": "#ffbb78",
}  # fmt: skip
"""One colour per outcome, in every figure and table of the report."""

MIN_IMPORTANCE_TRIALS = 8
"""Completed trials before parameter importances are drawn: fewer say nothing about a knob."""
PART_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
HOVER = "%{text}<br>%{xaxis.title.text}: %{x:.4g}<br>%{yaxis.title.text}: %{y:.4g}<extra></extra>"

Figures = list[tuple[str, go.Figure]]


def _layout(
    fig: go.Figure, title: str, x: str, y: str, drawn: tuple[int, int] = (0, 0), **kw: Any
) -> go.Figure:
    """The figures' common layout; ``drawn``: (trials drawn, of how many), said under the title
    when some were left out (:func:`tuner.report.shown.spread`)."""
    if words := left_out(*drawn):
        title = f"{title}<br><sup>{words}</sup>"
    top = 90 if "<br>" in title else 60  # a second line clear of the subplots' titles
    return styled(fig, title=title, xaxis_title=x, yaxis_title=y, template="plotly_white",
                  height=460, margin={"t": top, "r": 20}, **kw)  # fmt: skip


def _by_outcome(
    fig: go.Figure, rows: Sequence[TrialRow], x: Callable[[TrialRow], float | None],
    y: Callable[[TrialRow], float | None], symbol: str = "circle", suffix: str = "",
    sd: Callable[[TrialRow], float | None] | None = None,
) -> None:  # fmt: skip
    """One scatter trace per outcome; with ``sd``, each point's x carries the prediction's
    stated band as a horizontal bar (:func:`band_bars`)."""
    groups: dict[str, list[TrialRow]] = {}
    for r in rows:
        if x(r) is not None and y(r) is not None:
            groups.setdefault(r.outcome, []).append(r)
    for outcome, group in groups.items():
        colour = OUTCOME_COLOURS.get(outcome, "#333")
        extra = {} if sd is None else {"error_x": band_bars(
            [x(r) or 0.0 for r in group], [sd(r) for r in group], colour)}  # fmt: skip
        add_points(fig, points(
            x=[x(r) for r in group], y=[y(r) for r in group], mode="markers",
            name=outcome + suffix, text=[r.hover for r in group], hovertemplate=HOVER,
            marker={"color": colour, "size": 9, "symbol": symbol}, **extra,
        ))  # fmt: skip


def band_bars(
    predicted: Sequence[float], sds: Sequence[float | None], colour: str
) -> dict[str, Any]:
    """Asymmetric x error bars spanning each prediction's stated band
    (:func:`tuner.models.uncertainty.band`: log-normal, so wider above than below); a
    prediction stored without its sd gets none."""
    lows, highs = [], []
    for value, sd in zip(predicted, sds, strict=True):
        low, high = band(value, sd) if sd else (value, value)
        lows.append(value - low)
        highs.append(high - value)
    return {"type": "data", "symmetric": False, "array": highs, "arrayminus": lows,
            "color": colour, "thickness": 1.2, "width": 3}  # fmt: skip


def points(**properties: Any) -> go.Scatter:
    """A scatter trace of one point per trial, not checked property by property: plotly walks
    every item of every list it is given (``to_scalar_or_list``, to turn numpy values into
    Python ones), a tenth of a second per figure at 10,000 trials. What this module passes
    is Python floats and strings already, and the trace's JSON is the checked one's
    (``tests/report/test_report_views.py`` compares them on each figure)."""
    if not FAST_POINTS:
        return go.Scatter(**properties)
    # The nested properties (marker, error bars) checked: plotly writes a checked object's
    # keys in its own order, an unchecked dict's in the caller's.
    nested = {k: v for k, v in properties.items() if isinstance(v, dict)}
    checked = go.Scatter(**nested)
    return go.Scatter(_validate=False, **(properties | {k: checked[k] for k in nested}))


FAST_POINTS = True
"""False: every trace and template checked by plotly (what the test compares against)."""


def styled(fig: go.Figure, **layout: Any) -> go.Figure:
    """``fig.update_layout(**layout)``, ``layout`` naming ``template="plotly_white"`` (in its
    place: the layout's keys are written in the order they are set), the template a copy of one
    plotly made once: plotly copies a named template for each figure by rebuilding it, checked
    (its ``__reduce__``: 11 ms a figure, a tenth of a second for the page's nine). The copy's
    properties (its keys in plotly's order: :mod:`tuner.report.template`, kept as JSON) are
    read once and each figure gets a plain deep copy of them, unchecked; the template
    validator (one object, shared by every layout: plotly's cache of validators) is told so for
    this one call. The figure's JSON is the checked one's
    (``tests/report/test_report_fast_paths.py``)."""
    if not FAST_POINTS:
        return fig.update_layout(**layout)
    validator = fig.layout._get_validator("template")
    validator.validate_coerce = _template_copy
    try:
        return fig.update_layout(**layout)
    finally:
        del validator.validate_coerce  # the class's method again


@functools.cache
def _checked_props() -> dict[str, Any]:
    return checked_props()  # what plotly's validator makes of it (kept: tuner.report.template)


def _template_copy(value: object, skip_invalid: bool = False) -> Template:
    assert value == "plotly_white", value  # the one template this module names
    return Template(copy.deepcopy(_checked_props()), _validate=False)


def add_points(fig: go.Figure, trace: go.Scatter, **where: Any) -> None:
    """``fig.add_trace(trace, **where)`` for a :func:`points` trace, which plotly's
    ``add_trace`` would check item by item again (it rebuilds every trace it is given, checked,
    whatever the trace's own ``_validate``): the figure's data validator is told not to, for
    this one call. The figure's JSON is the checked one's (the same test as :func:`points`)."""
    if not FAST_POINTS:
        fig.add_trace(trace, **where)
        return
    validator = fig._data_validator  # each figure's own copy (plotly's BaseFigure.__init__)
    validator.validate_coerce = functools.partial(validator.validate_coerce, _validate=False)
    try:
        fig.add_trace(trace, **where)
    finally:
        del validator.validate_coerce  # the class's method again


def _identity(fig: go.Figure, values: Sequence[float]) -> None:
    """y = x over the range of ``values``."""
    if not values:
        return
    lo, hi = min(values) * 0.9, max(values) * 1.1
    xs = [lo, hi]
    fig.add_trace(go.Scatter(x=xs, y=xs, mode="lines", name="y = x", hoverinfo="skip",
                             line={"color": "#1f77b4", "dash": "dash"}))  # fmt: skip


def step_time(data: ReportData) -> go.Figure:
    """Predicted vs measured step time of every measured trial."""
    fig = go.Figure()
    rows = [r for r in data.rows if r.predicted_step_s and r.measured_step_s]
    _identity(fig, [v for r in rows for v in (r.predicted_step_s, r.measured_step_s) if v])
    shown = spread(rows, lambda r: r.measured_step_s)
    _by_outcome(fig, shown, lambda r: r.predicted_step_s, lambda r: r.measured_step_s,
                sd=lambda r: r.predicted_step_sd)  # fmt: skip
    return _layout(fig, "Step time: predicted vs measured", "predicted s", "measured s",
                   (len(shown), len(rows)))  # fmt: skip


def peak_memory(data: ReportData) -> go.Figure:
    """Predicted vs measured peak memory; real OOMs at (predicted peak, GPU capacity)."""
    fig = go.Figure()
    capacity = data.gpu.memory_gib
    rows = [r for r in data.rows if r.predicted_peak_gib and r.measured_peak_gib]
    ooms = [r for r in data.rows if r.outcome == "oom" and r.predicted_peak_gib]
    values = [v for r in rows for v in (r.predicted_peak_gib, r.measured_peak_gib) if v]
    _identity(fig, values + [r.predicted_peak_gib or 0.0 for r in ooms])
    shown = spread(rows, lambda r: r.measured_peak_gib)
    shown_ooms = spread(ooms, lambda r: r.predicted_peak_gib)
    _by_outcome(fig, shown, lambda r: r.predicted_peak_gib, lambda r: r.measured_peak_gib,
                sd=lambda r: r.predicted_peak_sd)  # fmt: skip
    _by_outcome(fig, shown_ooms, lambda r: r.predicted_peak_gib, lambda r: capacity, "x",
                " (real OOM, drawn at capacity)")  # fmt: skip
    fig.add_hline(y=capacity, line={"color": "#d62728", "dash": "dot"},
                  annotation_text=f"GPU capacity {capacity:.4g} GiB")  # fmt: skip
    return _layout(fig, "Peak memory: predicted vs measured", "predicted GiB", "measured GiB",
                   (len(shown) + len(shown_ooms), len(rows) + len(ooms)))  # fmt: skip


def pareto(data: ReportData) -> go.Figure:
    """Throughput vs peak memory of the measured configs, with the Pareto front."""
    fig = go.Figure()
    rows = [r for r in data.measured if memory_x(r) is not None]
    front = pareto_front(rows)
    fig.add_trace(go.Scatter(
        x=[memory_x(r) for r in front], y=[r.tokens_per_s_per_gpu for r in front],
        mode="lines+markers", line={"shape": "hv", "color": "#2ca02c"}, name="Pareto front",
        hoverinfo="skip",
    ))  # fmt: skip
    shown = spread(rows, lambda r: r.tokens_per_s_per_gpu, {r.number for r in front})
    _by_outcome(fig, shown, memory_x, lambda r: r.tokens_per_s_per_gpu)
    return _layout(fig, "Throughput vs peak memory (measured peak, else predicted)",
                   "peak GiB", "tokens/s/GPU", (len(shown), len(rows)))  # fmt: skip


def _memory_trace_values(data: ReportData, row: TrialRow) -> tuple[list[str], list[list[float]]]:
    stages, _ = data.breakdowns(row)
    labels = [s.label for s in stages]
    return labels, [[s.parts[p] for s in stages] for p in MEMORY_PARTS]


def stage_memory(data: ReportData) -> go.Figure:
    """Predicted memory per stage of the best config, a menu to pick the other configs a person
    looks at (:func:`tuner.report.shown.menu_rows`: the fastest, the Pareto front's, real
    OOMs): stacked components against the GPU capacity and the headroom line, measured peak
    marked."""
    rows = menu_rows(data.measured, data.rows)
    fig = go.Figure()
    capacity = data.gpu.memory_gib
    headroom = data.spec.search.memory_headroom * capacity
    if not rows:
        return _layout(fig, "Memory per stage (no trial to show)", "stage", "GiB")
    labels, values = _memory_trace_values(data, rows[0])
    for i, part in enumerate(MEMORY_PARTS):
        fig.add_trace(go.Bar(
            x=labels, y=values[i], name=part, marker_color=PART_COLOURS[i],
            text=rows[0].hover, textposition="none",
            hovertemplate=f"%{{text}}<br>{part}: %{{y:.3f}} GiB<extra></extra>",
        ))  # fmt: skip
    fig.add_trace(_measured_peak(rows[0], labels))
    buttons = []
    for r in rows:
        labels, values = _memory_trace_values(data, r)
        buttons.append({"label": f"trial {r.number} ({r.outcome})", "method": "update", "args": [
            {"x": [labels] * (len(MEMORY_PARTS) + 1), "y": values + [_peak_line(r, len(labels))],
             "text": [r.hover] * (len(MEMORY_PARTS) + 1)},  # one text a trace: every bar's
            {"title.text": _memory_title(r)},
        ]})  # fmt: skip
    fig.add_hline(y=capacity, line={"color": "#d62728"},
                  annotation_text=f"GPU capacity {capacity:.4g} GiB")  # fmt: skip
    fig.add_hline(y=headroom, line={"color": "#ff7f0e", "dash": "dash"},
                  annotation_text=f"headroom {data.spec.search.memory_headroom:.0%}",
                  annotation_position="bottom right")  # fmt: skip
    fig.update_layout(barmode="stack", updatemenus=[{
        "buttons": buttons, "direction": "down", "x": 1.0, "xanchor": "right", "y": 1.18,
    }])  # fmt: skip
    return _layout(fig, _memory_title(rows[0]), "pipeline stage", "GiB")


def _memory_title(r: TrialRow) -> str:
    return f"Predicted memory of trial {r.number} ({r.outcome}): {r.label}"


def _peak_line(r: TrialRow, stages: int) -> list[float]:
    """The measured peak over every stage's bar (NaN: none measured, nothing drawn)."""
    peak = r.measured_peak_gib
    return [peak if peak is not None else math.nan] * stages


def _measured_peak(r: TrialRow, labels: list[str]) -> go.Scatter:
    return go.Scatter(
        x=labels, y=_peak_line(r, len(labels)), mode="markers",
        name="measured peak", text=r.hover,
        marker={"symbol": "line-ew-open", "size": 40, "line": {"width": 3}, "color": "#000"},
        hovertemplate="%{text}<br>measured peak %{y:.3f} GiB<extra></extra>",
    )  # fmt: skip


def time_breakdown(data: ReportData) -> go.Figure:
    """Predicted step-time parts of the fastest measured configs beside their measured step."""
    rows = data.measured[:MAX_BARS]
    names = [f"#{r.number}" for r in rows]
    parts = [data.breakdowns(r)[1] for r in rows]
    fig = go.Figure()
    for i, part in enumerate(TIME_PARTS):
        if part in MOE_FP8_TIME_PARTS and not any(p.get(part, 0.0) for p in parts):
            continue
        fig.add_trace(go.Bar(
            x=names, y=[p.get(part, 0.0) for p in parts], name=f"predicted {part}",
            offsetgroup="predicted", marker_color=PART_COLOURS[i], text=[r.hover for r in rows],
            textposition="none", hovertemplate=f"%{{text}}<br>{part}: %{{y:.4g}} s<extra></extra>",
        ))  # fmt: skip
    fig.add_trace(go.Bar(
        x=names, y=[r.measured_step_s for r in rows], name="measured step", offsetgroup="measured",
        marker_color="#333", text=[r.hover for r in rows], textposition="none",
        hovertemplate="%{text}<br>measured %{y:.4g} s<extra></extra>",
    ))  # fmt: skip
    fig.update_layout(barmode="relative")
    return _layout(fig, "Where the time goes: predicted parts (left) vs measured step (right)",
                   "trial (fastest first)", "seconds per step")  # fmt: skip


def tp_pp_heatmap(data: ReportData) -> go.Figure:
    """Best measured tokens/s/GPU for each (TP, PP)."""
    best: dict[tuple[int, int], TrialRow] = {}
    for r in data.measured:
        if r.config is not None:
            best.setdefault((r.config.tp, r.config.pp), r)
    tps = sorted({tp for tp, _ in best})
    pps = sorted({pp for _, pp in best})
    z = [[_tput(best.get((tp, pp))) for tp in tps] for pp in pps]
    text = [[best[(tp, pp)].hover if (tp, pp) in best else "not measured" for tp in tps]
            for pp in pps]  # fmt: skip
    fig = go.Figure(go.Heatmap(
        x=[f"tp={v}" for v in tps], y=[f"pp={v}" for v in pps], z=z, text=text,
        colorscale="Viridis", colorbar={"title": {"text": "tok/s/GPU"}},
        texttemplate="%{z:.4g}", textfont={"size": 13},
        hovertemplate="%{text}<br>%{z:.4g} tokens/s/GPU<extra></extra>",
    ))  # fmt: skip
    return _layout(fig, "Best measured throughput over TP x PP", "TP", "PP")


def _tput(r: TrialRow | None) -> float | None:
    return r.tokens_per_s_per_gpu if r is not None else None


def progress(data: ReportData) -> go.Figure:
    """Best-so-far throughput against trials and against GPU-hours spent."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("vs trials", "vs GPU-hours"))
    best, spent = 0.0, 0.0
    xs: list[int] = []
    hours: list[float] = []
    ys: list[float] = []
    text: list[str] = []
    leader: TrialRow | None = None
    for r in sorted(data.rows, key=lambda r: r.number):
        spent += r.gpu_hours
        if r.ok and (r.tokens_per_s_per_gpu or 0.0) > best:
            best, leader = r.tokens_per_s_per_gpu or 0.0, r
        if leader is not None and r.launched:
            xs.append(r.number)
            hours.append(spent)
            ys.append(best)
            text.append(f"after trial {r.number}; best so far {leader.hover}")
    title = "Search progress: best measured tokens/s/GPU so far"
    if len(xs) > MAX_POINTS:  # the same step line from the trials that raised it and the last
        kept = [i for i in range(len(xs)) if i in (0, len(xs) - 1) or ys[i] != ys[i - 1]]
        xs, hours = [xs[i] for i in kept], [hours[i] for i in kept]
        ys, text = [ys[i] for i in kept], [text[i] for i in kept]
        title += "<br><sup>a marker at each trial that raised the best, and at the last</sup>"
    for col, x in ((1, xs), (2, hours)):
        add_points(fig, points(
            x=x, y=ys, mode="lines+markers", line={"shape": "hv"}, text=text,
            name="best so far" if col == 1 else "best so far (GPU-hours)",
            hovertemplate="%{text}<br>%{y:.4g} tokens/s/GPU<extra></extra>",
        ), row=1, col=col)  # fmt: skip
    fig.update_xaxes(title_text="trial", row=1, col=1)
    fig.update_xaxes(title_text="GPU-hours spent", row=1, col=2)
    return _layout(fig, title, "", "tokens/s/GPU")


def payback(data: ReportData, plan: dict[str, float]) -> go.Figure:
    """GPU-hours of the full training run with the found config vs the baseline."""
    fig = go.Figure(go.Bar(
        x=["baseline", "found config", "search spent"],
        y=[plan["baseline_gpu_hours"], plan["found_gpu_hours"], plan["search_gpu_hours"]],
        marker_color=["#7f7f7f", "#2ca02c", "#ff7f0e"],
        text=[f"{v:,.4g}" for v in (plan["baseline_gpu_hours"], plan["found_gpu_hours"],
                                      plan["search_gpu_hours"])],
        hovertemplate="%{x}: %{y:,.4g} GPU-hours<extra></extra>",
    ))  # fmt: skip
    return _layout(fig, f"Full training run of {plan['train_tokens']:.3g} tokens", "",
                   "GPU-hours")  # fmt: skip


def _throughput_target(data: ReportData) -> Callable[[FrozenTrial], float]:
    tokens_per_step = data.spec.training.global_batch_size * data.spec.model.seq_length
    world = data.spec.world_size

    def target(t: FrozenTrial) -> float:
        # The study minimises step time; Optuna ranks what drives low values, so the target is
        # the negated throughput (the history's axis is negated back below).
        return -tokens_per_step / float(t.value) / world if t.value else 0.0

    return target


def optuna_views(data: ReportData) -> tuple[Figures, str]:
    """Optuna's optimization history and parameter importances for throughput; with fewer than
    two completed trials, none and a note why."""
    complete = [t for t in data.trials if t.state == TrialState.COMPLETE and t.value]
    if len(complete) < 2:
        return [], f"Optuna's views need at least 2 completed trials ({len(complete)} so far)."
    # Optuna's plots read the study's trials many times over: from an in-memory copy of the
    # completed ones, not from the storage (seconds for a 500-trial SQLite study).
    study = views_study(data.spec.name, complete)
    target = _throughput_target(data)
    figures: Figures = [("optuna_history", history(complete, target, "tokens/s/GPU"))]
    searched = searched_params(complete)
    if len(complete) < MIN_IMPORTANCE_TRIALS or not searched:
        why = (f"{len(complete)} completed trials, {MIN_IMPORTANCE_TRIALS} needed"
               if searched else "no knob took more than one value")  # fmt: skip
        return figures, f"Parameter importances are left out: {why}."
    note = ""
    try:  # the target is negated already (see above): lower is better
        importances = plot_param_importances(study, searched, target, "tokens/s/GPU")
        figures.append(("optuna_importances", styled(importances, template="plotly_white")))
    except (RuntimeError, ValueError) as exc:  # e.g. every parameter took one value only
        note = f"Parameter importances unavailable: {exc}"
    return figures, note


def history(
    trials: Sequence[FrozenTrial], target: Callable[[FrozenTrial], float], name: str
) -> go.Figure:
    """Optuna's optimization history (``plot_optimization_history(study, target=target,
    target_name=name)`` of the in-memory study of ``trials``, completed and feasible, numbered
    by their place) with the target negated back: the figure it draws, drawn from the trials
    here with the points unchecked (:func:`points`), not through its copy of each target value
    and plotly's checks of every point, twice for the negated values (a tenth of a second at
    10,000 trials). ``tests/report/test_report_fast_paths.py`` compares it with Optuna's."""
    layout = go.Layout(title="Optimization History Plot", xaxis={"title": "Trial"},
                       yaxis={"title": name})  # fmt: skip
    fig = go.Figure(layout=layout)
    add_points(fig, points(x=list(range(len(trials))), y=[-target(t) for t in trials],
                           mode="markers", name=name))  # fmt: skip
    # Optuna's trace of infeasible trials (with constraints unmet): the report's have none.
    fig.add_trace(go.Scatter(x=[], y=[], mode="markers", name="Infeasible Trial",
                             marker={"color": "#cccccc"}, showlegend=False))  # fmt: skip
    return styled(fig, yaxis_title=name, template="plotly_white")


def views_study(name: str, trials: Sequence[FrozenTrial]) -> optuna.Study:
    """An in-memory study of ``trials`` (finished trials read from a study's storage), for
    Optuna's views: as ``Study.add_trials`` into an in-memory storage makes it, without its
    checks of each trial (:class:`SharedTrialsStudy`)."""
    storage = optuna.storages.InMemoryStorage()
    storage.create_new_study([StudyDirection.MINIMIZE], name)
    return SharedTrialsStudy(name, storage, trials)


class SharedTrialsStudy(optuna.Study):
    """A study that holds its trials itself and reads them without copies (``deepcopy=False``
    whatever the caller asks): the report's in-memory study of :class:`tuner.report.data.
    ReadOnlyTrial`s, which nothing changes. Optuna's importances plot reads ``study.trials`` (a
    deep copy of every trial) once per parameter for the last trial's distribution: some 67,000
    copies at 10,000 trials.

    Its trials are those ``Study.add_trials`` would store in its (empty) in-memory storage:
    each trial's copy numbered by its place (number and id), as the in-memory storage numbers
    the trials it is given, but not checked one by one (``FrozenTrial._validate``, the
    storage's lock and best-trial cache: 0.13 s of CPU for 8,378 trials), being trials Optuna's
    own storage held. Optuna's views read the trials through :meth:`get_trials` (and
    ``trials``) only; the directions and names come from the storage."""

    def __init__(
        self, study_name: str, storage: optuna.storages.BaseStorage,
        trials: Sequence[FrozenTrial] = (),
    ) -> None:  # fmt: skip
        super().__init__(study_name=study_name, storage=storage)
        held = []
        for number, t in enumerate(trials):
            twin = copy.deepcopy(t)  # a ReadOnlyTrial's is shallow
            twin.number = number
            twin._trial_id = number  # a new in-memory storage's ids count from 0
            held.append(twin)
        self._held = held

    def get_trials(
        self, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        """Every trial (of ``states``), the held objects themselves."""
        if states is None:
            return list(self._held)
        return [t for t in self._held if t.state in states]


def searched_params(trials: Sequence[FrozenTrial]) -> list[str]:
    """The knobs the search varied: parameters that took more than one value in ``trials``."""
    values: dict[str, set[object]] = {}
    for t in trials:
        for name, value in t.params.items():
            values.setdefault(name, set()).add(value)
    return sorted(name for name, seen in values.items() if len(seen) > 1)
