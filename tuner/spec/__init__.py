"""The study file: what a user writes, read strictly into frozen dataclasses.

Owns the study dataclasses (:mod:`.study`), the cluster, MoE and overheads sections, the bounds
every number is checked against, where study files are found (:mod:`.paths`) and how they load
(:mod:`.file`), and the knobs' vocabulary the file is written in: framework names and traits
(:mod:`.frameworks`), pipeline split syntax, DeepSpeed partition methods, recompute and FP8
spellings.

May import: :mod:`tuner.errors`, :mod:`tuner.layout`, :mod:`tuner.catalog` (and the standard
library, yaml). Never a model, the search, the loop, the launchers or the CLI.
"""

from __future__ import annotations

from tuner.spec.file import load_study
from tuner.spec.frameworks import traits
from tuner.spec.study import (
    LaunchSpec,
    ModelSpec,
    SearchSpec,
    SpaceSpec,
    StudySpec,
    TrainingSpec,
)

__all__ = [
    "LaunchSpec", "ModelSpec", "SearchSpec", "SpaceSpec", "StudySpec", "TrainingSpec",
    "load_study", "traits",
]  # fmt: skip
