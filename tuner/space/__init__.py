"""The search space: every config a study allows, checked by the rules and ranked by the models.

Owns enumeration and ranking (:mod:`.enumerate`), the encoding of a config as a trial's
parameters and back (:mod:`.trials`), and when a memory probe is worth its launch
(:mod:`.probes`).

May import: :mod:`tuner.models` and below. Never calibration, the sampler, the loop, launchers or
the CLI.
"""

from __future__ import annotations

from tuner.space.enumerate import Candidate, SpaceReport, enumerate_space, study_gpu

__all__ = ["Candidate", "SpaceReport", "enumerate_space", "study_gpu"]
