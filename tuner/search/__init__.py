"""Choosing what to launch next: the model-guided Optuna sampler (:mod:`.sampler`; every sampler
by name, :mod:`.samplers`) and when a study should stop (:mod:`.stopping`).

May import: :mod:`tuner.calibrate` and below. Never the loop, launchers or the CLI: the sampler
never sees a host, a job or a log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner import lazy_getattr

if TYPE_CHECKING:
    from tuner.search.sampler import ModelGuidedSampler
    from tuner.search.samplers import make_sampler
    from tuner.search.stopping import Stopper

_EXPORTS = {
    "ModelGuidedSampler": "tuner.search.sampler",
    "Stopper": "tuner.search.stopping",
    "make_sampler": "tuner.search.samplers",
}
"""Each public name and its module, imported on first use: importing one light module of this
package does not load the heavy ones."""

__all__ = ["ModelGuidedSampler", "Stopper", "make_sampler"]


__getattr__ = lazy_getattr(__name__, _EXPORTS)
