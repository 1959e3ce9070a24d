"""What the framework probe runs and measures (:mod:`tuner.profile.probe`): its runs, its rows,
its result."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tuner.config.parallel import ParallelConfig


@dataclass(frozen=True, slots=True)
class ProbeRun:
    """One run of the probe: a config of the space at ``depth`` layers per stage."""

    config: ParallelConfig
    depth: int
    batch_scale: int = 1
    """The run's global batch over the study's: more than 1 runs that many times the
    micro-batches per optimizer step (:data:`tuner.profile.probe.BATCH_SCALE`)."""

    @property
    def launched(self) -> ParallelConfig:
        """The config as it runs: ``config`` with ``batch_scale`` times its global batch."""
        if self.batch_scale == 1:
            return self.config
        gbs = self.config.global_batch_size * self.batch_scale
        return dataclasses.replace(self.config, global_batch_size=gbs)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeRow:
    """What one probe run measured (as the study's log parser read it)."""

    key: str
    """The config's key (``ParallelConfig.key``): found again in the space on load."""
    depth: int
    step_s: float
    samples_s: tuple[float, ...]
    peak_gib: float
    reserved_gib: float | None
    rounds: tuple[int, ...] = ()
    """The round (iteration) of each of ``samples_s`` when the probe interleaved its points'
    steps, so that samples of one round ran side by side (:func:`paired_offset`); empty when the
    points ran one after another."""
    rechecked: str = ""
    """Why the point was measured again after the probe's first pass, and which of its two runs
    is kept (:mod:`tuner.profile.recheck`); empty when it was not."""
    uncertain: str = ""
    """Why the point is still inconsistent after that (its samples are then both runs'); empty
    when it is not."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    """The probe's rows and what it cost."""

    rows: tuple[ProbeRow, ...]
    wall_s: float
    nodes: int
    versions: dict[str, str]
    recheck_s: float = 0.0
    """Of ``wall_s``, the seconds from the first pass's end to the job's: the points measured
    again (:mod:`tuner.profile.recheck`) and the wait for that verdict."""

    @property
    def node_hours(self) -> float:
        """Wall time x nodes held."""
        return self.wall_s * self.nodes / 3600.0
