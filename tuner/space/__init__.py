"""The search space: every config a study allows, checked by the rules and ranked by the models.

Owns enumeration and ranking (:mod:`.enumerate`; a space too large to hold, streamed:
:mod:`.stream`), the encoding of a config as a trial's parameters and back (:mod:`.trials`), and
when a memory probe is worth its launch (:mod:`.probes`).

May import: :mod:`tuner.models` and below. Never calibration, the sampler, the loop, launchers or
the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner import lazy_getattr

if TYPE_CHECKING:
    from tuner.space.candidates import Candidate, SpaceReport
    from tuner.space.enumerate import enumerate_space, study_gpu
    from tuner.space.stream import stream_space

_EXPORTS = {
    "Candidate": "tuner.space.candidates",
    "SpaceReport": "tuner.space.candidates",
    "enumerate_space": "tuner.space.enumerate",
    "study_gpu": "tuner.space.enumerate",
    "stream_space": "tuner.space.stream",
}
"""Each public name and its module, imported on first use: importing one light module of this
package does not load the heavy ones."""

__all__ = ["Candidate", "SpaceReport", "enumerate_space", "stream_space", "study_gpu"]


__getattr__ = lazy_getattr(__name__, _EXPORTS)
