"""Which trials the report's figures draw when a study has more than a person can read.

A long study measures the same few hundred configs again and again (10,000 trials of some 600
configs): a scatter of every trial is one blot per config, the per-stage memory menu a list of
the same config's repeats, and the page grew by a hover text per trial per figure (21.7 MiB at
10,000 trials). The figures now draw what a person reads in them, and the leaderboard and the
trial views still hold every trial:

- a scatter of up to :data:`MAX_POINTS` trials draws them all; past that, each config's spread
  on the figure's y axis (its lowest, middle and highest trial, by outcome) and the trials a
  figure names (the Pareto front), the number left out said under the figure;
- the per-stage memory menu is one entry per config (its fastest measured trial): the
  :data:`MENU_BEST` fastest configs, the Pareto front's, and :data:`MENU_OOMS` configs that ran
  out of memory, those the model put lowest first (its largest misses);
- the best-so-far curve marks each trial that raised the best and the last trial, the step line
  between them the same.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from tuner.report.data import TrialRow

MAX_POINTS = 2000
"""Trials a scatter draws in full; past that, each config's spread (:func:`spread`)."""

MENU_BEST = 10
"""The fastest measured configs in the per-stage memory menu."""

MENU_OOMS = 10
"""Configs that ran out of memory in the per-stage memory menu."""


def memory_x(r: TrialRow) -> float | None:
    """The Pareto figure's x: the measured peak, else the predicted one."""
    return r.measured_peak_gib or r.predicted_peak_gib


def pareto_front(rows: Sequence[TrialRow]) -> list[TrialRow]:
    """The trials of ``rows`` that no trial of less memory (:func:`memory_x`) out-runs, by
    memory."""
    front: list[TrialRow] = []
    for r in sorted(rows, key=lambda r: (memory_x(r) or 0.0, -(r.tokens_per_s_per_gpu or 0))):
        if not front or (r.tokens_per_s_per_gpu or 0) > (front[-1].tokens_per_s_per_gpu or 0):
            front.append(r)
    return front


def spread(
    rows: Sequence[TrialRow], y: Callable[[TrialRow], float | None],
    named: Collection[int] = (), limit: int = MAX_POINTS,
) -> list[TrialRow]:  # fmt: skip
    """``rows`` when there are at most ``limit``; else, in ``rows``' order, each (config,
    outcome)'s trials of the lowest, the middle and the highest ``y`` (the lowest number first
    among equals) and the trials numbered in ``named``."""
    if len(rows) <= limit:
        return list(rows)
    groups: dict[tuple[str, str], list[TrialRow]] = {}
    for r in rows:
        groups.setdefault((r.key, r.outcome), []).append(r)
    kept = set(named)
    for group in groups.values():
        ranked = sorted(group, key=lambda r: (_value(y(r)), r.number))
        kept.update(r.number for r in (ranked[0], ranked[(len(ranked) - 1) // 2], ranked[-1]))
    return [r for r in rows if r.number in kept]


def _value(v: float | None) -> float:
    return float("-inf") if v is None else v


def left_out(drawn: int, of: int) -> str:
    """The words under a figure that draws ``drawn`` of ``of`` trials (empty: all drawn)."""
    if drawn >= of:
        return ""
    return (f"{drawn:,} of {of:,} trials drawn: each config's lowest, middle and highest; every "
            "trial is in the leaderboard.")  # fmt: skip


def menu_rows(measured: Sequence[TrialRow], rows: Sequence[TrialRow]) -> list[TrialRow]:
    """The per-stage memory menu: one trial per config, the fastest :data:`MENU_BEST` measured
    configs (``measured``: fastest first), then the Pareto front's other configs, then up to
    :data:`MENU_OOMS` configs of the real OOMs in ``rows``, the lowest predicted peak first."""
    fastest: dict[str, TrialRow] = {}
    for r in measured:
        if r.config is not None:
            fastest.setdefault(r.key, r)
    chosen = dict(list(fastest.items())[:MENU_BEST])
    for r in pareto_front([r for r in measured if memory_x(r) is not None]):  # the figure's
        if r.config is not None:
            chosen.setdefault(r.key, fastest[r.key])
    ooms: dict[str, TrialRow] = {}
    for r in sorted((r for r in rows if r.outcome == "oom" and r.config is not None),
                    key=lambda r: (_value(r.predicted_peak_gib), r.number)):  # fmt: skip
        if r.key not in chosen:
            ooms.setdefault(r.key, r)
    return [*chosen.values(), *list(ooms.values())[:MENU_OOMS]]
