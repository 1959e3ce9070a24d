"""The report's HTML parts that explain the study: the header, the key figures, the funnel of the
space, the leaderboard of every trial, one view per trial and the top configs side by side.

Each returns markup for ``page.html.j2``; the colours of the outcomes are the figures' own
(:data:`tuner.report.figures.OUTCOME_COLOURS`), so an outcome looks the same everywhere.
"""

from __future__ import annotations

import functools
import html
import math
import os
import shlex
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime

from markupsafe import Markup

from tuner.config.settings import settable_keys
from tuner.layout import ResultsLayout
from tuner.report.data import ReportData, TrialRow
from tuner.report.figures import OUTCOME_COLOURS
from tuner.report.shown import MAX_POINTS
from tuner.report.units import duration, gib, gpu_hours, rate, seconds, switch
from tuner.spec.pipeline_split import EVEN

LOG_TAIL_LINES = 25
"""Lines of a trial's node-0 log shown in its view."""

SIDE_BY_SIDE = 3
"""Measured configs compared column by column."""

REASON_CHARS = 90
"""Characters of a failure's reason in the leaderboard (the trial view has all of it)."""


def _e(text: object) -> str:
    return _escaped(str(text))


@functools.lru_cache(maxsize=1 << 14)
def _escaped(text: str) -> str:
    """``html.escape``, once per text: the leaderboard and the views escape some 120,000 texts
    at 10,000 trials, most of them a config's key or words, an outcome or a reason again."""
    return html.escape(text)


def fmt(value: float | None, digits: int = 4) -> str:
    """A number for a table cell; empty when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.{digits}g}"


def fmt_rate(value: float | None) -> str:
    """Tokens/s for a table cell or card (:func:`tuner.report.units.rate`, the terminal tables'
    ``16,384``, not ``1.638e+04``); empty when missing or no figure."""
    if value is None or not math.isfinite(value):
        return "" if value is None or math.isnan(value) else str(value)
    return rate(value)


def fmt_s(value: float | None) -> str:
    """Seconds for a table cell (:func:`tuner.report.units.seconds`, the terminal tables'
    format: never in exponent form); empty when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return seconds(value)


def config_words(label: str) -> str:
    """A config's spelling for a table cell, escaped: each token (``tp4``, ``reshard-always``)
    kept whole, so the cell wraps between tokens, never inside one (``reshard-`` /
    ``always`` at a hyphen, ``tp`` / ``4`` where the page breaks words anywhere)."""
    return _tokens(label)


@functools.lru_cache(maxsize=1 << 12)
def _tokens(label: str) -> str:
    return " ".join(f"<span>{_e(word)}</span>" for word in label.split())


def fmt_gib(value: float | None) -> str:
    """GiB for a table cell, measured and predicted alike (:func:`tuner.report.units.gib`, the
    terminal tables' format); empty when missing."""
    if value is None or math.isnan(value):
        return ""
    return gib(value)


def knob(value: object) -> str:
    """A knob's value for a table cell: an on/off knob as ``on``/``off``, the rest as written."""
    return switch(value) if isinstance(value, bool) else str(value)


def pct(value: float | None) -> str:
    """A share as a percentage; empty when missing."""
    return "" if value is None else f"{100 * value:.1f}%"


def badge(outcome: str) -> str:
    """An outcome in its colour."""
    colour = OUTCOME_COLOURS.get(outcome, "#333")
    return f'<span class="badge" style="background:{colour}">{_e(outcome)}</span>'


def _version() -> str:
    try:
        import tuner

        return str(tuner.__version__)
    except Exception:  # an uninstalled checkout: no distribution metadata
        return "unknown"


