"""The model-guided sampler: the analytical time model as a prior, corrected by measurements.

The space of a study is small and discrete (tens to thousands of configs) and every measurement
is expensive, so the search should use everything it knows. This sampler ranks every config the
memory model admits by its predicted step time, and learns from each measurement how the real
machine departs from the model:

    log(measured step) = log(predicted step) + w . features(config) + noise

``features`` are a constant, the log2 of each size (tp, pp, cp, dp, vp, micro-batch: a trend
seen between two values carries over to the next), one-hot indicators of each knob's value
(tp=4, pp=2, micro-batch 8, full recomputation, ...) and of each pair of knob values (tp=4 with
pp=2, ...). The
weights have a Gaussian prior centred on zero (the model is right until measured otherwise), so
the posterior is Bayesian linear regression in closed form: one measurement of tp=4 moves the
estimate of every tp=4 config, which is what lets a handful of runs correct a model that is off
by tens of percent on one knob.

Each proposal maximises expected improvement (over the best measured log step time) among the
admitted configs not yet measured, running, pruned, failed or needing at least the memory of a
config that ran out of memory. Memory gets the same treatment as time: the log of measured over
predicted peak memory is regressed on the same features (with its own prior: mostly one factor
shared by every config, see :class:`Prior`), fed by every run that reported its peak and by every
real OOM (which needed at least the GPU's memory). A config whose corrected peak is
over the limit is tried only when nothing else is left. (A cruder rule, "avoid every config
predicted to need as much as one that ran out", hid the best config of the stand-in's built-in
surface: its OOMs came from no-recompute configs, its best used selective recompute.)

Configs still running count as measured at their posterior mean ("kriging believer"), so
parallel workers spread out. With nothing measured yet the proposal is
the model's fastest config. When every admitted config has been tried, it proposes nothing and
Optuna's random sampling takes over (the study loop then finds the space exhausted).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import StudyError
from tuner.memory import GIB
from tuner.outcome import Outcome
from tuner.parallel import ParallelConfig
from tuner.probe import MEMORY_SIGMA, may_probe
from tuner.space import enumerate_space, expand_axes, study_gpu
from tuner.spec import StudySpec
from tuner.trials import RETRYABLE, config_params, distributions, oom_dominates, trial_outcome

# The MoE knobs come last: a dense study never varies them, so its features stay as they were.
KNOBS = ("tp", "pp", "cp", "dp", "vp", "mbs", "sp", "recompute", "sharding", "ep", "etp",
         "dispatcher")  # fmt: skip
SIZES = ("tp", "pp", "cp", "dp", "vp", "mbs", "ep")


def knob_values(config: ParallelConfig) -> dict[str, str]:
    """The value of each searched knob of ``config``, as a string."""
    rc = config.recompute_setting
    return {
        "tp": str(config.tp), "pp": str(config.pp), "cp": str(config.cp), "dp": str(config.dp),
        "vp": str(config.vp),
        "mbs": str(config.micro_batch_size), "sp": str(int(config.sequence_parallel)),
        "recompute": rc,
        "sharding": f"{int(config.distributed_optimizer)}:{config.zero_stage}",
        "ep": str(config.ep), "etp": str(config.etp),  # None: etp follows tp
        "dispatcher": config.moe_token_dispatcher,
    }  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Prior:
    """Prior standard deviations of the correction weights, on the log of the step time."""

    intercept: float = 0.5
    """A uniform error of the model (it is often optimistic by tens of percent)."""
    trend: float = 0.25
    """The effect of doubling a size (tp, pp, cp, dp, vp, micro-batch): lets a trend seen between
    two values carry over to values not measured yet."""
    main: float = 0.2
    """The effect of one knob value (e.g. tp=8 costs 20 % more than the model thinks)."""
    pair: float = 0.12
    """The joint effect of two knob values beyond their separate effects."""
    noise: float = 0.03
    """Run-to-run noise of a measured step time."""
    memory_intercept: float = 1.0
    """The memory model's error is mostly one factor shared by every config of a study (the
    CUDA context, communicator buffers and allocator slack of that software stack), so one
    measured peak moves every config's estimate."""
    memory_trend: float = 0.02
    """Memory errors do not grow with log2 of a size the way time errors do: nearly off."""
    memory_main: float = 0.1
    """The error of one component (activations under one recompute setting, states under one
    sharding) shows up as a knob-value effect."""
    memory_pair: float = 0.05
    """The joint effect of two knob values on the memory error."""
    memory_noise: float = 0.05
    """Noise of a measured peak (allocator rounding, fragmentation)."""


