"""Proxy trials in the study loop (``search.proxy``): launch a config's proxy on a fraction of
the nodes, record its extrapolated full-scale figure, confirm the best few at full scale.

A config the sampler proposes runs as its proxy (:func:`tuner.space.proxy.study_proxy`) on the
proxy's node count; the pool hands out groups of that size, so several proxies run at once on
disjoint nodes. When the proxy finishes, its log is read with the proxy's own global batch, and
the trial is told the full-scale step predicted from it (:func:`tuner.models.time.proxy.
extrapolate`): the sampler, the stop rules and the racing of other trials all see full-scale
figures. The record keeps both: ``proxy: true``, ``proxy_dp``, ``proxy_nodes``,
``proxy_step_s`` (measured) and ``step_time_s`` (extrapolated), with the extrapolation's
breakdown under ``proxy_extrapolation``.

When the search would stop (its budget of runs, its stop rules, an exhausted space), the
``search.proxy_confirm`` configs with the best figures that were measured only as proxies run at
full scale first, each once (a confirmation trial carries ``confirms``: the proxy trial's
number); a confirmation slower than another proxy's figure brings that one into the top in turn,
up to twice ``proxy_confirm`` confirmations in all. The best config is the best full-scale
measurement (:func:`full_scale_first`). A study stopped by the user, by its wall-time or
node-hour budget or by launch errors confirms nothing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState, create_trial

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.launch import JobResult
from tuner.models.rates import Rates
from tuner.models.stack import StackTerms
from tuner.models.time.proxy import ProxyBreakdown, extrapolate
from tuner.outcome import Outcome
from tuner.search.value import PURPOSE_ATTR
from tuner.space.enumerate import expand_axes
from tuner.space.proxy import Proxy, proxy_config, proxy_spec, study_proxy
from tuner.space.proxy_cost import Costing, LaunchScale
from tuner.space.shorten import SHORTENED, at_microbatches
from tuner.space.trials import config_params, distributions, measured
from tuner.spec.study import StudySpec
from tuner.study.budget import launch_refusal
from tuner.study.leases import BUDGET_LEASE, exclusive
from tuner.study.measure import FullStep, LogTail
from tuner.study.record import LAUNCH_ERRORS_STOP, Verdict, judge, metrics_attrs, physical

if TYPE_CHECKING:
    from tuner.study.schedule import Placement, Scheduler

logger = logging.getLogger(__name__)

MEASURED = (
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "tflops_per_gpu",
    "steady_step_s",
    "steady_halfwidth_s",
    "median_step_s",
)
"""A proxy's own figures, kept as ``proxy_step_s``, ``proxy_tokens_per_s``, ... beside the
full-scale ones the trial is ranked by."""
HARD_STOPS = (LAUNCH_ERRORS_STOP, "every node", "wall time", "node-hour")
"""Stop reasons (their beginnings) after which nothing more is launched, confirmations included."""


def is_proxy(t: FrozenTrial) -> bool:
    """Whether ``t``'s figure was extrapolated from a proxy, not measured at full scale."""
    return bool(t.user_attrs.get("proxy"))


