"""The loop over shared storage: ask, screen, launch, parse, tell (:mod:`.loop`; a worker's parts
assembled by :mod:`.build`).

Owns the Optuna storage (:mod:`.storage`), node leases shared by workers (:mod:`.leases`),
scheduling trials onto free nodes (:mod:`.schedule`), screening a config before launch
(:mod:`.screen`), recording a finished trial (:mod:`.record`), recovery and re-attach after a crash
(:mod:`.recovery`, :mod:`.reattach`) and stopping on signals (:mod:`.signals`).

May import: everything below it (search, calibrate, profile, launch, logs, models, config, spec).
Never the report or the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner import lazy_getattr

if TYPE_CHECKING:
    from tuner.study.build import build_loop
    from tuner.study.loop import StudyLoop
    from tuner.study.record import Summary

_EXPORTS = {
    "StudyLoop": "tuner.study.loop",
    "Summary": "tuner.study.record",
    "build_loop": "tuner.study.build",
}
"""Each public name and its module, imported on first use: importing one light module of this
package does not load the heavy ones."""

__all__ = ["StudyLoop", "Summary", "build_loop"]


__getattr__ = lazy_getattr(__name__, _EXPORTS)
