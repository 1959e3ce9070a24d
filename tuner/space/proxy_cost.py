"""What a study that measures through proxies (``search.proxy``) costs before it runs.

A config with a proxy (:func:`tuner.space.proxy.study_proxy`) is launched first as that proxy:
the same per-rank work at a smaller DP size on fewer nodes. Its trial lasts about as long as the
full-scale one would (the per-rank work is the same: a proxy saves node-hours, not minutes) but
holds fewer nodes; its predicted step is the time model's for the proxy config under the same
rates and measured terms as the full config's, and its time limit is the full config's (the loop
sets a trial's limit from the config's predicted full-scale step). The ``search.proxy_confirm``
best proxied configs then run again at full scale (a *confirmation*), up to twice as many when
a confirmation comes out slower than another proxy's figure (:mod:`tuner.study.proxy`).

So the study's expected node-hours are its first launches (fastest predicted first) each at its
proxy's cost where it has one, plus ``proxy_confirm`` confirmations of the fastest predicted
proxied ones at full scale; the worst case is the costliest launches each running to its limit
or cap (at its proxy's nodes where it has one) plus ``2 x proxy_confirm`` confirmations doing
the same at full scale.

What a config's first launch costs (:func:`launch_cost`, from its :class:`LaunchScale`) is one
definition: the preview's per-config proxy columns, the model sampler's price of a launch (its
expected improvement per node-hour and stop rule 2's cost: :mod:`tuner.search.sampler`) and the
``max_node_hours`` check before a launch (:mod:`tuner.study.budget`) all read it. A config too
slow for the user's limit runs at fewer micro-batches per step (:mod:`tuner.space.shorten`), its
proxy at as many: its launch is priced at the step it runs (:meth:`Costing.first_launch`).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.models.rates import Rates
from tuner.models.stack import StackTerms
from tuner.models.time.estimate import estimate_time
from tuner.space.cost import BudgetCost, TrialCost, trial_cost
from tuner.space.proxy import Proxy, study_proxy
from tuner.space.shorten import Shortened, at_microbatches, too_slow
from tuner.spec.study import StudySpec

WORST_WALK = 256
"""The most configs whose proxy is worked out for the worst case (a few ms each); past them a
config's full-scale worst case, which bounds its proxy's from above, stands in for it, so the
stated worst case stays an upper bound on spaces of any size."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchScale:
    """What a config's first launch runs at, against its full-scale trial: a proxy's nodes and
    step."""

    nodes: int
    """The nodes the launch holds: the proxy's."""
    step_ratio: float
    """The launch's predicted step per predicted full-scale step (the time model's proxy step
    over its full-scale one): a proxy's per-rank work is the full config's, so a correction
    measured on either carries to the other as one factor."""
    dp: int
    """The proxy's data-parallel size."""


def launch_cost(spec: StudySpec, step_s: float | None, scale: LaunchScale | None) -> TrialCost:
    """The trial a config's first launch is when its full-scale step is ``step_s``: the
    full-scale trial (``scale`` None), else the proxy's: its iterations at the proxy's step on
    the proxy's nodes, under the full config's time limit (the loop sets a trial's limit from the
    config's full-scale step)."""
    full = trial_cost(spec, step_s)
    if scale is None:
        return full
    at = dataclasses.replace(
        spec, search=dataclasses.replace(spec.search, nodes_per_trial=scale.nodes)
    )
    own = trial_cost(at, step_s * scale.step_ratio if step_s else None)
    iterations = own.minutes - spec.search.startup_min
    return dataclasses.replace(own, limit_minutes=full.limit_minutes,
                               fits=iterations <= full.limit_minutes)  # fmt: skip


def launch_node_hours(spec: StudySpec, step_s: np.ndarray, nodes: np.ndarray | float,
                      step_ratio: np.ndarray | float) -> np.ndarray:  # fmt: skip
    """:attr:`TrialCost.node_hours` of :func:`launch_cost` for many launches at once, each on
    ``nodes`` at ``step_ratio`` of its full-scale step ``step_s``: the start-up charged per
    launch plus the shortest useful trial's iterations, per node and linear in the step (the
    time limit and the ``train_iters`` cap left out: they bound a trial's node-hours only where
    the start-up is most of it)."""
    per_node = dataclasses.replace(
        spec, search=dataclasses.replace(spec.search, nodes_per_trial=1)
    )
    startup = trial_cost(per_node, None).node_hours
    per_second = trial_cost(per_node, 1.0).node_hours - startup
    return np.asarray(nodes * (startup + per_second * step_ratio * step_s))


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigCost:
    """One config's trials: the full-scale one, and its proxy's when it is measured as one."""

    full: TrialCost
    """Its full-scale trial: the only one without a proxy, the confirmation with one."""
    proxy: TrialCost | None = None
    """Its proxy's trial, at the proxy's nodes (None: it runs at full scale)."""
    proxy_step_s: float | None = None
    """The time model's step of the proxy config."""
    proxy_dp: int | None = None
    """The proxy's data-parallel size."""

    @property
    def launch(self) -> TrialCost:
        """The trial its first launch is: the proxy's, else the full-scale one."""
        return self.proxy or self.full