def full_scale_first(done: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The measured trials a best may be chosen from: the full-scale ones when there are any."""
    full = [t for t in done if not is_proxy(t)]
    return full or list(done)


class Proxies:
    """Which of the loop's trials run as proxies, and what their figures say."""

    def __init__(self, spec: StudySpec, gpu: GPUSpec, rates: Rates | None,
                 terms: StackTerms | None = None) -> None:  # fmt: skip
        self.spec, self.gpu, self.rates = spec, gpu, rates
        self._costing = Costing(spec, gpu, rates, terms)  # a launch's cost, as the preview's
        self.on = spec.search.proxy is not False
        self._proxy: dict[int, Proxy] = {}
        self._pending: tuple[Any, ParallelConfig] | None = None
        self._size = spec.nodes_per_trial

    # -- placing and launching ----------------------------------------------------------------

    def size(self) -> int:
        """Nodes to ask the pool for next: what the waiting config needs, else the size of the
        last proxy (configs of one study mostly share it)."""
        if self._pending is not None:
            return self._need(*self._pending)
        return self._size

    def adopted(self, attrs: Mapping[str, Any]) -> None:
        """A dead worker's trial (its attributes ``attrs``) is watched by this worker now: when
        it is a proxy, the nodes it leaves free are asked for in its size (its config's proxies
        mostly share it), not a full trial's, which they may never reach while it runs."""
        if self.on and attrs.get("proxy"):
            self._size = int(attrs["proxy_nodes"])

    def pending(self) -> tuple[Any, ParallelConfig] | None:
        """A config asked earlier whose nodes were busy: it is launched before a new one."""
        picked, self._pending = self._pending, None
        return picked

    def _need(self, trial: Any, config: ParallelConfig) -> int:
        proxy = self._proxy.get(trial.number)
        return proxy.nodes if proxy is not None else self.spec.nodes_per_trial

    def nodes(self, trial: Any, config: ParallelConfig) -> int:
        """Nodes ``trial`` of ``config`` will hold: its proxy's, decided here once (a
        confirmation runs at full scale), else a full trial's."""
        if trial.number not in self._proxy:
            proxy = self._plan(trial.user_attrs, config)
            if proxy is not None:
                self._proxy[trial.number] = proxy
                self._size = proxy.nodes
        return self._need(trial, config)

    def scale(self, trial: Any, config: ParallelConfig) -> LaunchScale | None:
        """What ``trial`` of ``config`` runs at (:meth:`nodes`): its proxy's nodes and step
        (:class:`~tuner.space.proxy_cost.LaunchScale`), None at full scale."""
        self.nodes(trial, config)
        proxy = self._proxy.get(trial.number)
        step = trial.user_attrs.get("predicted_step_s")
        return None if proxy is None else self._costing.proxy_scale(proxy, step)

    def full_step(self, trial: Any, config: ParallelConfig) -> FullStep | None:
        """The map from what ``trial`` of ``config`` measures to the full-step figure the study
        records for it (:func:`full_step`), for racing it (:class:`tuner.study.measure.Watch`):
        through the extrapolation when it runs a proxy or fewer micro-batches per step (as this
        worker planned it, else as its attributes record: a dead worker's trial); None when it
        runs the config itself."""
        proxy = self._proxy.get(trial.number)
        if proxy is None:
            proxy = recorded_proxy(self.spec, trial.user_attrs, config)
        return full_step(self.spec, self.gpu, self.rates, proxy, config)

    def _plan(self, attrs: Mapping[str, Any], config: ParallelConfig) -> Proxy | None:
        """What runs for a trial of ``config``: its proxy (a confirmation has none), at the
        fewer micro-batches per step the screen chose when the config is too slow for the limit
        (``measured_microbatches``: :mod:`tuner.space.shorten`); None: the config itself."""
        proxy = None
        if self.on and "confirms" not in attrs:
            proxy = study_proxy(self.spec, config, self.gpu)
        return shortened_proxy(self.spec, attrs, config, proxy)

    def place(self, sched: Scheduler, trial: Any, config: ParallelConfig,
              placement: Placement) -> Placement | None:  # fmt: skip
        """The placement ``config`` runs on: ``placement`` when it has the right size, else a
        group of the size its proxy (or the full run) needs; None when those nodes are busy (the
        config waits: :meth:`pending`)."""
        need = self.nodes(trial, config)
        if placement.group.size == need:
            return placement
        sched.release(placement)
        placed = sched.acquire(need)
        if placed is None:
            self._pending = (trial, config)
        return placed

    def launch_as(self, trial: Any, config: ParallelConfig) -> tuple[StudySpec, ParallelConfig]:
        """The spec and config the launcher renders for ``trial``: its proxy's, if it has one
        (recorded on the trial before it starts). A confirmation, placed on a full trial's
        nodes without :meth:`nodes`, is planned here: at fewer micro-batches when its config is
        too slow for the limit at its own."""
        self.nodes(trial, config)
        proxy = self._proxy.get(trial.number)
        if proxy is None:
            return self.spec, config
        if proxy.config.dp < config.dp:  # a proxy at a smaller DP (else: fewer micro-batches)
            trial.set_user_attr("proxy", True)
            trial.set_user_attr("proxy_dp", proxy.config.dp)
            trial.set_user_attr("proxy_nodes", proxy.nodes)
            trial.set_user_attr("proxy_global_batch", proxy.config.global_batch_size)
            trial.set_user_attr("proxy_predicted_peak_gib", round(proxy.peak_gib, 3))
        return proxy_spec(self.spec, proxy), proxy.config

    def judge(self, trial: Any, config: ParallelConfig, result: JobResult,
              tail: LogTail | None = None) -> Verdict:  # fmt: skip
        """The verdict of ``trial``'s finished job as the study records it: a proxy's log is
        read with its own global batch, and its measured step becomes the extrapolated
        full-scale step (:func:`extrapolated`). A proxy this worker did not launch (a dead
        worker's job it watches now) is known from the trial's attributes. ``tail``: the
        watch's tail of the job's logs (:func:`tuner.study.record.judge`)."""
        judged: list[Verdict] = []  # judge always answers: the one verdict it gave

        def read(ran: StudySpec) -> Verdict:
            judged.append(judge(ran, self.gpu, result, tail))
            return judged[0]

        verdict = trial_verdict(self.spec, self.gpu, self.rates, trial.user_attrs, config, read,
                                proxy=self._proxy.pop(trial.number, None))  # fmt: skip
        return verdict or judged[0]

    # -- confirming at full scale -------------------------------------------------------------

    def due(self, trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
        """The proxy trials to confirm now: among the ``proxy_confirm`` best configs, those
        measured only as proxies and not confirmed (or tried) yet; empty while a proxy runs."""
        if not self.on or any(
            t.state == TrialState.RUNNING and is_proxy(t) for t in trials
        ):  # fmt: skip
            return []
        tried = [t for t in trials if "confirms" in t.user_attrs]
        if len(tried) >= 2 * self.spec.search.proxy_confirm:
            return []
        done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None
                and t.user_attrs.get("outcome") == str(Outcome.OK)]  # fmt: skip
        figure = measured(done)  # per config: its full-scale measurement, else its proxy's
        attempted = {str(t.user_attrs.get("key")) for t in tried}
        full = {str(t.user_attrs.get("key")) for t in done if not is_proxy(t)}
        ranked = sorted(figure.values(), key=lambda t: float(t.value or 0.0))
        top = ranked[: self.spec.search.proxy_confirm]
        return [t for t in top if is_proxy(t) and str(t.user_attrs.get("key")) not in
                full | attempted]  # fmt: skip

    def confirm(self, loop: Any, trials: list[FrozenTrial]) -> None:
        """Once ``loop`` (a :class:`tuner.study.loop.StudyLoop`) has a stop reason, launch the
        confirmations its nodes allow, and clear the reason while some are due or running."""
        if self._confirming(loop, trials):
            loop.summary.stop_reason = ""

    def _confirming(self, loop: Any, trials: list[FrozenTrial]) -> bool:
        reason = loop.summary.stop_reason
        if not self.on or not reason or loop.stop_requested or reason.startswith(HARD_STOPS):
            return False
        running = any("confirms" in r.trial.user_attrs for r in loop.running.values())
        if not self.due(trials):
            return running
        # Claimed through the storage: under the study's budget lease, with the trials read
        # again inside it, so a worker that read the same due list before another's
        # confirmation existed sees it now and launches nothing.
        with exclusive(loop.leases, BUDGET_LEASE, loop.worker, loop.heartbeat_s) as turn:
            if not turn:
                return True  # another worker is launching: look again on the next pass
            due = self.due(loop.trials())
            for target in due:
                if (why := self._over_budget(loop, target)) is not None:
                    loop.summary.stop_reason = why  # max_node_hours holds for confirmations too
                    return running
                placement = loop.scheduler.acquire(self.spec.nodes_per_trial)
                if placement is None:
                    return True
                self._launch_confirmation(loop, target, placement)
                running = True
        return running or bool(due)

    def _over_budget(self, loop: Any, target: FrozenTrial) -> str | None:
        """Why confirming ``target`` could pass ``search.max_node_hours`` (None: it may run)."""
        key = f"confirming {target.user_attrs.get('key')}"
        return launch_refusal(loop, target.user_attrs, key, None)

    def _launch_confirmation(self, loop: Any, target: FrozenTrial, placement: Placement) -> None:
        config = ParallelConfig(**target.user_attrs["config"])
        params = config_params(config, expand_axes(self.spec))
        # a config too slow for the limit at its full micro-batches is confirmed at the fewer
        keep = ("config", "key", *SHORTENED)  # it was measured at (SHORTENED): at full DP
        attrs = {k: v for k, v in target.user_attrs.items()
                 if k in keep or k.startswith("predicted_")}  # fmt: skip
        attrs.update(confirms=target.number, **{PURPOSE_ATTR: "confirmation"})
        # Created running with its parameters, not enqueued and asked: an ask pops the oldest
        # waiting trial, which may be a re-run the recovery queued; this config would then run
        # under that trial's parameters and the confirmation wait in the queue for ever.
        dists = distributions(self.spec)
        frozen = create_trial(state=TrialState.RUNNING, params=params, user_attrs=attrs,
                              distributions={k: dists[k] for k in params})  # fmt: skip
        study = loop.study
        trial = optuna.Trial(study, study._storage.create_new_trial(study._study_id, frozen))
        logger.info("trial %d confirms trial %d's proxy figure at full scale",
                    trial.number, target.number)  # fmt: skip
        loop.launch(trial, config, placement)
        loop.summary.launched += 1


def trial_verdict(spec: StudySpec, gpu: GPUSpec, rates: Rates | None, attrs: Mapping[str, Any],
                  config: ParallelConfig, read: Callable[[StudySpec], Verdict | None], *,
                  proxy: Proxy | None = None) -> Verdict | None:  # fmt: skip
    """The verdict the study records for a trial of ``config`` whose job finished: ``read``
    (given the spec the job ran with: the proxy's global batch and node count for a proxy)
    reads it, and a proxy's figure becomes the extrapolated full-scale one at ``rates`` (the
    cluster profile's when the study has one). The one path for a job this worker watched
    (:meth:`Proxies.judge`) and a lost trial's recovered result
    (:class:`tuner.study.recovery.Recovery`), so both extrapolate from the same inputs.
    ``proxy``: the proxy this worker launched, else the one ``attrs`` record (None: full
    scale). None when ``read`` finds nothing."""
    proxy = proxy if proxy is not None else recorded_proxy(spec, attrs, config)
    verdict = read(spec if proxy is None else proxy_spec(spec, proxy))
    if verdict is None or "proxy_extrapolation" in verdict.metrics:
        return verdict  # a metrics.json written after the extrapolation: never twice
    if proxy is None:
        return verdict
    # the proxy's step was judged against its own run; the full-scale figure against the study's
    return physical(spec, gpu, extrapolated(spec, gpu, rates, proxy, config, verdict))


def recorded_proxy(spec: StudySpec, attrs: Mapping[str, Any], full: ParallelConfig,
                   ) -> Proxy | None:  # fmt: skip
    """The proxy a trial ran as, from its attributes (None: it ran ``full`` as it is)."""
    proxy = None
    if attrs.get("proxy"):
        config = proxy_config(full, int(attrs["proxy_dp"]))
        peak = float(attrs.get("proxy_predicted_peak_gib") or 0.0)
        proxy = Proxy(config, int(attrs["proxy_nodes"]), spec.nodes_per_trial, peak)
    return shortened_proxy(spec, attrs, full, proxy)


def shortened_proxy(spec: StudySpec, attrs: Mapping[str, Any], full: ParallelConfig,
                    proxy: Proxy | None) -> Proxy | None:  # fmt: skip
    """``proxy`` (or ``full`` itself, on a full trial's nodes, when None) at the micro-batches
    per step ``attrs`` record (``measured_microbatches``: the config is too slow for the limit,
    :mod:`tuner.space.shorten`); ``proxy`` unchanged when they record none. The extrapolation
    from what runs to ``full`` then covers both the DP and the micro-batches."""
    m = attrs.get("measured_microbatches")
    if m is None:
        return proxy
    if proxy is None:
        peak = float(attrs.get("predicted_peak_gib") or 0.0)
        nodes = spec.nodes_per_trial
        return Proxy(at_microbatches(full, int(m)), nodes, nodes, peak)
    return dataclasses.replace(proxy, config=at_microbatches(proxy.config, int(m)))


def full_step(spec: StudySpec, gpu: GPUSpec, rates: Rates | None, proxy: Proxy | None,
              config: ParallelConfig) -> FullStep | None:  # fmt: skip
    """What a measured step of ``proxy`` (a smaller DP, fewer micro-batches per step, or both)
    says ``config``'s full step is: :func:`tuner.models.time.proxy.extrapolate` at ``rates``,
    monotone in the measured step (the model's step grows with the factor on its per-rank work
    that explains it). The one map the recorded figure (:func:`extrapolated`) and the racing of
    a running trial (:class:`tuner.study.measure.Watch`) read; None when ``proxy`` is None (the
    config runs as it is: its measured step is its figure)."""
    return None if proxy is None else _to_full(spec, gpu, rates, proxy.config, config)


def _to_full(spec: StudySpec, gpu: GPUSpec, rates: Rates | None, runs: ParallelConfig,
             config: ParallelConfig) -> FullStep:  # fmt: skip
    def to_full(measured: float) -> float:
        return _extrapolate(spec, gpu, rates, runs, config, measured).step_s

    return to_full


def _extrapolate(spec: StudySpec, gpu: GPUSpec, rates: Rates | None, runs: ParallelConfig,
                 config: ParallelConfig, measured: float) -> ProxyBreakdown:  # fmt: skip
    return extrapolate(spec.model, spec.training, config, runs, measured, gpu,
                       spec.cluster.gpus_per_node, spec.framework, rates)  # fmt: skip


def extrapolated(spec: StudySpec, gpu: GPUSpec, rates: Rates | None, proxy: Proxy | None,
                 config: ParallelConfig, verdict: Verdict) -> Verdict:  # fmt: skip
    """``verdict`` with a proxy's measured step replaced by the extrapolated full-scale one
    (and the tokens/s and MFU of the full run); what the proxy measured stays under
    ``proxy_*`` names (:data:`MEASURED`). Unchanged for a full-scale trial or a failed one.
    The steady-state interval is mapped through the same extrapolation (:func:`full_step`):
    its mean, and as half-width its upper end less that mean (the end other trials are raced
    against: :func:`tuner.study.measure.incumbent_high`)."""
    measured = verdict.metrics.get("step_time_s")
    if proxy is None or verdict.outcome != Outcome.OK or not measured:
        return verdict
    to_full = _to_full(spec, gpu, rates, proxy.config, config)  # full_step's, for this proxy
    found = _extrapolate(spec, gpu, rates, proxy.config, config, float(measured))
    step = found.step_s
    full = metrics_attrs(spec, gpu, SimpleNamespace(
        step_time_s=step, iterations=None, peak_memory_gib=None, peak_reserved_gib=None,
        tflops_per_gpu=None, samples_per_s=None))  # fmt: skip
    m = dict(verdict.metrics)
    for name in MEASURED:  # step_time_s -> proxy_step_s, tokens_per_s -> proxy_tokens_per_s
        if m.get(name) is not None:
            m["proxy_" + name.replace("step_time_s", "step_s")] = m[name]
    mean, half = m.get("steady_step_s"), m.get("steady_halfwidth_s")
    if mean is not None:  # racing reads full-step figures, mapped as a running trial's are
        at = step if float(mean) == float(measured) else to_full(float(mean))
        m["steady_step_s"] = at
        if half is not None:
            m["steady_halfwidth_s"] = to_full(float(mean) + float(half)) - at
    m.pop("median_step_s", None)  # the proxy's, kept as proxy_median_step_s
    m.update(
        step_time_s=step,
        tokens_per_s=full["tokens_per_s"],
        mfu=full["mfu"],
        tflops_per_gpu=None,
        samples_per_s=None,
        proxy_extrapolation=found.to_dict(),
    )
    return dataclasses.replace(verdict, metrics=m)
