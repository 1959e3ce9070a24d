"""Corrections learned from measurements: a Bayesian correction of the models per knob
(:mod:`.correction`), the lasting store of measured trials per cluster (:mod:`.store`), and the
models as corrected by them (:mod:`.calibrated`).

May import: :mod:`tuner.space` and below. Never the sampler, the loop, launchers or the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner import lazy_getattr

if TYPE_CHECKING:
    from tuner.calibrate.calibrated import Corrector, corrector_for
    from tuner.calibrate.store import Calibration, Observation, load_calibration, save_calibration

_EXPORTS = {
    "Calibration": "tuner.calibrate.store",
    "Corrector": "tuner.calibrate.calibrated",
    "Observation": "tuner.calibrate.store",
    "corrector_for": "tuner.calibrate.calibrated",
    "load_calibration": "tuner.calibrate.store",
    "save_calibration": "tuner.calibrate.store",
}
"""Each public name and its module, imported on first use: importing one light module of this
package does not load the heavy ones."""

__all__ = [
    "Calibration",
    "Corrector",
    "Observation",
    "corrector_for",
    "load_calibration",
    "save_calibration",
]


__getattr__ = lazy_getattr(__name__, _EXPORTS)