class Costing:
    """A config's :class:`ConfigCost` under the study's ``search.proxy``, its proxy's step from
    the time model at ``rates`` and ``terms`` (the full config's own prediction is given)."""

    def __init__(self, spec: StudySpec, gpu: GPUSpec, rates: Rates | None = None,
                 terms: StackTerms | None = None,
                 fewer: Mapping[str, Shortened] | None = None) -> None:  # fmt: skip
        """``fewer``: configs measured at fewer micro-batches per step, by key
        (:mod:`tuner.space.shorten`): their proxies run at as many."""
        self.spec, self.gpu, self.rates, self.terms = spec, gpu, rates, terms
        self.fewer = fewer or {}
        self.on = spec.search.proxy is not False
        self._seen: dict[str, ConfigCost] = {}
        self._scales: dict[str, LaunchScale | None] = {}

    def __call__(self, config: ParallelConfig, step_s: float | None) -> ConfigCost:
        key = config.key()
        if key not in self._seen:
            scale = self.proxy_launch(config, step_s)
            self._seen[key] = ConfigCost(
                full=trial_cost(self.spec, step_s),
                proxy=None if scale is None else launch_cost(self.spec, step_s, scale),
                proxy_step_s=None if scale is None or not step_s else step_s * scale.step_ratio,
                proxy_dp=None if scale is None else scale.dp,
            )  # fmt: skip
        return self._seen[key]

    def proxy_launch(self, config: ParallelConfig, step_s: float | None) -> LaunchScale | None:
        """What ``config``'s launch *as its proxy* runs at (at the config's fewer micro-batches
        when it has them), its full-scale step predicted at ``step_s``; None: it has no proxy
        (``search.proxy`` off, no smaller DP that keeps the hierarchy, or the step unknown).
        Worked out once per config. A config without a proxy may still run shortened at full
        DP: :meth:`first_launch` says what its first launch is, whichever it is."""
        key = config.key()
        if key not in self._scales:
            self._scales[key] = self._proxy_launch(config, step_s)
        return self._scales[key]

    def first_launch(self, config: ParallelConfig, step_s: float | None) -> LaunchScale | None:
        """What ``config``'s first launch runs at, whatever it is, its full-scale step predicted
        at ``step_s``: its proxy's (:meth:`proxy_launch`), else, when it is measured at fewer
        micro-batches per step (``fewer``), the config itself at them on a full trial's nodes
        and DP; None: the config as it is."""
        scale = self.proxy_launch(config, step_s)
        shorter = self.fewer.get(config.key())
        if scale is not None or shorter is None or not step_s:
            return scale
        return LaunchScale(nodes=self.spec.nodes_per_trial, step_ratio=shorter.step_s / step_s,
                           dp=config.dp)  # fmt: skip

    def _proxy_launch(self, config: ParallelConfig, step_s: float | None) -> LaunchScale | None:
        proxy = study_proxy(self.spec, config, self.gpu) if self.on and step_s else None
        if proxy is None:
            return None
        shorter = self.fewer.get(config.key())
        if shorter is not None:  # its proxy runs at as few micro-batches as the config
            proxy = dataclasses.replace(
                proxy, config=at_microbatches(proxy.config, shorter.microbatches)
            )
        return self.proxy_scale(proxy, step_s)

    def proxy_scale(self, proxy: Proxy, step_s: float | None) -> LaunchScale:
        """The scale of a launch as ``proxy``, its full config's step predicted at ``step_s``
        (unknown: the proxy's nodes at the full config's step)."""
        if not step_s:
            return LaunchScale(nodes=proxy.nodes, step_ratio=1.0, dp=proxy.config.dp)
        s = self.spec
        step = estimate_time(s.model, s.training, proxy.config, self.gpu,
                             s.cluster.gpus_per_node, s.framework, self.rates,
                             terms=self.terms).step  # fmt: skip
        return LaunchScale(nodes=proxy.nodes, step_ratio=step / step_s, dp=proxy.config.dp)


