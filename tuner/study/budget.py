"""``max_node_hours`` enforced before a launch that could pass it, not after; the start-up the
loop's costs charge.

A launch is refused when what was spent, plus what the running trials may still spend up to
their time limits, plus the new trial's worst case (its limit, or its ``train_iters`` cap when
that comes first: :class:`tuner.space.cost.TrialCost`) would pass the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.calibrate.store import launch_overhead_s, measured_startup_s, setup_fingerprint
from tuner.space.cost import with_startup
from tuner.space.proxy_cost import LaunchScale, launch_cost
from tuner.spec.study import StudySpec


def pending_node_hours(running: Mapping[int, Any], now: float) -> float:
    """What running trials (:class:`tuner.study.schedule.Running` by number) may still spend up to
    their time limits, node-hours."""
    seconds = 0.0
    for r in running.values():
        left = float(r.job.request.timeout_s or 0.0) - (now - float(r.started))
        seconds += max(0.0, left) * len(r.group.hosts)
    return seconds / 3600


def spent_node_hours(
    trials: Sequence[FrozenTrial], running: Mapping[int, Any], now: float
) -> float:
    """Node-hours of every finished launched trial (its duration on its hosts) plus what the
    running trials (:class:`tuner.study.schedule.Running` by number) have run so far."""
    done = sum(
        float(t.user_attrs.get("duration_s", 0.0)) * len(t.user_attrs.get("hosts", []))
        for t in trials if t.state != TrialState.RUNNING
    )  # fmt: skip
    live = sum((now - float(r.started)) * len(r.group.hosts) for r in running.values())
    return (done + live) / 3600


def node_hour_refusal(
    spec: StudySpec, committed: float, attrs: Mapping[str, Any], key: str,
    scale: LaunchScale | None = None,
) -> str | None:  # fmt: skip
    """Why the trial of config ``key`` (its attributes ``attrs`` hold its predicted step time)
    must not start under ``search.max_node_hours`` with ``committed`` node-hours spent or held
    by running trials; None: it may. ``scale``: what the trial runs at when not a full trial
    (a proxy: its launch's worst case, :func:`tuner.space.proxy_cost.launch_cost`, the
    config's time limit on the proxy's nodes)."""
    budget = spec.search.max_node_hours
    if not budget:
        return None
    worst = launch_cost(spec, attrs.get("predicted_step_s"), scale).worst_node_hours
    if committed + worst <= budget:
        return None
    return (
        f"node-hour budget of {budget:g}: {committed:.2f} spent or committed, and the next "
        f"trial ({key}) could take {worst:.2f}"
    )


def launch_refusal(
    loop: Any, attrs: Mapping[str, Any], key: str, scale: LaunchScale | None
) -> str | None:
    """:func:`node_hour_refusal` for a launch by ``loop`` (a
    :class:`tuner.study.loop.StudyLoop`) of a trial at ``scale`` (None: a full trial):
    committed is what the study spent plus what this worker's running trials may still spend,
    the new trial's limit is cut from the start-up launches measured (``loop.costs``)."""
    if not loop.spec.search.max_node_hours:
        return None  # no budget: no read
    committed = loop.node_hours(loop.trials()) + pending_node_hours(loop.running, loop.clock())
    return node_hour_refusal(loop.costs.spec, committed, attrs, key, scale)


class LaunchCosts:
    """The study spec the loop's trial limits and ``max_node_hours`` checks read: the study's own,
    with ``search.startup_min`` (the user's estimate) replaced by the start-up this setup's
    launches measured once there is one (:func:`tuner.calibrate.store.measured_startup_s`), as
    the sampler's costs and the ``--dry-run`` preview read it. One figure for all three: a limit
    cut from a guessed 3-minute start-up where launches take 12 s holds a hung trial 4 minutes
    longer, and one where they take 8 minutes kills every trial before its first iteration."""

    def __init__(self, spec: StudySpec, sampler: Any) -> None:
        self._spec, self._sampler = spec, sampler
        self._fingerprint = setup_fingerprint(spec)
        self._seen = -1
        self.spec = spec
        """What the next launch's limit and worst case are cut from."""

    def see(self, trials: Sequence[FrozenTrial], finished: int | None = None) -> None:
        """Update :attr:`spec` from ``trials``, of which ``finished`` are finished (counted
        here when not given): read again only when more have finished."""
        count = sum(t.state.is_finished() for t in trials) if finished is None else finished
        if count == self._seen:
            return
        self._seen = count
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        measured = getattr(self._sampler, "measured_startup_s", None)
        if measured is not None:  # the model sampler: with the saved calibration's launches
            found = measured(trials)
        else:
            own = (launch_overhead_s(t.user_attrs) for t in done)
            found = measured_startup_s((), self._fingerprint, own)
        self.spec = with_startup(self._spec, found)
