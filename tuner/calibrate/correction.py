"""The correction the model sampler learns: how the machine departs from the analytical models.

    log(measured / predicted) = w . features(config) + noise

for the step time and for the peak memory. ``features`` are a constant, the log2 of each size
(tp, pp, cp, dp, vp, micro-batch: a trend seen between two values carries over to the next),
one-hot indicators of each knob's value and of each pair of knob values (:class:`Features`);
for memory each indicator is weighted by the share of the predicted peak that the component the
knob sizes takes (:meth:`Features.memory_row`). The
weights have a Gaussian prior centred on zero, "the model is right until measured otherwise"
(:class:`Prior`), so the posterior is Bayesian linear regression in closed form (:func:`fit`,
:func:`fit_memory`). The model sampler (:mod:`tuner.search.sampler`) fits it on the study's
measurements and the cluster's saved calibration; :mod:`tuner.calibrate.calibrated` on the
calibration alone. Pure numpy over configs: no Optuna, no storage.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import numpy as np

from tuner.config.parallel import ParallelConfig

# The MoE knobs come last: a dense study never varies them, so its features stay as they were.
KNOBS = ("tp", "pp", "cp", "dp", "vp", "mbs", "sp", "recompute", "sharding", "ep", "etp",
         "dispatcher", "tpo")  # fmt: skip
SIZES = ("tp", "pp", "cp", "dp", "vp", "mbs", "ep")
CHOICES = ("sp", "recompute", "sharding", "dispatcher", "tpo")
"""The knobs that choose which tensors a rank keeps (which of the memory model's formulas
applies); the others are sizes, which enter those formulas as exact factors."""


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
        "tpo": str(int(config.tp_comm_overlap)),
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
    memory_main: float = 0.25
    """The error of one component under one knob value (the activations under one recompute
    setting, the states under one sharding), on the log of that component: a memory feature is
    the knob's indicator times the component's share of the predicted peak
    (:meth:`Features.memory_row`). The same 0.1 on the whole peak that one-hot features had, for
    a config whose activations are 40 % of it; a config with a larger share now moves more."""
    memory_pair: float = 0.12
    """The joint effect of two such choices on that component's error (half the main effect's,
    as before)."""
    memory_size: float = 0.05
    """The effect on a component's error of a size's value (tp, pp, micro-batch, ...) or of a
    pair involving one: the memory formulas divide or multiply by the sizes exactly (activations
    by micro-batch / tp / cp, states by tp x pp and, sharded, by dp), so an error in a formula's
    coefficient is the same factor at every size and belongs to the intercept or to a choice
    (:data:`CHOICES`); what depends on the size itself (allocator rounding, communicator
    buffers) is a few percent. Without this, one config's miss is shared out equally among its
    tp, pp, dp, micro-batch and recomputation values and the next config with the same
    recomputation but other sizes is barely corrected."""
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
        scaled = self._groups != "intercept"
        scaled &= self._groups != "trend"
        states = np.zeros(len(groups), dtype=bool)  # the sharding knob sets the states' size
        for key, i in self.index.items():
            states[i] = "sharding" in key
        self._on_activations = scaled & ~states
        self._on_states = scaled & states
        self.prior_precision = self.precision(prior.intercept, prior.trend, prior.main,
                                              prior.pair)  # fmt: skip
        self.memory_precision = self.precision(
            prior.memory_intercept, prior.memory_trend, prior.memory_main, prior.memory_pair
        )
        for key, i in self.index.items():  # the sizes: see Prior.memory_size
            if any(k not in CHOICES for k in key[::2]):
                self.memory_precision[i] = 1.0 / prior.memory_size**2

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

    def memory_row(self, config: ParallelConfig, activation_share: float | None) -> np.ndarray:
        """The memory features of ``config``: its features times :meth:`memory_weights`."""
        return np.asarray(self(config) * self.memory_weights(activation_share))

    def memory_weights(self, activation_share: float | None) -> np.ndarray:
        """Per feature, what a config's memory row multiplies it by: a knob value's error lies
        in the component it sizes, so its indicator is weighted by that component's share of the
        predicted peak (the activations' for recomputation, micro-batch, tp, ...; the rest,
        mostly weights, gradients and optimizer states, for the sharding). A measured error
        under full recomputation then says little about a config whose peak is mostly states,
        and a miss on one config carries over in proportion to each config's activations. The
        intercept (one factor on the whole peak) and the size trends stay whole;
        ``activation_share`` None (a saved observation from before it was kept) leaves every
        indicator whole."""
        w = np.ones(len(self.prior_precision))
        if activation_share is None:
            return w
        share = min(max(activation_share, 0.0), 1.0)
        w[self._on_activations] = share
        w[self._on_states] = 1.0 - share
        return w


@dataclasses.dataclass(frozen=True, slots=True)
class Posterior:
    """Gaussian posterior of the correction weights."""

    mean: np.ndarray
    cov: np.ndarray

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the correction for the rows of ``x``."""
        mu = x @ self.mean
        var = ((x @ self.cov) * x).sum(axis=1)  # one matrix product (einsum would not use BLAS)
        return mu, np.sqrt(np.maximum(var, 1e-12))