def launch_scales(spec: StudySpec, gpu: GPUSpec, configs: Sequence[ParallelConfig],
                  steps: Sequence[float | None], rates: Rates | None = None,
                  terms: StackTerms | None = None) -> np.ndarray:  # fmt: skip
    """Each config's first launch (:meth:`Costing.first_launch`) as a row of its nodes and its
    step per predicted full-scale step (``steps``), for :func:`launch_node_hours`: a proxy's,
    a config too slow for the user's limit at the fewer micro-batches it is measured at
    (:func:`~tuner.space.shorten.too_slow`, the definition the study's screen and the dry run
    read), else a full trial's nodes at ratio 1."""
    found = too_slow(spec, configs, steps, gpu, rates, terms)
    fewer = {key: shorter for key, shorter in found.items() if shorter is not None}
    costing = Costing(spec, gpu, rates, terms, fewer)
    at = np.array([[spec.nodes_per_trial, 1.0]] * len(configs)).reshape(-1, 2)
    for row, config, step in zip(at, configs, steps, strict=True):
        scale = costing.first_launch(config, step)
        if scale is not None:
            row[:] = scale.nodes, scale.step_ratio
    return at


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyBudget:
    """A study's node-hours with proxies: its launches and its confirmations."""

    launches: BudgetCost
    """The ``n_trials`` launches, each at its proxy's cost where it has one."""
    as_proxy: int
    """How many of the launches counted in ``launches.expected_node_hours`` run as proxies."""
    confirmations: int
    """Confirmations expected: ``proxy_confirm``, or fewer proxied launches."""
    confirm_node_hours: float
    """Their node-hours, each stopped at its shortest useful trial."""
    worst_confirmations: int
    """Confirmations at most: twice ``proxy_confirm``, or fewer proxied launches."""
    confirm_worst_node_hours: float
    """Their node-hours, each running to its limit or cap, the costliest counted."""

    @property
    def expected_node_hours(self) -> float:
        """Launches plus confirmations, each stopped at its shortest useful trial."""
        return self.launches.expected_node_hours + self.confirm_node_hours

    @property
    def worst_node_hours(self) -> float:
        """Launches plus confirmations, each running to its limit or cap."""
        return self.launches.worst_node_hours + self.confirm_worst_node_hours


def proxy_budget(spec: StudySpec, configs: Sequence[ParallelConfig],
                 steps: Sequence[float | None], cost: Costing, n_trials: int,
                 ) -> ProxyBudget:  # fmt: skip
    """The budget over the viable ``configs`` (fastest predicted first, their predicted
    ``steps``) with their proxies (``cost``); configs whose full-scale trial does not fit the
    time limit are never launched (they could not be confirmed)."""
    fulls = [trial_cost(spec, step) for step in steps]
    fitting = [k for k, f in enumerate(fulls) if f.fits]
    n = min(n_trials, len(fitting))
    first = [cost(configs[k], steps[k]) for k in fitting[:n]]
    proxied = [c for c in first if c.proxy is not None]
    confirm = min(spec.search.proxy_confirm, len(proxied))
    most = min(2 * spec.search.proxy_confirm, n)
    # worst case: the n costliest launches, walked from the costliest at full scale (a config's
    # full-scale worst bounds its proxy's), and the costliest confirmations
    top: list[float] = []  # min-heap of the n costliest launches' worst node-hours so far
    full_worst: list[float] = []  # full-scale worsts of configs that (may) run as proxies
    by_worst = sorted(fitting, key=lambda k: fulls[k].worst_node_hours, reverse=True)
    for walked, k in enumerate(by_worst):
        bound = fulls[k].worst_node_hours
        if len(top) == n and (not top or bound <= top[0]) and len(full_worst) >= most:
            break  # nothing further can be costlier
        if walked < WORST_WALK:
            c = cost(configs[k], steps[k])
            value, may_proxy = c.launch.worst_node_hours, c.proxy is not None
        else:
            value, may_proxy = bound, cost.on
        heapq.heappush(top, value)
        if len(top) > n:
            heapq.heappop(top)
        if may_proxy and len(full_worst) < most:
            full_worst.append(bound)  # in descending order: the costliest come first
    launches = BudgetCost(launches=n, expected_node_hours=sum(c.launch.node_hours for c in first),
                          worst_node_hours=sum(top))  # fmt: skip
    return ProxyBudget(
        launches=launches, as_proxy=len(proxied), confirmations=confirm,
        confirm_node_hours=sum(c.full.node_hours for c in proxied[:confirm]),
        worst_confirmations=len(full_worst), confirm_worst_node_hours=sum(full_worst),
    )  # fmt: skip