class Features:
    """One-hot features of knob values and pairs of knob values, over the study's space."""

    def __init__(self, configs: Sequence[ParallelConfig], prior: Prior) -> None:
        values: dict[str, set[str]] = {k: set() for k in KNOBS}
        for c in configs:
            for k, v in knob_values(c).items():
                values[k].add(v)
        searched = [k for k in KNOBS if len(values[k]) > 1]
        self.index: dict[tuple[str, ...], int] = {}
        groups = ["intercept"]
        self.trends = [k for k in searched if k in SIZES]
        groups += ["trend"] * len(self.trends)
        for k in searched:
            for v in sorted(values[k]):
                self.index[(k, v)] = len(groups)
                groups.append("main")
        for a, b in itertools.combinations(searched, 2):
            for va, vb in itertools.product(sorted(values[a]), sorted(values[b])):
                self.index[(a, va, b, vb)] = len(groups)
                groups.append("pair")
        self.searched = searched
        self._groups = np.array(groups)
        self.prior_precision = self.precision(prior.intercept, prior.trend, prior.main,
                                              prior.pair)  # fmt: skip
        self.memory_precision = self.precision(
            prior.memory_intercept, prior.memory_trend, prior.memory_main, prior.memory_pair
        )

    def precision(self, intercept: float, trend: float, main: float, pair: float) -> np.ndarray:
        """Prior precisions of the weights, from one standard deviation per feature group."""
        sd = {"intercept": intercept, "trend": trend, "main": main, "pair": pair}
        return np.asarray(1.0 / np.square(np.array([sd[str(g)] for g in self._groups])))

    def __call__(self, config: ParallelConfig) -> np.ndarray:
        x = np.zeros(len(self.prior_precision))
        x[0] = 1.0
        kv = knob_values(config)
        for j, k in enumerate(self.trends, 1):
            x[j] = math.log2(int(kv[k]))
        for k in self.searched:
            i = self.index.get((k, kv[k]))
            if i is not None:
                x[i] = 1.0
        for a, b in itertools.combinations(self.searched, 2):
            i = self.index.get((a, kv[a], b, kv[b]))
            if i is not None:
                x[i] = 1.0
        return x


