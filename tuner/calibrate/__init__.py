"""Corrections learned from measurements: a Bayesian correction of the models per knob
(:mod:`.correction`), the lasting store of measured trials per cluster (:mod:`.store`), and the
models as corrected by them (:mod:`.calibrated`).

May import: :mod:`tuner.space` and below. Never the sampler, the loop, launchers or the CLI.
"""

from __future__ import annotations

from tuner.calibrate.calibrated import Corrector, corrector_for
from tuner.calibrate.store import Calibration, Observation, load_calibration, save_calibration

__all__ = [
    "Calibration", "Corrector", "Observation", "corrector_for", "load_calibration",
    "save_calibration",
]  # fmt: skip
