"""``tune calibrate``'s tables: the fitted factors, each saved trial predicted from all the
others by the correction applied, and the error before and after (:mod:`tuner.cli.profile`
prints them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from tuner.cli import render
from tuner.config.spelling import split_constant
from tuner.report import units

FACTOR_COLUMNS = (
    render.Column(
        name="applies_to",
        header="applies to",
        right=False,
        meaning="the knob value or setting a correction factor is fitted for",
    ),
    render.Column(name="factor", header="factor", meaning="measured / predicted, fitted"),
)
TRIAL_COLUMNS = (
    render.Column(
        name="trial", header="trial", meaning="the trial's number in its study", number=True
    ),
    render.CONFIG,
    render.Column(
        name="ratio_model",
        header="measured/\nmodel",
        meaning="measured over the model's prediction",
    ),
    render.Column(
        name="ratio_calibrated",
        header="measured/\ncalibrated",
        meaning="measured over the calibrated prediction from all the other trials",
    ),
    render.Column(name="study", header="study", right=False, meaning="the trial's study"),
)
"""``tune calibrate``'s tables (the measured column sits between config and the ratios; the
study only when the calibration has several)."""


APPLIED_HEADERS = {"one shared factor": "shared factor", "per-knob factors": "per-knob"}
"""The ``measured/...`` column's second line for the step-time correction applied
(:data:`tuner.calibrate.correction.TIME_CHOICES`; the model alone has no column of its own)."""


def print_corrections(
    console: Any, what: str, heading: str, factors: list[tuple[str, float]], loo: list[Any],
    errors: dict[str, float], applied: str | None = None,
) -> None:  # fmt: skip
    """One half of ``tune calibrate`` (``what``: step time or peak memory): the fitted factors,
    each trial predicted from all the others, and the error before and after. ``applied``: the
    step-time correction applied (``loo`` is its leave-one-out), named in the table and the
    error line; None: the one fit there is (memory)."""
    console.print(heading)
    if factors:
        render.render(console, render.Grid(
            title="", columns=FACTOR_COLUMNS,
            rows=tuple((applies, units.factor(f)) for applies, f in factors), choosable=False,
        ))  # fmt: skip
    else:
        console.print("none applied: the model alone")
    memory = what == "peak memory"
    studies = sorted({r.observation.study for r in loo})
    title = ("measured peaks" if memory else "trials") + (
        f" of {studies[0]}" if len(studies) == 1 else ""
    )
    constant, spelled = split_constant([r.observation.parallel_config() for r in loo])
    rows: list[tuple[str, ...]] = []
    for r, config in zip(loo, spelled, strict=True):
        o = r.observation
        measured = units.gib(o.measured_gib) if memory else units.seconds(o.measured_step_s)
        rows.append((str(o.trial), config, measured, units.factor(r.before),
                     units.factor(r.after), o.study))  # fmt: skip
    after = TRIAL_COLUMNS[3]
    if applied is not None:
        after = dataclasses.replace(
            after,
            header=f"measured/\n{APPLIED_HEADERS.get(applied)}",
            meaning=f"measured over the prediction with the correction "
            f"applied ({applied}) fitted to all the other trials",
        )
    columns: tuple[render.Column, ...] = (*TRIAL_COLUMNS[:2], render.Column(
        name="measured_gib" if memory else "measured_step_s",
        header="measured\nGiB" if memory else "measured\ns"), TRIAL_COLUMNS[2], after,
        TRIAL_COLUMNS[4])  # fmt: skip
    if applied == "the model alone":  # its column would repeat measured/model
        columns, rows = columns[:4] + columns[5:], [row[:4] + row[5:] for row in rows]
    if len(studies) == 1:  # named in the title instead
        columns, rows = columns[:-1], [row[:-1] for row in rows]
    by = f"; correction applied: {applied}" if applied else ""
    render.render(console, render.Grid(
        title=f"{title} (each predicted from all the others{by})", columns=columns,
        rows=tuple(rows), constant=constant, choosable=False,
    ))  # fmt: skip
    if errors:
        console.print(f"{what.replace(' ', '-')} error: {_error_words(errors, applied)}")


def _error_words(errors: dict[str, float], applied: str | None) -> str:
    """The leave-one-out error by the model alone and with the correction applied
    (``applied``; None: the one calibration there is), and the median measured/predicted ratio
    of each."""
    if applied == "the model alone":
        return (f"{errors['mape_before']:.1%} by the model alone (leave-one-out; no correction "
                "applied: none predicted held-out trials better); median measured/predicted "
                f"{errors['median_ratio_before']:.2f}")  # fmt: skip
    name = f"with {applied} (the correction applied; leave-one-out)" if applied else (
        "calibrated (leave-one-out)")  # fmt: skip
    return (f"{errors['mape_before']:.1%} by the model alone, {errors['mape_after']:.1%} "
            f"{name}; median measured/predicted {errors['median_ratio_before']:.2f} -> "
            f"{errors['median_ratio_after']:.2f}")  # fmt: skip


def loo_json(row: Any, memory: bool = False) -> dict[str, Any]:
    o = row.observation
    measured = (
        {"measured_gib": o.measured_gib, "predicted_gib": o.predicted_gib}
        if memory
        else {"measured_step_s": o.measured_step_s, "predicted_step_s": o.predicted_step_s}
    )
    return {"study": o.study, "trial": o.trial, "config": dict(o.config), **measured,
            "ratio_model": row.before, "ratio_calibrated": row.after}  # fmt: skip
