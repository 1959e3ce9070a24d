"""Each measured figure's noise is the precision its own trial stated
(tuner.calibrate.correction.figure_sd, read by tuner.search.observed and the model sampler), not
one fixed run-to-run figure for every measurement."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from typing import Any

import numpy as np
import optuna
import pytest

from tests.test_sampler import predicted, spec
from tuner.calibrate.correction import LAUNCH_SD, Prior, figure_sd, planned_sd, t_quantile
from tuner.config.parallel import ParallelConfig
from tuner.logs.steady import Record, batch_means, estimate, warmup_records
from tuner.outcome import Outcome
from tuner.search.observed import Observed, stated_sd
from tuner.search.sampler import ModelGuidedSampler
from tuner.space.enumerate import enumerate_space
from tuner.space.trials import distributions
from tuner.spec.study import StudySpec


def test_the_stated_interval_becomes_the_standard_error_plus_the_launch_floor() -> None:
    """The estimator's half-width over t(b - 1) is the standard error of its mean of batch
    means: recomputed here from the batch means of a noisy series, it is what figure_sd adds
    in quadrature to the variation between launches."""
    rng = random.Random(3)
    records = [Record(iteration=i, step_s=2.0 * (1 + rng.gauss(0, 0.01))) for i in range(1, 41)]
    found = estimate(records, warmup_iters=1, precision=0.02, min_batches=4)
    assert found.mean_s and found.half_width_s and found.batches >= 4
    k = warmup_records(records, 1)
    means = batch_means(records[k:], records[k - 1].iteration)
    standard_error = statistics.stdev(means) / math.sqrt(len(means)) / found.mean_s
    within = found.half_width_s / found.mean_s / t_quantile(found.batches - 1)
    assert within == pytest.approx(standard_error, rel=1e-6)
    sd = figure_sd(found.mean_s, found.half_width_s, found.batches)
    assert sd == pytest.approx(math.hypot(standard_error, LAUNCH_SD))
    assert sd < Prior().noise  # a precise figure is believed more than the fixed 3 %


def test_a_wider_interval_means_a_noisier_figure() -> None:
    assert figure_sd(1.0, 0.04, 4) > figure_sd(1.0, 0.02, 4)
    # the same width from fewer batches holds a larger t quantile: a smaller standard error
    assert figure_sd(1.0, 0.02, 4) < figure_sd(1.0, 0.02, 20)
    assert figure_sd(1.0, 0.0, 4) == pytest.approx(LAUNCH_SD)  # never under the launch floor
    assert LAUNCH_SD == pytest.approx(0.02 / (2 * math.sqrt(2)))  # Llama 3: 2 % peak to peak
    # a trial ended "precise" states at most search.precision over min_batches batches
    assert planned_sd(0.02, 4) == pytest.approx(math.hypot(0.02 / 3.182, LAUNCH_SD))
    with pytest.raises(ValueError, match="no interval"):
        figure_sd(1.0, 0.02, 1)


def _trial(number: int, value: float, attrs: dict[str, Any]) -> optuna.trial.FrozenTrial:
    config = ParallelConfig(tp=2 ** (number % 3), dp=8 // 2 ** (number % 3),
                            micro_batch_size=1 + number // 3, global_batch_size=64)  # fmt: skip
    return optuna.trial.create_trial(
        value=value, params={}, distributions={},
        user_attrs={"key": config.key(), "outcome": "ok", **attrs},
    )  # fmt: skip


STEADY = {"objective": "steady", "steady_step_s": 2.0, "steady_halfwidth_s": 0.02,
          "steady_batches": 5}  # fmt: skip


def test_only_a_figure_that_is_the_steady_mean_states_its_precision() -> None:
    assert stated_sd(STEADY) == pytest.approx(figure_sd(2.0, 0.02, 5))
    # the parser's median (a log too short, DeepSpeed's own): its interval is not the figure's
    assert stated_sd({**STEADY, "objective": "median"}) is None
    assert stated_sd({k: v for k, v in STEADY.items() if k != "objective"}) is None  # older
    assert stated_sd({**STEADY, "steady_batches": 1, "steady_halfwidth_s": None}) is None
    trials = [_trial(0, 2.0, STEADY), _trial(1, 3.0, {"objective": "median"})]
    seen = Observed().of(trials, 80.0)
    assert seen.figure_sd == {trials[0].user_attrs["key"]: pytest.approx(figure_sd(2.0, 0.02, 5))}


def _belief(s: StudySpec, configs: list[ParallelConfig], attrs: dict[str, Any]) -> Any:
    """The sampler's belief after ``configs`` ran at 1.3x the model, each trial with ``attrs``
    (its step-time figure's interval, scaled to the figure)."""
    pred = predicted(s)
    sampler = ModelGuidedSampler(s, seed=0)
    study = optuna.create_study(sampler=sampler)
    for i, config in enumerate(configs):
        trial = study.ask(distributions(s))
        step = pred[config.key()] * 1.3 * (1.0 + 0.01 * i)
        trial.set_user_attr("key", config.key())
        trial.set_user_attr("config", dataclasses.asdict(config))
        trial.set_user_attr("outcome", str(Outcome.OK))
        for name, value in attrs.items():
            scaled = value * step / 2.0 if name.endswith("_s") else value
            trial.set_user_attr(name, scaled)
        study.tell(trial, step)
    return sampler.belief(study.get_trials())


def test_the_belief_reads_each_figure_with_its_trials_precision() -> None:
    """Figures measured to 1 % (over 5 batches) are believed more than the fixed 3 % the
    sampler assumed for every figure: the posterior about the untried neighbours narrows, the
    next launch is expected to state what these did, and the incumbent's own error is the one
    every untried config is compared against."""
    s = spec()
    ranked = [c.config for c in enumerate_space(s).ranked()]
    measured = [c for c in ranked if c.tp in (1, 2)][:4]
    precise = _belief(s, measured, STEADY)
    unstated = _belief(s, measured, {"objective": "median"})
    assert precise.noise == pytest.approx(figure_sd(2.0, 0.02, 5))
    assert precise.best_noise == pytest.approx(figure_sd(2.0, 0.02, 5))
    assert unstated.noise == unstated.best_noise == Prior().noise
    assert precise.open_ == unstated.open_
    assert np.all(precise.sd <= unstated.sd + 1e-12) and np.any(precise.sd < unstated.sd)
