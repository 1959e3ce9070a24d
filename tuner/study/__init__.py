"""The loop over shared storage: ask, screen, launch, parse, tell (:mod:`.loop`).

Owns the Optuna storage (:mod:`.storage`), node leases shared by workers (:mod:`.leases`),
scheduling trials onto free nodes (:mod:`.schedule`), screening a config before launch
(:mod:`.screen`), recording a finished trial (:mod:`.record`), recovery and re-attach after a crash
(:mod:`.recovery`, :mod:`.reattach`) and stopping on signals (:mod:`.signals`).

May import: everything below it (search, calibrate, profile, launch, logs, models, config, spec).
Never the report or the CLI.
"""

from __future__ import annotations

from tuner.study.loop import StudyLoop, build_loop
from tuner.study.record import Summary

__all__ = ["StudyLoop", "Summary", "build_loop"]
