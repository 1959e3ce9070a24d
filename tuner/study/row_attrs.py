"""A finished trial's shown attributes kept together: one attribute holding, as one JSON
object, the attributes the read commands show of a trial (the leaderboard's and the report's
figures, reasons and verdict), written in the transaction that ends the trial
(:func:`tuner.study.storage.write_trial`).

At 10,000 trials the read commands' read of some 20 attributes a trial was SQLite reading
about 200,000 rows (a third of the report's read); a trial that keeps them together is one
row. Nothing is lost or changed: each attribute stays a row of its own (Optuna's reads, the
loop, the exports and every older reader use those), and the kept object is built from
those rows' stored texts in the same transaction, after the trial's last attributes are
written. A finished trial is never written again (Optuna refuses it, and so does
``write_trial``), so the object cannot fall out of step with its rows. A trial ended another
way (through Optuna's ``tell``, by another worker's recovery, a duplicate answered at the
screen) or stored by an older tuner has none: its attributes are read one by one, as before
(:func:`tuner.study.attrs_read.read_attrs`).
"""

from __future__ import annotations

ROW_ATTR = "shown_attrs"
"""The attribute that holds the others as one JSON object."""

ROW_KEYS = (
    "duplicate_of", "duration_s", "full_microbatches", "launched", "measured_microbatches",
    "mfu", "objective", "outcome", "peak_memory_gib",
    "peak_reserved_gib", "predicted_allocated_gib", "predicted_mfu", "predicted_peak_gib",
    "predicted_peak_phase", "predicted_peak_sd", "predicted_peak_stage",
    "predicted_reserved_gib", "predicted_step_s", "predicted_step_sd", "proxy", "proxy_dp",
    "proxy_nodes", "proxy_step_s", "reason", "step_time_s", "tflops_per_gpu", "tokens_per_s",
)  # fmt: skip
"""The attributes kept together: those the leaderboard (``tuner.report.leaderboard.
BOARD_ATTRS``) and the report (``tuner.report.data.REPORT_ATTRS``) read, but the config and
the hosts, which repeat from trial to trial and are read as texts of their own (each distinct
text decoded once)."""


def kept_text(rows: list[tuple[str, str]]) -> str:
    """The kept object's text from a trial's ``(key, value_json)`` rows: each stored text as
    it is, so the object decodes to the values the rows decode to."""
    import json

    return "{" + ",".join(f"{json.dumps(key)}:{text}" for key, text in rows) + "}"
