"""The cluster profile: what ``tune profile`` measures (:mod:`.plan`), the probe that runs on the
nodes (:mod:`.job`, torch only, shipped as a file), running it and the saved profile
(:mod:`.run`), and the rates the models take from it (:mod:`.rates`).

May import: :mod:`tuner.launch` (to run the probe), :mod:`tuner.space` and below. Never the loop,
report or CLI.
"""

from __future__ import annotations

from tuner.profile.run import ClusterProfile, load_profile, save_profile, study_profile

__all__ = ["ClusterProfile", "load_profile", "save_profile", "study_profile"]