@dataclasses.dataclass(frozen=True, slots=True)
class Posterior:
    """Gaussian posterior of the correction weights."""

    mean: np.ndarray
    cov: np.ndarray

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the correction for the rows of ``x``."""
        mu = x @ self.mean
        var = np.einsum("ij,jk,ik->i", x, self.cov, x)
        return mu, np.sqrt(np.maximum(var, 1e-12))


def fit(prior_precision: np.ndarray, x: np.ndarray, y: np.ndarray, noise: float) -> Posterior:
    """Bayesian linear regression with a zero-mean diagonal Gaussian prior."""
    precision = np.diag(prior_precision) + x.T @ x / noise**2
    cov = np.linalg.inv(precision)
    mean = cov @ (x.T @ y) / noise**2
    return Posterior(mean, cov)


def expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """Expected decrease below ``best`` of a Gaussian (mean ``mu``, sd ``sd``)."""
    z = (best - mu) / sd
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi)
    return np.asarray((best - mu) * cdf + sd * pdf)


class ModelGuidedSampler(BaseSampler):
    """Optuna sampler over a study's admitted configs; see the module docstring."""

    def __init__(
        self, spec: StudySpec, seed: int | None = None, prior: Prior | None = None
    ) -> None:
        self._spec = spec
        self._prior = prior or Prior()
        self._random = RandomSampler(seed=seed)
        self._rng = np.random.default_rng(seed)
        self._space: dict[str, BaseDistribution] | None = None
        self._configs: list[ParallelConfig] | None = None

    # -- the candidates, computed once --------------------------------------------------------

    def _candidates(self) -> list[ParallelConfig]:
        if self._configs is None:
            report = enumerate_space(self._spec)
            ranked = report.ranked() + report.probes  # probes last: after the first peaks
            self._probe_index = set(range(len(ranked) - len(report.probes), len(ranked)))
            self._configs = [c.config for c in ranked]
            self._log_pred = np.log([c.time.step if c.time else 1.0 for c in ranked])
            self._peak_gib = np.array([c.memory.peak / GIB for c in ranked])
            self._alloc_gib = np.array([c.memory.allocated / GIB for c in ranked])
            gpu = study_gpu(self._spec)
            self._gpu_gib = gpu.memory_gib
            self._limit_gib = self._spec.search.memory_headroom * gpu.memory_gib
            self._features = Features(self._configs, self._prior)
            self._x = np.array([self._features(c) for c in self._configs])
            self._space = distributions(self._spec)
            self._axes = expand_axes(self._spec)
        return self._configs

    # -- Optuna's sampler interface -------------------------------------------------------------

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        self._candidates()
        assert self._space is not None
        return dict(self._space)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        choice = self.choose(study.get_trials(deepcopy=False))
        if choice is None:
            return {}
        return config_params(choice, self._axes)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._random.before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._random.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._random.reseed_rng()

    # -- the choice -----------------------------------------------------------------------------

    def _fitting(
        self, open_: list[int], memory: dict[str, float], index: dict[str, int],
        oom_keys: set[str],
    ) -> list[int]:  # fmt: skip
        """The candidates whose peak, corrected by the memory measured so far, fits; memory probes
        (``tuner.probe``) while they still have a real chance of fitting the GPU, and only once
        a peak was measured (never blind)."""
        seen = [(index[k], y) for k, y in memory.items() if k in index]
        if not seen:
            return [i for i in open_ if i not in self._probe_index]
        x = self._x[[i for i, _ in seen]]
        y = np.array([v for _, v in seen])
        bound = np.array([k in oom_keys for k in memory if k in index])
        precision = self._features.memory_precision
        post = fit(precision, x, y, self._prior.memory_noise)
        for _ in range(3):  # an OOM only bounds its ratio from below: lift it above the fit
            if not bound.any():
                break
            mu_seen, sd_seen = post.predict(x)
            y = np.where(bound, np.maximum(y, mu_seen + sd_seen), y)
            post = fit(precision, x, y, self._prior.memory_noise)
        mu, sd = post.predict(self._x[open_])
        corrected = self._peak_gib[open_] * np.exp(mu)
        # The band narrows as peaks arrive: the posterior sd replaces the stated error once lower.
        sigma = np.minimum(MEMORY_SIGMA, np.hypot(sd, self._prior.memory_noise))
        return [
            i for i, peak, s in zip(open_, corrected, sigma, strict=True)
            if (may_probe(peak, self._gpu_gib, s) if i in self._probe_index
                else peak <= self._limit_gib)
        ]  # fmt: skip

    def choose(self, trials: Sequence[FrozenTrial]) -> ParallelConfig | None:
        """The admitted config with the highest expected improvement, or None when all tried."""
        configs = self._candidates()

        measured: dict[str, float] = {}
        pending: set[str] = set()
        tried: set[str] = set()
        ooms: list[ParallelConfig] = []
        memory: dict[str, float] = {}  # key -> log(measured / predicted) memory
        for t in trials:
            key = t.user_attrs.get("key")
            if key is None:
                continue
            outcome = trial_outcome(t)
            if t.state == TrialState.COMPLETE and t.value is not None:
                measured.setdefault(str(key), float(t.value))
            elif t.state == TrialState.RUNNING:
                pending.add(str(key))
            elif outcome in RETRYABLE:
                continue  # will run again: still a candidate
            if outcome == Outcome.OOM and t.user_attrs.get("config"):
                ooms.append(ParallelConfig(**t.user_attrs["config"]))
                peak = t.user_attrs.get("predicted_peak_gib")
                if peak is not None:
                    memory[str(key)] = math.log(self._gpu_gib / float(peak))  # at least
            measured_gib = t.user_attrs.get("peak_memory_gib")
            predicted_gib = t.user_attrs.get("predicted_allocated_gib")
            if outcome == Outcome.OK and measured_gib and predicted_gib:
                memory[str(key)] = math.log(float(measured_gib) / float(predicted_gib))
            tried.add(str(key))
        keys = [c.key() for c in configs]
        index = {k: i for i, k in enumerate(keys)}
        open_ = [
            i for i, c in enumerate(configs)
            if keys[i] not in tried and not any(oom_dominates(o, c) for o in ooms)
        ]  # fmt: skip
        if not open_:
            return None
        fitting = self._fitting(open_, memory, index, {o.key() for o in ooms})
        open_ = fitting or open_  # likely OOMs only when nothing else is left
        seen = [index[k] for k in measured if k in index]
        if not seen:
            return configs[open_[0]]  # the model's fastest admitted config
        y = np.array([math.log(measured[keys[i]]) for i in seen]) - self._log_pred[seen]
        x = self._x[seen]
        post = fit(self._features.prior_precision, x, y, self._prior.noise)
        believed = [index[k] for k in pending if k in index]
        if believed:  # running configs count as measured at their posterior mean
            mu_b, _ = post.predict(self._x[believed])
            x = np.vstack([x, self._x[believed]])
            y = np.concatenate([y, mu_b])
            post = fit(self._features.prior_precision, x, y, self._prior.noise)
        mu, sd = post.predict(self._x[open_])
        mu = mu + self._log_pred[open_]
        best = min(math.log(v) for v in measured.values())
        ei = expected_improvement(mu, sd, best)
        top = np.flatnonzero(ei >= ei.max() * (1 - 1e-9))
        return configs[open_[int(self._rng.choice(top))]]


