"""The model-guided sampler: the analytical time model as a prior, corrected by measurements.

The space of a study is small and discrete (tens to thousands of configs) and every measurement
is expensive, so the search should use everything it knows. This sampler ranks every config the
memory model admits by its predicted step time, and learns from each measurement how the real
machine departs from the model:

    log(measured step) = log(predicted step) + w . features(config) + noise

(the regression itself, features, prior and closed-form posterior:
:mod:`tuner.calibrate.correction`)

``features`` are a constant, the log2 of each size (tp, pp, cp, dp, vp, micro-batch: a trend
seen between two values carries over to the next), one-hot indicators of each knob's value
(tp=4, pp=2, micro-batch 8, full recomputation, ...) and of each pair of knob values (tp=4 with
pp=2, ...). The
weights have a Gaussian prior centred on zero (the model is right until measured otherwise; its
config-to-config width the time model's stated held-out sd, :meth:`ModelGuidedSampler.
_stated_precision`), so
the posterior is Bayesian linear regression in closed form: one measurement of tp=4 moves the
estimate of every tp=4 config, which is what lets a handful of runs correct a model that is off
by tens of percent on one knob.

Each proposal maximises the expected improvement of the config the run would use once it is
measured (:mod:`tuner.search.knowledge`), per node-hour of its trial, among the
admitted configs not yet measured, running, pruned, failed or needing at least the memory of a
config that ran out of memory. Memory gets the same treatment as time: the log of measured over
predicted peak memory is regressed on the same features, each knob's weighted by the share of the
peak that the component it sizes takes (activations for recomputation, micro-batch, tp, ...;
states for the sharding: :meth:`Features.memory_row`), with its own prior (mostly one factor
shared by every config; a size's own effect held near zero, since the formulas scale by sizes
exactly: see :class:`Prior`), fed by every run that reported its peak and by every real OOM
(which needed at least the GPU's memory). A config whose corrected peak is
over the limit is tried only when nothing else is left. (A cruder rule, "avoid every config
predicted to need as much as one that ran out", hid the best config of the stand-in's built-in
surface: its OOMs came from no-recompute configs, its best used selective recompute.)

The cluster's saved calibration (:mod:`tuner.calibrate.store`: every measured trial of earlier
studies on the same cluster) enters both regressions as extra rows, noisier when they come from
a study with another setup, so a second study starts from the corrected ranking: with nothing
measured yet in this study, its first proposal is the calibrated model's fastest config.
:meth:`ModelGuidedSampler.chance_to_beat` tells the study loop when no untried config has a real
chance left (:mod:`tuner.search.stopping`).

Configs still running count as measured at their posterior mean ("kriging believer"), so
parallel workers spread out. With nothing measured yet the proposal is
the model's fastest config. When every admitted config has been tried, it proposes nothing and
Optuna's random sampling takes over (the study loop then finds the space exhausted).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial, TrialState

from tuner.calibrate.correction import Features, Posterior, Prior
from tuner.calibrate.correction import expected_improvement as expected_improvement
from tuner.calibrate.correction import knob_values as knob_values
from tuner.calibrate.store import (
    Observation,
    measured_startup_s,
    memory_fingerprint,
    setup_fingerprint,
)
from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import GIB, MEMORY_UNCERTAINTY
from tuner.models.rates import Rates
from tuner.search.fold import Basis, Folds, Past, memory_fit, plain, predict
from tuner.search.gram import Gram
from tuner.search.knowledge import launch_values
from tuner.search.normal import believe_rows
from tuner.search.observed import Observed
from tuner.search.ranking import (  # each refit in the rows' space: cheap
    RowPosterior,
    correlation,
    fit,
    loo_scale,
)
from tuner.search.saved import Saved
from tuner.search.value import (
    DEFAULT_RUN_TRIALS,
    JOINT_CONTENDERS,
    PURPOSE_ATTR,
    Belief,
    Purpose,
    Worth,
    best_worth,
    chance,
    joint_chance,
    pick,
)
from tuner.space.candidates import Candidate
from tuner.space.cost import with_startup
from tuner.space.enumerate import SharedSpace, expand_axes, study_gpu
from tuner.space.probes import may_probe
from tuner.space.proxy_cost import launch_node_hours, launch_scales
from tuner.space.trials import (
    config_params,
    distributions,
)
from tuner.spec.study import StudySpec

MIN_ERROR_RUNS = 2
"""Measured configs needed before the belief's width is rescaled by the study's own leave-one-out
misses (:func:`~tuner.search.ranking.loo_scale`) and the search may stop on it
(:mod:`tuner.search.stopping`): with one, its leave-one-out prediction is the prior's alone and
says nothing about how configs differ; from two, each is predicted from another. How little a
few misses say is in the belief's degrees of freedom (Student's t), not in a larger count."""


class ModelGuidedSampler(BaseSampler):
    """Optuna sampler over a study's admitted configs; see the module docstring."""

    def __init__(
        self, spec: StudySpec, seed: int | None = None, prior: Prior | None = None,
        history: Sequence[Observation] = (), rates: Rates | None = None,
        space: SharedSpace | None = None,
    ) -> None:  # fmt: skip
        """``space``: the study loop's shared enumeration (its rates are the ones used); one
        of the study's own under ``rates`` when None."""
        self._spec = spec
        self._shared = space or SharedSpace(spec, rates)
        self._prior = prior or Prior()
        self._history = tuple(history)
        self._saved = Saved(self._history, spec.name, setup_fingerprint(spec))
        self._past_of: tuple[Sequence[FrozenTrial], list[Observation]] | None = None
        self._fingerprint = setup_fingerprint(spec)
        self._memory_setup = memory_fingerprint(spec)
        self._random = RandomSampler(seed=seed)
        self._rng = np.random.default_rng(seed)
        self._space: dict[str, BaseDistribution] | None = None
        self._configs: list[ParallelConfig] | None = None
        self._observed = Observed()  # the trials' facts, each finished trial read once
        self.trials_source: Callable[[], Sequence[FrozenTrial]] | None = None
        """Where an ask reads the study's trials: the study loop's incremental reader
        (:class:`tuner.study.reader.TrialReader`) when it set one; else Optuna's
        ``study.get_trials``, which re-reads every unfinished trial through the ORM on each
        ask (with 64 trials running, most of an ask's CPU)."""

    # -- the candidates, computed once --------------------------------------------------------

    def _candidates(self) -> list[ParallelConfig]:
        if self._configs is None:
            report = self._shared.report()
            ranked = report.ranked() + report.probes  # probes last: after the first peaks
            self._probe_index = set(range(len(ranked) - len(report.probes), len(ranked)))
            self._configs = [c.config for c in ranked]
            self._log_pred = np.log([c.time.step if c.time else 1.0 for c in ranked])
            self._peak_gib = np.array([c.memory.peak / GIB for c in ranked])
            self._alloc_gib = np.array([c.memory.allocated / GIB for c in ranked])
            # each candidate's stated sd, from where its terms came (tuner.models.uncertainty)
            self._sigma = np.array([c.memory.sigma for c in ranked])
            gpu = study_gpu(self._spec)
            self._gpu_gib = gpu.memory_gib
            self._limit_gib = self._spec.search.memory_headroom * gpu.memory_gib
            self._features = Features(self._configs, self._prior)
            self._x = np.array([self._features(c) for c in self._configs])
            stated = np.array([c.time.sigma if c.time else 0.0 for c in ranked])
            self._precision = self._stated_precision(stated)
            self._xm = self._x * np.array([  # memory features: knob errors weighted by share
                self._features.memory_weights(c.memory.activation_share) for c in ranked
            ])  # fmt: skip
            self._keys = [c.key() for c in self._configs]
            self._folds = Folds(plain(self._x, self._precision),  # products kept for the fits
                                plain(self._xm, self._features.memory_precision))  # fmt: skip
            self._space = distributions(self._spec)
            self._axes = expand_axes(self._spec)
            self._launch_at = self._launch_scales(ranked, gpu)
        return self._configs

    def _launch_scales(self, ranked: Sequence[Candidate], gpu: GPUSpec) -> np.ndarray:
        """Each candidate's first launch against its full-scale trial: its nodes and its step per
        full-scale step (a proxy's, under ``search.proxy``, and at fewer micro-batches for a
        config too slow for the user's limit: :func:`~tuner.space.proxy_cost.launch_scales`;
        the time model's at the space's rates and terms, as the preview's)."""
        steps = [c.time.step if c.time else None for c in ranked]
        return launch_scales(self._spec, gpu, [c.config for c in ranked], steps,
                             self._shared.rates, self._shared.terms)  # fmt: skip

    def _stated_precision(self, stated: np.ndarray) -> np.ndarray:
        """The correction's prior precisions, its config-to-config part (every weight but the
        intercept) restated so that the prior sd of an average config's correction is the
        time model's stated held-out sd for it (:mod:`tuner.models.uncertainty`: what the
        catalog's terms have been off by on sources they were not developed on). The
        intercept, one factor on every config of a stack the study has not measured, keeps
        :attr:`Prior.intercept`."""
        precision = self._features.prior_precision.copy()
        shape = np.square(self._x[:, 1:]) @ (1.0 / precision[1:])
        if not (stated > 0).any() or not shape.mean() > 0:
            return precision
        precision[1:] *= float(shape.mean() / np.mean(np.square(stated[stated > 0])))
        return precision

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
        source = self.trials_source
        chosen = self.choose_why(source() if source else study.get_trials(deepcopy=False))
        if chosen is None:
            return {}
        # as Optuna's own samplers record their state: on the trial, read back by the summary
        study._storage.set_trial_system_attr(trial._trial_id, PURPOSE_ATTR, chosen[1])
        return config_params(chosen[0], self._axes)

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
        oom_keys: set[str], past: Sequence[Observation],
    ) -> list[int]:  # fmt: skip
        """The candidates whose peak, corrected by the memory measured so far, fits; memory probes
        (``tuner.space.probes``) while they still have a real chance of fitting the GPU, and only
        once a peak was measured (never blind)."""
        fitted = self._memory_fit(open_, memory, index, oom_keys, past)
        if fitted is None:
            return [i for i in open_ if i not in self._probe_index]
        mu, sd = fitted
        m = self._prior.memory_noise
        corrected = self._peak_gib[open_] * np.exp(mu)
        ran = self._folded(past).ran  # it ran here with the same model and GPU: it fits
        # The band narrows as peaks arrive: the posterior sd replaces the stated error once lower.
        # A measured peak of this stack also measures what the catalog's held-out error covers
        # for an unseen one (its fixed memory, its allocator): from here the in-stack figure
        # (MEMORY_UNCERTAINTY, the error on stacks the model has measurements of) caps it.
        sigma = np.minimum(np.minimum(self._sigma[open_], MEMORY_UNCERTAINTY), np.hypot(sd, m))
        return [
            i for i, peak, s in zip(open_, corrected, sigma, strict=True)
            if self._keys[i] in ran
            or (may_probe(peak, self._gpu_gib, s) if i in self._probe_index
                else peak <= self._limit_gib)
        ]  # fmt: skip

    def _memory_fit(
        self, open_: list[int], memory: dict[str, float], index: dict[str, int],
        oom_keys: set[str], past: Sequence[Observation],
    ) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
        """The memory correction's mean and sd for candidates ``open_`` (log of measured over
        predicted peak), fitted on the peaks measured so far and the saved calibration
        ``past`` (folded into the prior: :mod:`tuner.search.fold`; saved OOMs stay rows);
        None with nothing of either."""
        seen = [(index[k], y) for k, y in memory.items() if k in index]
        folded = self._folded(past)
        basis = folded.bases[1]  # the saved OOMs are bounds: rows, not folded
        if not seen and not len(folded.oom_y) and not basis.folded:
            return None
        noise = np.concatenate([np.full(len(seen), self._prior.memory_noise), folded.oom_noise])
        oom = [k in oom_keys for k in memory if k in index]
        return memory_fit(basis, seen, oom, folded.oom_rows, folded.oom_y, noise, open_)

    def _folded(self, past: Sequence[Observation]) -> Past:
        """What the saved observations ``past`` say, their rows folded into the fits' priors
        (:mod:`tuner.search.fold`), once per list."""
        past = past if isinstance(past, list) else list(past)
        setup = (self._fingerprint, self._memory_setup)
        return self._folds.of(past, self._saved, self._features, self._prior, setup)

    def _past(self, trials: Sequence[FrozenTrial]) -> list[Observation]:
        """The saved observations, less this study's own trials (those are in ``trials``); one
        answer per read (:class:`~tuner.search.saved.Saved` makes each one's key once)."""
        if not self._history:
            return []
        if self._past_of is None or self._past_of[0] is not trials:
            self._past_of = (trials, self._saved.past(self._observed.own(trials)))
        return self._past_of[1]

    def belief(self, trials: Sequence[FrozenTrial]) -> Belief | None:
        """The corrected model's belief about the untried configs; None when all were tried."""
        return self._belief(trials)[0]

    def _belief(self, trials: Sequence[FrozenTrial]) -> tuple[Belief | None, np.ndarray]:
        """:meth:`belief`, and the candidates' rows its fit reads (the features, or those in
        the coordinates of the folded saved calibration: :mod:`tuner.search.fold`)."""
        configs = self._candidates()

        obs = self._observed.of(trials, self._gpu_gib)  # finished trials folded once each
        measured, pending, tried, ooms, memory = (
            obs.measured, obs.pending, obs.tried, obs.ooms, obs.memory
        )  # fmt: skip
        keys = self._keys  # cached with the candidates
        index = {k: i for i, k in enumerate(keys)}
        gone = self._observed.dominated(ooms, configs)  # each OOM against them once
        open_ = [i for i in range(len(configs)) if keys[i] not in tried and i not in gone]
        if not open_:
            return None, self._x
        past = self._past(trials)
        fitting = self._fitting(open_, memory, index, self._observed.oom_keys(ooms), past)
        open_ = fitting or open_  # likely OOMs only when nothing else is left
        best = min((math.log(v) for v in measured.values()), default=None)
        seen = [index[k] for k in measured if k in index]
        basis = self._folded(past).bases[0]  # the saved calibration folded into the prior
        if not seen and not basis.folded:  # the model alone: its ranking, no spread learned yet
            return Belief(open_, self._log_pred[open_], np.zeros(len(open_)), best), self._x
        noise, xb = self._prior.noise, basis.x
        x = xb[seen]
        y = np.array([math.log(measured[keys[i]]) for i in seen]) - self._log_pred[seen]
        y = y - basis.offset[seen]
        sds = np.full(len(seen), noise)
        believed = [index[k] for k in pending if k in index]
        gram = basis.gram if basis.gram.fits(seen + believed) else None
        post = self._fit(basis, gram, seen, x, y, sds)
        measured_fit, ahead = post, None
        if believed:  # running configs count as measured at their posterior mean
            mu_b, _ = predict(post, xb, believed)
            x = np.vstack([x, xb[believed]])
            y = np.concatenate([y, mu_b])
            sds = np.concatenate([sds, [noise] * len(believed)])
            if isinstance(post, Posterior):  # the weights' form: a rank-update, no refit
                post, *ahead = believe_rows(post, xb, believed, open_, noise)
            else:
                post = self._fit(basis, gram, seen + believed, x, y, sds)
        mu, sd = ahead or predict(post, xb, open_)
        scale: tuple[float | None, int | None] = (None, None)
        if len(seen) >= MIN_ERROR_RUNS:  # the believed rows are not measurements: left out
            n = len(seen)
            scale = loo_scale(basis.precision, x[:n], y[:n], sds[:n], n, measured_fit)
        incumbent = index.get(min(measured, key=measured.__getitem__)) if measured else None
        mu = mu + basis.offset[open_] + self._log_pred[open_]
        return Belief(open_, mu, sd, best, *scale, fitted=post, incumbent=incumbent), xb

    def _fit(self, basis: Basis, gram: Gram | None, rows: list[int], x: np.ndarray,
             y: np.ndarray, sds: np.ndarray) -> Posterior | RowPosterior:  # fmt: skip
        """The time correction fitted on ``x`` (the rows of candidates ``rows`` in ``basis``),
        from ``gram``'s kept products when given (:mod:`tuner.search.gram`)."""
        return gram.fit(rows, y, sds) if gram is not None else fit(basis.precision, x, y, sds)

    def choose(self, trials: Sequence[FrozenTrial]) -> ParallelConfig | None:
        """The admitted config to launch next (:meth:`choose_why`), or None when all tried."""
        chosen = self.choose_why(trials)
        return None if chosen is None else chosen[0]

    def choose_why(self, trials: Sequence[FrozenTrial]) -> tuple[ParallelConfig, Purpose] | None:
        """The admitted config with the highest expected improvement per node-hour of its trial,
        the improvement of the config the run would use once it is measured (the knowledge
        gradient of correlated beliefs: :func:`tuner.search.knowledge.launch_values`), among
        those with a more than negligible chance of beating the best by 1 %
        (:func:`tuner.search.value.pick`), and why; None when all were tried. With nothing
        measured in this study, the fastest by the (calibrated) model."""
        configs = self._candidates()
        b, xb = self._belief(trials)
        if b is None:
            return None
        if b.best is None:
            return configs[b.open_[int(np.argmin(b.mu))]], "exploitation"  # argmin: first of ties
        spread = b.spread(self._prior.noise)
        cost = self.launch_node_hours(b, trials)
        gain = launch_values(b, xb, spread, self._prior.noise)  # what the run would gain
        chosen, top = pick(b.mu, spread, spread, cost, b.best, b.dof, gain)
        i = int(self._rng.choice(top)) if len(top) > 1 else chosen.index
        purpose: Purpose = "exploitation" if b.mu[i] <= b.best else "exploration"
        return configs[b.open_[i]], purpose

    def trial_node_hours(self, log_step: np.ndarray, trials: Sequence[FrozenTrial] = ()
                         ) -> np.ndarray:  # fmt: skip
        """Predicted node-hours of one full-scale trial at each step time ``exp(log_step)``:
        start-up charged per launch plus the warm-up and the iterations the estimate needs
        (:func:`~tuner.space.proxy_cost.launch_node_hours` on a full trial's nodes); the
        start-up the launches of this setup measured (``trials`` and the saved calibration's:
        :func:`~tuner.calibrate.store.measured_startup_s`) once there is one."""
        spec = with_startup(self._spec, self.measured_startup_s(trials))
        return launch_node_hours(spec, np.exp(log_step), spec.nodes_per_trial, 1.0)

    def launch_node_hours(self, b: Belief, trials: Sequence[FrozenTrial] = ()) -> np.ndarray:
        """Predicted node-hours of launching each of ``b``'s untried configs, at its believed
        step time: what the launch will cost (:func:`~tuner.space.proxy_cost.launch_node_hours`:
        a proxy's nodes and its iterations at the proxy's step where the config runs as one,
        the step at its fewer micro-batches where it is too slow for the user's limit), at the
        start-up measured so far (:meth:`trial_node_hours`)."""
        self._candidates()
        spec = with_startup(self._spec, self.measured_startup_s(trials))
        nodes, ratio = self._launch_at[b.open_].T
        return launch_node_hours(spec, np.exp(b.mu), nodes, ratio)

    def measured_startup_s(self, trials: Sequence[FrozenTrial] = ()) -> float | None:
        """The start-up of one launch of this setup, seconds, as its launches measured it
        (``trials`` and the saved calibration's: :func:`~tuner.calibrate.store.
        measured_startup_s`); None before any was measured."""
        own = self._observed.startups(trials) if trials else []  # each finished trial once
        if self._configs is None:  # before the candidates (and the folds kept with them)
            return measured_startup_s(self._past(trials), self._fingerprint, own)
        return self._folds.startup_s(self._folded(self._past(trials)), own)

    def run_node_hours(self, trials: Sequence[FrozenTrial] = ()) -> float:
        """What the training run the answer is for is worth, node-hours: ``search.
        train_node_hours``, or :data:`~tuner.search.value.DEFAULT_RUN_TRIALS` trials of the
        model's fastest config (at the start-up measured so far, as the trials it is weighed
        against)."""
        given = self._spec.search.train_node_hours
        if given is not None:
            return given
        self._candidates()
        first = self._log_pred[:1]  # the ranking's first: the model's fastest admitted config
        return DEFAULT_RUN_TRIALS * float(self.trial_node_hours(first, trials).sum())

    def next_launch_worth(
        self, trials: Sequence[FrozenTrial]
    ) -> tuple[Worth, ParallelConfig] | None:
        """The untried config whose launch is worth most against its cost
        (:func:`tuner.search.value.best_worth`), and that config; None before
        :data:`MIN_ERROR_RUNS` measurements (the spread is not known yet) or when all tried."""
        b, xb = self._belief(trials)
        if b is None or b.best is None or b.scale is None or b.fitted is None:
            return None
        moves = b.lookahead(xb, self._prior.noise)
        worth = best_worth(b.mu, moves, self.launch_node_hours(b, trials), b.best,
                           self.run_node_hours(trials), b.dof)  # fmt: skip
        return worth, self._candidates()[b.open_[worth.index]]

    def chance_to_beat(
        self, trials: Sequence[FrozenTrial], margin: float
    ) -> tuple[float, ParallelConfig] | None:
        """The probability that some untried config runs faster than the best measured by more
        than ``margin``, and the likeliest one; None before :data:`MIN_ERROR_RUNS`
        measurements (then nothing is known yet). Each config's log step time is Student's t
        around its corrected prediction, scale :meth:`Belief.spread`, :attr:`Belief.dof`
        degrees of freedom; the :data:`~tuner.search.value.JOINT_CONTENDERS` likeliest are
        drawn together, correlated as the posterior says (:func:`~tuner.search.value.
        joint_chance`): ten independent 2 % chances make an 18 % one, not a 2 % one."""
        b, xb = self._belief(trials)
        if b is None or b.best is None or b.scale is None or b.fitted is None:
            return None
        spread = b.spread(self._prior.noise)
        p = chance(b.mu, spread, b.best, margin, b.dof)
        top = np.argsort(-p, kind="stable")[:JOINT_CONTENDERS]
        corr = correlation(b.fitted, xb[np.asarray(b.open_)[top]], self._prior.noise)
        joint = joint_chance(b.mu[top], spread[top], corr, b.best, margin, b.dof)
        return max(joint, float(p[top[0]])), self._candidates()[b.open_[int(top[0])]]
