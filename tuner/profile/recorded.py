"""The stack's versions a cluster profile recorded, given to the study that reads it.

``tune profile``'s job records the versions of the stack it ran on (:func:`tuner.profile.job
.versions`: torch, the CUDA runtime torch was built with, NCCL, and ``CUDA_MODULE_LOADING`` as
the process ended up with it). Where a study states no ``cluster.overheads.stack``, those of
its cluster's valid profile decide what the versions change in the memory outside the
allocator (tuner.models.memory.stack); where it states one, its statement is used and a
disagreement with the record is one warning line.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from tuner.errors import ConfigError
from tuner.models.memory.stack import study_stack
from tuner.profile.run import ClusterProfile, study_profile
from tuner.spec.file import load_study
from tuner.spec.overheads import RecordedStack, StackVersions
from tuner.spec.study import StudySpec

logger = logging.getLogger(__name__)


def recorded_stack(profile: ClusterProfile) -> RecordedStack | None:
    """The stack's versions ``profile`` recorded, and which profile; None where it recorded
    none of them."""
    versions = StackVersions.recorded(profile.versions)
    if not versions.known:
        return None
    return RecordedStack(versions, f"cluster profile {profile.cluster} (measured "
                                   f"{profile.created})")  # fmt: skip


def profiled_study(
    spec: StudySpec, results: str | Path = "results", profile: ClusterProfile | None = None
) -> StudySpec:
    """``spec`` with the stack's versions its cluster's saved profile recorded
    (``recorded_stack``), read and checked here unless given; ``spec`` itself where there is
    no profile, or only a stale or foreign one (whose versions are not this cluster's now: the
    commands that read its figures refuse it in one line). A disagreement between the study's
    stated stack and the record is logged once, as a warning."""
    if profile is None:
        try:
            profile = study_profile(spec, results)
        except ConfigError:  # stale, foreign or malformed (ProfileError and its kin)
            return spec
    found = recorded_stack(profile) if profile is not None else None
    if found is None:
        return spec
    out = dataclasses.replace(
        spec, cluster=dataclasses.replace(spec.cluster, recorded_stack=found)
    )
    said = study_stack(out).disagreement
    if said:
        logger.warning("%s", said)
    return out


def study_with_profile(name: str, results: str | Path = "results") -> StudySpec:
    """The study ``name`` (``--study``) read, with the stack's versions its cluster's valid
    profile under ``results`` recorded (:func:`profiled_study`)."""
    return profiled_study(load_study(name), results)
