"""tuner: find the fastest parallel configuration for training with Megatron-LM, DeepSpeed,
Megatron-Bridge or torchtitan.

The Python API, for a notebook or a script (``tune`` is the command line over the same calls)::

    import tuner

    spec = tuner.load_study("gpt-70b")             # a name, or a path to a study file
    report = tuner.enumerate_space(spec)           # counts and viable configs, ranked
    print(report.counts(), report.ranked()[0].config)
    print(tuner.estimate(spec, tp=8, pp=4).to_dict())
    summary = tuner.run(spec, n_trials=10)         # real short runs (the study's cluster)
    board = tuner.leaderboard(spec)                # a pandas DataFrame, fastest first
    best = tuner.best(spec)                        # the fastest measured trial: a TrialRecord
    best.config, best.measured["measured_step_s"]  # what tune best shows
    best.export("script").path                     # results/<study>/exports/trial-<n>/launch.sh

Names load on first use: ``import tuner`` itself imports nothing heavy (no Optuna, no pandas).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.api import Estimate, best, estimate, run
    from tuner.config.parallel import ParallelConfig
    from tuner.logs.versions import DISTRIBUTION
    from tuner.models.memory.estimate import MemoryBreakdown, estimate_memory
    from tuner.models.time.estimate import TimeBreakdown, estimate_time
    from tuner.report.export import TrialRecord
    from tuner.report.leaderboard import leaderboard
    from tuner.space.enumerate import SpaceReport, enumerate_space, study_gpu
    from tuner.spec.file import load_study
    from tuner.spec.study import StudySpec
    from tuner.study.record import Summary

    __version__: str

_LAZY = {
    "DISTRIBUTION": "tuner.logs.versions",
    "load_study": "tuner.spec.file",
    "StudySpec": "tuner.spec.study",
    "ParallelConfig": "tuner.config.parallel",
    "enumerate_space": "tuner.space.enumerate",
    "SpaceReport": "tuner.space.enumerate",
    "study_gpu": "tuner.space.enumerate",
    "estimate_memory": "tuner.models.memory.estimate",
    "MemoryBreakdown": "tuner.models.memory.estimate",
    "estimate_time": "tuner.models.time.estimate",
    "TimeBreakdown": "tuner.models.time.estimate",
    "estimate": "tuner.api",
    "Estimate": "tuner.api",
    "run": "tuner.api",
    "best": "tuner.api",
    "leaderboard": "tuner.report.leaderboard",
    "TrialRecord": "tuner.report.export",
    "Summary": "tuner.study.loop",
}

# Written out (not built from _LAZY) so that linters and type checkers read it; a test checks that
# the two agree.
__all__ = [
    "DISTRIBUTION", "Estimate", "MemoryBreakdown", "ParallelConfig", "SpaceReport", "StudySpec",
    "Summary", "TimeBreakdown", "TrialRecord", "__version__", "best", "enumerate_space",
    "estimate", "estimate_memory", "estimate_time", "leaderboard", "load_study", "run",
    "study_gpu",
]  # fmt: skip


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562): each name of ``exports`` imported from its
    module on first use and kept in the package's namespace (later look-ups do not come back),
    so that importing one light module of a package does not load its heavy ones."""
    namespace = sys.modules[package].__dict__

    def get(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(exports[name]), name)
        return value

    return get


_get = lazy_getattr(__name__, _LAZY)


def __getattr__(name: str) -> Any:
    if name != "__version__":
        return _get(name)
    version: str = importlib.import_module("tuner.logs.versions").tuner_version()
    globals()[name] = version
    return version


def __dir__() -> list[str]:
    """Only the public names (not the imports and helpers of this module)."""
    return sorted(__all__)