# ----------------------------------------------------------------------------- every sampler


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its ``study.stop()`` once the grid is visited: that works
    inside ``study.optimize`` only and raises under ask/tell. The loop checks exhaustion."""

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
        values: Sequence[float] | None,
    ) -> None:  # fmt: skip
        return None


def make_sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    """model (the default: :mod:`tuner.sampler`), tpe (multivariate, constant liar for parallel
    trials), gp, random or grid."""
    s = spec.search
    if s.sampler == "model":
        return ModelGuidedSampler(spec, seed=s.seed)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.sampler == "grid":
        space = {
            k: list(d.choices)
            for k, d in distributions(spec).items()
            if isinstance(d, CategoricalDistribution)
        }
        return _GridSampler(space, seed=s.seed)
    if s.sampler == "gp":
        try:
            import torch  # noqa: F401  # Optuna's GP sampler runs on torch
        except ImportError:
            raise StudyError(
                "search.sampler 'gp' needs torch and scipy (pip install 'paratune[gp]'); "
                "the default 'model' sampler does not"
            ) from None
        return optuna.samplers.GPSampler(seed=s.seed)
    with warnings.catch_warnings():  # group=True is experimental in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            multivariate=True, group=True, constant_liar=True, seed=s.seed, n_startup_trials=5
        )
