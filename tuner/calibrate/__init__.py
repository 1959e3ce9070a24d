"""Corrections learned from measurements: a Bayesian correction of the models per knob
(:mod:`.correction`), the lasting store of measured trials per cluster (:mod:`.store`), and the
models as corrected by them (:mod:`.calibrated`).

May import: :mod:`tuner.space` and below. Never the sampler, the loop, launchers or the CLI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
