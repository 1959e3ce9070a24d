"""Choosing what to launch next: the model-guided Optuna sampler (:mod:`.sampler`) and when a
study should stop (:mod:`.stopping`).

May import: :mod:`tuner.calibrate` and below. Never the loop, launchers or the CLI: the sampler
never sees a host, a job or a log.
"""

from __future__ import annotations

from tuner.search.sampler import ModelGuidedSampler, make_sampler
from tuner.search.stopping import Stopper

__all__ = ["ModelGuidedSampler", "Stopper", "make_sampler"]
