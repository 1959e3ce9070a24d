"""A worker of a study assembled: the storage and the study in it, the leases, the executor, the
node pool, the results layout, and the space, cluster profile and sampler the loop asks with
(:func:`build_loop`). What runs it is :class:`tuner.study.loop.StudyLoop`."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from tuner.calibrate.store import history
from tuner.launch import NodePool
from tuner.layout import ResultsLayout
from tuner.outcome import Outcome
from tuner.profile.rates import study_rates
from tuner.profile.stack_terms import study_terms
from tuner.search.samplers import make_sampler
from tuner.space.enumerate import SharedSpace
from tuner.spec.study import StudySpec
from tuner.study.faults import StorageWatch
from tuner.study.launchers import make_executor, template_launcher
from tuner.study.leases import open_leases
from tuner.study.loop import Launcher, StudyLoop
from tuner.study.storage import check_results_dir, start_study
from tuner.study.url import check_arguments, resolve_url

__all__ = ["build_loop"]


def build_loop(
    spec: StudySpec, *, storage: str | None = None, results: str = "results", force: bool = False,
    n_trials: int | None = None, launcher: Launcher = template_launcher,
    executor: Any = None, on_update: Callable[[StudyLoop], None] | None = None,
    rerun: Collection[Outcome] = (), keep: Collection[str] | None = None,
) -> StudyLoop:  # fmt: skip
    """Everything a worker needs: storage, study, leases, executor, node pool, results layout.
    ``keep``: the only configs (by key) the study may launch (:class:`SharedSpace`); None, the
    whole space."""
    layout = ResultsLayout(Path(results).resolve(), spec.name)
    check_results_dir(layout)
    where = resolve_url(storage, layout)  # a --storage no driver takes: said first
    if where.journal is None:
        check_arguments(where)
    rates = study_rates(spec, results)  # the cluster's measured profile, if any
    # + the probe's terms; only the configs ``keep`` names, when given
    space = SharedSpace(spec, rates, study_terms(spec, results, rates), keep)
    sampler = make_sampler(spec, history(spec, results), rates, space)  # + saved calibration
    # Made just before the study it holds, and removed if the study is not made in it: a Ctrl-C
    # (or a refusal) while the space was built, or in the schema's creation, left a database
    # without the study, which the next leaderboard said it was not in.
    opened, study = start_study(spec, sampler, url=storage, layout=layout,
                                heartbeat_s=spec.search.heartbeat_s, force=force)  # fmt: skip
    pool = NodePool(spec.node_names, spec.nodes_per_trial, base_port=spec.launch.master_port)
    loop = StudyLoop(
        spec, study, executor or make_executor(spec), pool, layout, launcher, storage=opened,
        leases=open_leases(storage, layout), n_trials=n_trials, on_update=on_update, rerun=rerun,
        rates=rates, space=space,
    )  # fmt: skip
    loop.storage_watch = StorageWatch(where.local_file, where.url)
    return loop