def header(data: ReportData) -> Markup:
    """What was studied: model, GPUs, nodes, framework, search settings, tuner version, date."""
    s = data.spec
    m, c = s.model, s.cluster
    model = (
        f"{m.name}: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads, "
        f"seq {m.seq_length}" + (f", {m.moe.num_experts} experts" if m.moe else "")
    )
    search = (
        f"{s.search.sampler} sampler, budget {s.search.n_trials} runs, "
        f"{s.nodes_per_trial} node(s) per trial, " + (
            f"limit {s.search.trial_timeout_min:g} min" if s.search.trial_timeout_min is not None
            else "each config's limit from its predicted trial"
        )
    )  # fmt: skip
    items = [
        ("model", model),
        ("GPUs", f"{c.gpu_name} x {c.gpus_per_node} per node ({s.world_size} ranks per trial)"),
        ("nodes", f"{len(s.node_names) or 'hostfile'} ({c.executor})"),
        (
            "framework",
            f"{s.framework}, {s.training.precision}, global batch {s.training.global_batch_size}",
        ),  # fmt: skip
        ("search", search),
        (
            "tuner",
            f"{_version()}; report written {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        ),  # fmt: skip
    ]
    cells = "".join(f"<div><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>" for k, v in items)
    return Markup(f'<dl class="meta" id="meta">{cells}</dl>')


def cards(data: ReportData) -> Markup:
    """The key figures, one card each."""
    best, first = data.best, data.first_pick
    out: list[tuple[str, str, str]] = []
    if best is not None:
        out.append(("best tokens/s/GPU", fmt_rate(best.tokens_per_s_per_gpu),
                    f"trial {best.number}"))  # fmt: skip
        out.append(("best MFU", pct(best.mfu) or "n/a", f"step {fmt_s(best.measured_step_s)} s"))
        if first is not None and first.ok and first.tokens_per_s_per_gpu:
            gain = (best.tokens_per_s_per_gpu or 0) / first.tokens_per_s_per_gpu - 1
            out.append(
                ("vs the model's first pick", f"+{100 * gain:.1f}%", f"trial {first.number}")
            )
    launched = sum(r.launched for r in data.rows)
    ok = sum(r.ok for r in data.rows)
    failed = sum(r.failed for r in data.rows)
    out.append(("trials launched", str(launched), f"{ok} measured, {failed} failed"))
    out.append(("GPU-hours spent", gpu_hours(data.gpu_hours), f"{duration(data.wall_s)} wall"))
    html_cards = "".join(
        f'<div class="card"><div class="label">{_e(a)}</div><div class="value">{_e(b)}</div>'
        f'<div class="sub">{_e(c)}</div></div>'
        for a, b, c in out
    )
    return Markup(f'<div class="cards" id="cards">{html_cards}</div>')


def funnel(data: ReportData) -> Markup:
    """The space from every combination down to the measured configs, one bar per stage."""
    counts = data.space_counts
    launched = sum(r.launched for r in data.rows)
    ok = sum(r.ok for r in data.rows)
    steps = [("configs in the space", counts["total"], "#1f77b4")]
    steps += [
        (f"invalid: {rule}", n, OUTCOME_COLOURS["invalid"])
        for rule, n in counts["invalid_by_rule"].items()
    ]
    steps += [
        ("predicted OOM (pruned)", counts["predicted_oom"], OUTCOME_COLOURS["pruned_memory"]),
        ("viable", counts["viable"], "#1f77b4"),
        ("launched", launched, "#ff7f0e"),
        ("measured", ok, OUTCOME_COLOURS["ok"]),
    ]
    top = max(counts["total"], 1)
    rows = "".join(
        f'<tr><th>{_e(label)}</th><td class="num">{n:,}</td><td class="bar"><span '
        f'style="width:{max(100 * n / top, 0.4 if n else 0):.1f}%;background:{colour}"></span>'
        "</td></tr>"
        for label, n, colour in steps
    )
    return Markup(f'<table class="funnel" id="funnel"><tbody>{rows}</tbody></table>')


BOARD = ["trial", "outcome", "config", "tok/s/GPU", "MFU", "step s", "pred. step s", "peak GiB",
         "pred. peak GiB", "reason", "view"]  # fmt: skip
"""The leaderboard's headers: the first column is the trial's number (headed "#", it read as the
row's rank: 1, 0, 3, 5, ... down a board sorted fastest first), the last its link."""


def board_rows(data: ReportData) -> list[TrialRow]:
    """Every trial: the measured ones fastest first, then the rest by number."""
    rest = sorted((r for r in data.rows if not r.ok), key=lambda r: r.number)
    return [*data.measured, *rest]


def proxy_mark(row: TrialRow) -> str:
    """After a step extrapolated from a proxy: a marker whose title says how it was measured
    (a number stays first in the cell, so the table still sorts by it)."""
    if not row.proxy:
        return ""
    title = f"extrapolated to full scale from a {row.proxy}"
    return f' <sup class="proxy" title="{_e(title)}">proxy</sup>'


def leaderboard(data: ReportData) -> Markup:
    """Every trial with its outcome, reason and a link to its view."""
    head = "".join(f"<th>{_e(h)}</th>" for h in BOARD)
    body = []
    for r in board_rows(data):
        reason = (
            r.reason if len(r.reason) <= REASON_CHARS else r.reason[: REASON_CHARS - 3] + "..."
        )
        cells = [
            str(r.number), badge(r.outcome),
            f'<span class="config" title="{_e(r.key)}">{config_words(r.label)}</span>',
            fmt_rate(r.tokens_per_s_per_gpu), pct(r.mfu), fmt_s(r.measured_step_s) + proxy_mark(r),
            fmt_s(r.predicted_step_s), fmt_gib(r.measured_peak_gib), fmt_gib(r.predicted_peak_gib),
            _e(reason), f'<a href="#trial-{r.number}">view</a>',
        ]  # fmt: skip
        tds = "".join(f"<td>{c}</td>" for c in cells)
        body.append(f'<tr class="outcome-{_e(r.outcome)}">{tds}</tr>')
    return Markup(f'<table class="sortable board-table"><thead><tr>{head}</tr></thead><tbody>'
                  f'{"".join(body)}</tbody></table>')  # fmt: skip


TAIL_BYTES = 64 * 1024
"""How far back from a file's end :func:`_tail` looks for its last lines."""

TAIL_FIRST_BYTES = 8 * 1024
"""What :func:`_tail` reads first: enough for the last lines of a usual log (a 10,000-trial
report reads two files a trial)."""


def _tail(path: object, lines: int) -> str:
    """The last ``lines`` lines of the file's last :data:`TAIL_BYTES` (empty: no such file).
    Read from its last :data:`TAIL_FIRST_BYTES` when they hold more than ``lines`` lines: the
    same lines (only the first, cut, line of a shorter read can differ, and it is not shown)."""
    p = str(path)  # os.path, not pathlib: two files a trial, 10,000 trials
    if not os.path.isfile(p):
        return ""
    with open(p, "rb") as f:
        size = f.seek(0, 2)
        for back in (TAIL_FIRST_BYTES, TAIL_BYTES):
            f.seek(max(0, size - back))
            split = f.read().decode("utf-8", errors="replace").splitlines()
            if len(split) > lines or back >= size:
                break
    return "\n".join(split[-lines:])


@dataclass(frozen=True, slots=True)
class NodeFiles:
    """Where node 0's launch script and log of any trial are (:class:`tuner.layout.TrialPaths`'
    names), as strings: a trial's are ``<trials>/<number>/<name>``."""

    trials: str
    script: str
    log: str

    @classmethod
    def of(cls, layout: ResultsLayout) -> NodeFiles:
        """The names in ``layout`` (read from trial 0's paths: one definition of them)."""
        paths = layout.trial(0)
        return cls(str(layout.trials_dir), paths.launch_script(0).name, paths.node_log(0).name)


def trial_view(data: ReportData, row: TrialRow, files: NodeFiles) -> str:
    """One trial: outcome, reason, the command node 0 ran, the predicted breakdowns, its log
    (past :data:`MAX_POINTS` trials, a measured trial of a config no figure draws has its
    script and log linked instead: :func:`_linked`)."""
    folder = os.path.join(files.trials, str(row.number))
    memory, time = _predicted_words(data, row)
    page = data.page_dir
    if (
        page is not None
        and row.ok
        and len(data.rows) > MAX_POINTS
        and not data.has_breakdowns(row)
    ):
        return _linked(row, folder, files, page, (memory, time))
    command = _tail(os.path.join(folder, files.script), 12) or "(never launched: no command)"
    log = _tail(os.path.join(folder, files.log), LOG_TAIL_LINES) or "(no log)"
    return (
        _view_head(row, memory, time) + f"<p><b>command</b> ({_e(files.script)}, last lines):</p>"
        f"<pre>{_e(command)}</pre>"
        f"<p><b>log tail</b> ({_e(files.log)}):</p><pre>{_e(log)}</pre></details>"
    )


def _view_head(row: TrialRow, memory: str, time: str) -> str:
    """A trial view's opening (summary, reason, predicted and measured figures): the same
    whether node 0's files are shown as tails (:func:`trial_view`) or links (:func:`_linked`)."""
    return (
        f'<details class="trial" id="trial-{row.number}"><summary>trial {row.number} '
        f"{badge(row.outcome)} {_e(row.label)}</summary>"
        f"<p><b>reason</b>: {_e(row.reason or 'none')}</p>"
        f"<p><b>predicted memory</b>: {memory or 'n/a'}</p>"
        f"<p><b>predicted step (s)</b>: {_e(time) or 'n/a'}</p>"
        f"<p><b>measured</b>: step {fmt_s(row.measured_step_s) or 'n/a'} s{proxy_mark(row)}, peak "
        f"{fmt_gib(row.measured_peak_gib) or 'n/a'} GiB</p>"
    )


def _linked(
    row: TrialRow, folder: str, files: NodeFiles, page: str, predicted: tuple[str, str]
) -> str:
    """:func:`trial_view` with node 0's script and log as links, relative to the page's folder
    ``page``, instead of their tails: a long study's page would otherwise carry some 2 to 4 KB
    of tails for every measured trial (the failed ones, whose log says why, and those of the
    configs the figures draw keep theirs)."""
    memory, time = predicted

    def link(name: str) -> str:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return ""
        href = urllib.parse.quote(os.path.relpath(path, page).replace(os.sep, "/"))
        return f'<a href="{_e(href)}">{_e(name)}</a>'

    return (
        _view_head(row, memory, time)
        + f"<p><b>command</b>: {link(files.script) or '(never launched: no command)'}</p>"
        f"<p><b>log</b>: {link(files.log) or '(no log)'}</p></details>"
    )


def _predicted_words(data: ReportData, row: TrialRow) -> tuple[str, str]:
    """A trial view's predicted memory (its most loaded stage's parts, escaped) and step-time
    parts, once per config (a long study measures the same configs again)."""
    key = row.key if row.config else ""
    if key in data.view_words:
        return data.view_words[key]
    if row.config is not None and len(data.rows) > MAX_POINTS and not data.has_breakdowns(row):
        return _screened_words(row)  # the trial's own record, not the config's
    worst, parts = data.view_breakdowns(row)
    memory = ""
    if worst is not None:
        memory = ", ".join(f"{k} {gib(v)}" for k, v in worst.parts.items())
        memory = f"{_e(worst.label)}: {_e(memory)} GiB"
    time = ", ".join(f"{k} {seconds(v)}" for k, v in parts.items() if abs(v) > 1e-9)
    data.view_words[key] = (memory, time)
    return data.view_words[key]


def _screened_words(row: TrialRow) -> tuple[str, str]:
    """A trial view's predictions past :data:`MAX_POINTS` trials, for a config the figures do
    not break down: what the screen recorded with the trial (:func:`screened_note` says how
    to break it down). The report no longer simulates the allocator for every config a long
    study measured (about 600 at 10,000 trials)."""
    where = f" ({row.predicted_peak_where})" if row.predicted_peak_where else ""
    peak = fmt_gib(row.predicted_peak_gib)
    step = fmt_s(row.predicted_step_s)
    return (_e(f"peak {peak} GiB{where}, as screened") if peak else "",
            f"{step}, as screened" if step else "")  # fmt: skip


def screened_note(data: ReportData) -> str:
    """The Trials section's words on the views of :func:`_screened_words` (empty: none)."""
    if len(data.rows) <= MAX_POINTS:
        return ""
    example = next((r for r in data.measured if r.config is not None), None)
    settable = set(settable_keys()) - {"split"}  # its value can hold commas: first=8,last=7
    words = [w for w in (example.key if example else "").split(",")
             if w.partition("=")[0] in settable]  # fmt: skip
    split = example.config.pipeline_split if example and example.config else EVEN
    if split != EVEN:
        words.append(f"split={split}")
    command = " ".join(["tune estimate", data.spec.command_args(data.results),
                        *(f"--set {shlex.quote(w)}" for w in words)])  # fmt: skip
    return (f" Past {MAX_POINTS:,} trials, the view of a config the figures do not draw gives "
            "the predicted peak and step the screen recorded with it; its parts, stage by "
            f"stage: {command} (the best config's knobs here).")  # fmt: skip


def trial_views(data: ReportData) -> Markup:
    """Every trial's view, in leaderboard order (closed until a link or a click opens one)."""
    from pathlib import Path

    files = NodeFiles.of(ResultsLayout(Path(data.results), data.spec.name))
    return Markup("".join(trial_view(data, r, files) for r in board_rows(data)))


def side_by_side(data: ReportData) -> Markup:
    """The fastest measured configs in columns: knobs, measurements and predicted parts."""
    top = data.measured[:SIDE_BY_SIDE]
    if not top:
        return Markup("")
    knobs = ["tp", "pp", "dp", "cp", "vp", "sequence_parallel", "micro_batch_size", "grad_accum",
             "recompute", "distributed_optimizer", "zero_stage"]  # fmt: skip
    rows: list[tuple[str, list[str]]] = []
    for k in knobs:
        values = [knob(getattr(r.config, k, "")) if r.config else "" for r in top]
        rows.append((k, values))
    rows += [
        ("tokens/s/GPU", [fmt_rate(r.tokens_per_s_per_gpu) for r in top]),
        ("MFU", [pct(r.mfu) for r in top]),
        ("step s (measured)", [fmt_s(r.measured_step_s) for r in top]),
        ("step s (predicted)", [fmt_s(r.predicted_step_s) for r in top]),
        ("peak GiB (measured)", [fmt_gib(r.measured_peak_gib) for r in top]),
        ("peak GiB (predicted)", [fmt_gib(r.predicted_peak_gib) for r in top]),
    ]
    names = sorted({k for r in top for k, v in data.breakdowns(r)[1].items() if abs(v) > 1e-9})
    for name in names:
        rows.append((f"predicted {name} s", [fmt_s(data.breakdowns(r)[1].get(name)) for r in top]))
    head = "<th></th>" + "".join(
        f'<th><a href="#trial-{r.number}">trial {r.number}</a></th>' for r in top
    )
    body = "".join(
        f"<tr><th>{_e(k)}</th>"
        + "".join(f'<td class="{"diff" if len(set(v)) > 1 else ""}">{_e(x)}</td>' for x in v)
        + "</tr>"
        for k, v in rows
    )
    return Markup(f'<table class="side" id="side-by-side"><thead><tr>{head}</tr></thead>'
                  f"<tbody>{body}</tbody></table>")  # fmt: skip