def fit(
    prior_precision: np.ndarray, x: np.ndarray, y: np.ndarray, noise: float | np.ndarray
) -> Posterior:
    """Bayesian linear regression with a zero-mean diagonal Gaussian prior; ``noise``: one
    standard deviation for every row, or one per row (a saved measurement from another study
    is noisier, :mod:`tuner.calibrate.store`)."""
    w = noise_weights(y, noise)
    cov = covariance(prior_precision, x, w)
    mean = cov @ (x.T @ (y * w))
    return Posterior(mean, cov)


def noise_weights(y: np.ndarray, noise: float | np.ndarray) -> np.ndarray:
    """Each row's noise precision ``1 / noise^2``, one per row of ``y``."""
    return np.broadcast_to(1.0 / np.square(np.asarray(noise, dtype=float)), y.shape)


def covariance(prior_precision: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The posterior covariance ``(S^-1 + X^T W X)^-1`` of rows ``x`` with noise precisions
    ``w`` (:func:`noise_weights`) under the prior precision ``S^-1``, inverted afresh."""
    precision = np.diag(prior_precision) + x.T @ (x * w[:, None])
    return np.asarray(np.linalg.inv(precision))


def fit_memory(
    features: Features, prior: Prior, x: np.ndarray, y: np.ndarray, bound: np.ndarray,
    noise: float | np.ndarray,
) -> Posterior:  # fmt: skip
    """The memory correction: log(measured / predicted) memory regressed on the features; a
    row with ``bound`` set (a real OOM) only bounds its ratio from below."""
    return lift_ooms(fit, features.memory_precision, x, y, bound, noise)


class Fitted(Protocol):
    """A fitted correction: :class:`Posterior`, or the same posterior in another form
    (:mod:`tuner.search.ranking`)."""

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


P = TypeVar("P", bound=Fitted)


def lift_ooms(
    fitter: Callable[[np.ndarray, np.ndarray, np.ndarray, float | np.ndarray], P],
    precision: np.ndarray, x: np.ndarray, y: np.ndarray, bound: np.ndarray,
    noise: float | np.ndarray,
) -> P:  # fmt: skip
    """``fitter``'s regression of ``y`` on ``x`` where a row with ``bound`` set (a real OOM)
    only bounds its ratio from below: lifted above the fit, a few passes."""
    post = fitter(precision, x, y, noise)
    for _ in range(3):  # an OOM only bounds its ratio from below: lift it above the fit
        if not bound.any():
            break
        mu_seen, sd_seen = post.predict(x[bound])  # only the OOM rows move
        y = np.array(y, dtype=float)
        y[bound] = np.maximum(y[bound], mu_seen + sd_seen)
        post = fitter(precision, x, y, noise)
    return post


def normal_cdf(z: np.ndarray) -> np.ndarray:
    """The standard normal distribution function, elementwise."""
    return np.asarray(0.5 * (1.0 + np.vectorize(math.erf)(np.asarray(z) / math.sqrt(2.0))))


def expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """Expected decrease below ``best`` of a Gaussian (mean ``mu``, sd ``sd``)."""
    z = (best - mu) / sd
    cdf = normal_cdf(z)
    pdf = np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi)
    return np.asarray((best - mu) * cdf + sd * pdf)


TIME_CHOICES = ("the model alone", "one shared factor", "per-knob factors")
"""The step-time corrections :func:`choose_time` picks from, simplest first."""


@dataclasses.dataclass(frozen=True, slots=True)
class TimeChoice:
    """Which step-time correction is applied, and the leave-one-out error of each candidate."""

    applied: str
    """One of :data:`TIME_CHOICES`."""
    errors: tuple[float, ...]
    """Mean absolute leave-one-out error of each of :data:`TIME_CHOICES`, in that order."""

    def line(self) -> str:
        """What ``tune calibrate`` says of it."""
        errors = ", ".join(f"{e:.1%} {name}" for name, e in zip(TIME_CHOICES, self.errors,
                                                               strict=True))  # fmt: skip
        return (
            f"step-time correction applied: {self.applied}, the lowest leave-one-out "
            f"error ({errors})"
        )

    def to_json(self) -> dict[str, object]:
        """:meth:`line` as JSON."""
        return {"applied": self.applied,
                "loo_error": dict(zip(TIME_CHOICES, self.errors, strict=True))}  # fmt: skip


def _loo_error(precision: np.ndarray, x: np.ndarray, y: np.ndarray, noise: np.ndarray) -> float:
    """Mean ``|measured / predicted - 1|`` of each row predicted by the fit without it, from
    one fit: removing row i divides its residual by ``1 - h_i`` (``h_i`` its leverage, the
    posterior variance of its prediction over its noise variance; the leave-one-out identity of
    ridge regression, which a Gaussian prior is)."""
    post = fit(precision, x, y, noise)
    mu, sd = post.predict(x)
    loo = (y - mu) / (1.0 - np.square(sd) / np.square(noise))
    return float(np.mean(np.abs(np.expm1(loo))))


def choose_time(
    precision: np.ndarray, x: np.ndarray, y: np.ndarray, noise: np.ndarray
) -> tuple[TimeChoice, Posterior | None]:
    """The step-time correction with the lowest leave-one-out error over the rows ``x``, ``y``
    (model selection by leave-one-out, Rasmussen and Williams 2006, section 5.4.2): the model
    alone, one factor shared by every config (the intercept), or the per-knob fit; a more
    complex one only when its held-out error is strictly lower. With a handful of trials and
    run-to-run noise beyond the prior's, the per-knob fit chases the noise and predicts held-out
    trials worse than no correction (the CPU demo: 27.0 % by the model alone, 50.2 % per knob);
    applying it would move the ranking the wrong way."""
    errors = (
        float(np.mean(np.abs(np.expm1(y)))),
        _loo_error(precision[:1], x[:, :1], y, noise),
        _loo_error(precision, x, y, noise),
    )
    best = min(range(len(errors)), key=lambda i: (errors[i], i))
    choice = TimeChoice(TIME_CHOICES[best], errors)
    if best == 0:
        return choice, None
    if best == 2:
        return choice, fit(precision, x, y, noise)
    return choice, shared_factor(precision, x, y, noise)


def shared_factor(
    precision: np.ndarray, x: np.ndarray, y: np.ndarray, noise: np.ndarray
) -> Posterior:
    """The one factor shared by every config (the intercept alone) fitted to the rows ``x``,
    ``y``, widened to every feature: every other weight stays at 0."""
    shared = fit(precision[:1], x[:, :1], y, noise)
    mean, cov = np.zeros(len(precision)), np.zeros((len(precision), len(precision)))
    mean[0], cov[0, 0] = shared.mean[0], shared.cov[0, 0]
    return Posterior(mean, cov)
