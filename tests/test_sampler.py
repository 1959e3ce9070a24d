"""The model-guided sampler: Bayesian correction of the time model, in-memory Optuna studies."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import optuna
import pytest

from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import GIB
from tuner.outcome import Outcome
from tuner.search.sampler import (
    Features,
    ModelGuidedSampler,
    Prior,
    expected_improvement,
    fit,
    knob_values,
)
from tuner.space.enumerate import enumerate_space
from tuner.space.trials import config_from_params, distributions
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec

BASE: dict[str, Any] = {
    "name": "s",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "num_nodes": 2, "executor": "local"},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt"},
    "space": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2, 4],
              "recompute": ["none", "selective", "full"], "sequence_parallel": [True],
              "distributed_optimizer": [True]},
    "search": {"sampler": "model", "seed": 0},
}  # fmt: skip


def spec(**search: Any) -> StudySpec:
    data = copy.deepcopy(BASE)
    data["search"].update(search)
    return study_from_mapping(data)


def ask(study: optuna.Study, s: StudySpec) -> tuple[optuna.Trial, ParallelConfig]:
    """What the study loop does on each ask: the config, its key and its predictions."""
    trial = study.ask(distributions(s))
    config = config_from_params(s, trial.params)
    trial.set_user_attr("key", config.key())
    trial.set_user_attr("config", dataclasses.asdict(config))
    return trial, config


def run(s: StudySpec, truth: Callable[[ParallelConfig], float], n: int) -> list[ParallelConfig]:
    """Ask and tell ``n`` times, measuring ``truth``; the configs in the order proposed."""
    study = optuna.create_study(sampler=ModelGuidedSampler(s, seed=s.search.seed))
    order = []
    for _ in range(n):
        trial, config = ask(study, s)
        trial.set_user_attr("outcome", str(Outcome.OK))
        study.tell(trial, truth(config))
        order.append(config)
    return order


def predicted(s: StudySpec) -> dict[str, float]:
    return {c.config.key(): c.time.step for c in enumerate_space(s).ranked() if c.time}


def test_first_proposal_is_the_models_fastest_admitted_config() -> None:
    s = spec()
    ranked = enumerate_space(s).ranked()
    first = run(s, lambda c: 1.0, 1)[0]
    assert first.key() == ranked[0].config.key()


def test_learns_knobs_the_model_gets_wrong_and_never_repeats() -> None:
    """On this machine pipelining is much cheaper and TP much dearer than the model thinks: the
    best config is far down the model's ranking of 91; a handful of runs find it."""
    s = spec()
    pred = predicted(s)

    def truth(c: ParallelConfig) -> float:
        return pred[c.key()] * (0.6 if c.pp == 4 else 1.0) * 1.6 ** math.log2(c.tp)

    ranked = [c.config for c in enumerate_space(s).ranked()]
    best = min(ranked, key=truth).key()
    assert [c.key() for c in ranked].index(best) >= 15, "the test needs a best ranked poorly"
    order = run(s, truth, 10)
    keys = [c.key() for c in order]
    assert len(set(keys)) == len(keys), "a config was proposed twice"
    assert best in keys[:8], [(k, round(truth(c), 2)) for k, c in zip(keys, order, strict=True)]


def test_running_trials_are_not_proposed_again() -> None:
    s = spec()
    study = optuna.create_study(sampler=ModelGuidedSampler(s))
    keys = {ask(study, s)[1].key() for _ in range(5)}  # five asks, nothing told: all running
    assert len(keys) == 5


def test_an_ask_reads_the_trials_from_the_source_it_is_given() -> None:
    """The study loop hands the sampler its incremental reader's trials (Optuna's
    ``get_trials`` re-reads every unfinished trial on each ask): what the sampler proposes
    follows that source, here one that says the first pick already ran."""
    s = spec()
    sampler = ModelGuidedSampler(s)
    study = optuna.create_study(sampler=sampler)
    first, config = ask(study, s)
    study.tell(first, 1.0)
    reads: list[int] = []

    def source() -> list[optuna.trial.FrozenTrial]:
        reads.append(1)
        return study.get_trials(deepcopy=False)

    sampler.trials_source = source
    _, second = ask(study, s)
    assert reads == [1] and second.key() != config.key()
    sampler.trials_source = lambda: []  # a source that has seen nothing: the first pick again
    assert ask(study, s)[1].key() == config.key()


def test_a_real_oom_steers_away_from_configs_like_it() -> None:
    s = spec()
    viable = {c.config.key(): c for c in enumerate_space(s).viable}
    study = optuna.create_study(sampler=ModelGuidedSampler(s))
    trial, config = ask(study, s)
    peak = viable[config.key()].memory.peak / GIB
    trial.set_user_attr("outcome", str(Outcome.OOM))
    trial.set_user_attr("predicted_peak_gib", peak)
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    lower = sum(c.memory.peak / GIB < peak for c in viable.values())
    assert lower >= 5
    for _ in range(5):
        trial, config = ask(study, s)
        assert viable[config.key()].memory.peak / GIB < peak
        trial.set_user_attr("outcome", str(Outcome.OK))
        study.tell(trial, 1.0)


def test_when_every_admitted_config_was_tried_it_proposes_nothing() -> None:
    s = spec()
    data = copy.deepcopy(BASE)
    data["space"].update(tp=[2], pp=[1], micro_batch_size=[1, 2], recompute=["none"])
    small = study_from_mapping(data)
    sampler = ModelGuidedSampler(small)
    study = optuna.create_study(sampler=sampler)
    for _ in range(2):
        trial, _config = ask(study, small)
        trial.set_user_attr("outcome", str(Outcome.OK))
        study.tell(trial, 1.0)
    assert sampler.choose(study.get_trials()) is None
    assert s is not small


def test_posterior_recovers_linear_weights() -> None:
    rng = np.random.default_rng(1)
    x = np.c_[np.ones(200), rng.integers(0, 2, size=(200, 3))]
    w = np.array([0.2, -0.3, 0.1, 0.5])
    post = fit(np.full(4, 1.0), x, x @ w + rng.normal(0, 0.01, 200), noise=0.01)
    assert np.allclose(post.mean, w, atol=0.01)
    mu, sd = post.predict(x[:3])
    assert np.allclose(mu, x[:3] @ w, atol=0.01) and (sd < 0.01).all()


def test_expected_improvement_prefers_lower_mean_and_more_uncertainty() -> None:
    ei = expected_improvement(np.array([0.0, -0.1, 0.0]), np.array([0.1, 0.1, 0.3]), best=0.0)
    assert ei[1] > ei[0] and ei[2] > ei[0] and (ei > 0).all()


def test_features_encode_each_knob_value_and_size_trends() -> None:
    s = spec()
    configs = [c.config for c in enumerate_space(s).viable]
    f = Features(configs, Prior())
    c = configs[0]
    x = f(c)
    kv = knob_values(c)
    assert x[0] == 1.0
    assert x[f.index[("tp", kv["tp"])]] == 1.0
    assert x[1 + f.trends.index("tp")] == pytest.approx(math.log2(c.tp))
    # one value per searched knob, one per pair of searched knobs
    n = len(f.searched)
    assert int(x[1 + len(f.trends) :].sum()) == n + n * (n - 1) // 2


def test_memory_features_weigh_each_knob_by_the_component_it_sizes() -> None:
    data = copy.deepcopy(BASE)
    data["space"]["distributed_optimizer"] = [True, False]
    s = study_from_mapping(data)
    configs = [c.config for c in enumerate_space(s).viable]
    f = Features(configs, Prior())
    c = configs[0]
    kv, x, xm = knob_values(c), f(c), f.memory_row(c, 0.3)
    assert "sharding" in f.searched and xm[0] == x[0] == 1.0
    assert xm[1 : 1 + len(f.trends)] == pytest.approx(x[1 : 1 + len(f.trends)])  # trends whole
    assert xm[f.index[("recompute", kv["recompute"])]] == pytest.approx(0.3)  # activations
    assert xm[f.index[("tp", kv["tp"])]] == pytest.approx(0.3)
    assert xm[f.index[("sharding", kv["sharding"])]] == pytest.approx(0.7)  # the states
    pair = ("recompute", kv["recompute"], "sharding", kv["sharding"])
    i = f.index.get(pair) or f.index[(pair[2], pair[3], pair[0], pair[1])]
    assert xm[i] == pytest.approx(0.7)
    assert (f.memory_row(c, None) == x).all()  # a saved observation without the share
    # a size's memory effect is held near zero, a choice of what is kept is not
    size = f.memory_precision[f.index[("tp", kv["tp"])]]
    recompute = f.memory_precision[f.index[("recompute", kv["recompute"])]]
    assert (size, recompute) == pytest.approx(
        (Prior().memory_size ** -2, Prior().memory_main ** -2)
    )


def test_samplers_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.errors import StudyError
    from tuner.search.samplers import make_sampler

    assert isinstance(make_sampler(spec()), ModelGuidedSampler)
    assert isinstance(make_sampler(spec(sampler="tpe")), optuna.samplers.TPESampler)
    assert isinstance(make_sampler(spec(sampler="grid")), optuna.samplers.GridSampler)
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # a login node without torch
    with pytest.raises(StudyError, match="'gp' needs torch"):
        make_sampler(spec(sampler="gp"))


def test_measured_peaks_correct_the_memory_model() -> None:
    """On this machine runs without recomputation need 1.8x the predicted memory: once one such
    run reports its peak, configs whose corrected peak is over the limit wait until last."""
    s = spec()
    limit = s.search.memory_headroom * 80.0
    viable = {c.config.key(): c for c in enumerate_space(s).viable}

    def risky(c: ParallelConfig) -> bool:  # would really OOM
        return c.recompute == "none" and viable[c.key()].memory.peak / GIB * 1.8 > limit

    first = next(c.config for c in enumerate_space(s).ranked() if c.config.recompute == "none")
    predicted = viable[first.key()].memory.allocated / GIB
    assert any(risky(c) for c in proposals_after(s, {})), "the test needs risky picks"
    assert not any(risky(c) for c in proposals_after(s, {first: (predicted, 1.8 * predicted)}))


def proposals_after(
    s: StudySpec, peaks: dict[ParallelConfig, tuple[float, float]], n: int = 8
) -> list[ParallelConfig]:
    """The next ``n`` proposals once each config of ``peaks`` ran and reported its peak
    (predicted allocated GiB, measured GiB)."""
    study = optuna.create_study(sampler=ModelGuidedSampler(s))
    for config, (predicted, measured) in peaks.items():
        trial = study.ask(distributions(s))
        for key, value in {
            "key": config.key(), "config": dataclasses.asdict(config),
            "outcome": str(Outcome.OK), "predicted_allocated_gib": predicted,
            "peak_memory_gib": measured,
        }.items():  # fmt: skip
            trial.set_user_attr(key, value)
        study.tell(trial, 1.0)
    out = []
    for _ in range(n):
        trial, config = ask(study, s)
        trial.set_user_attr("outcome", str(Outcome.OK))
        study.tell(trial, 1.0)
        out.append(config)
    return out


def test_a_memory_miss_under_one_recompute_setting_carries_to_its_other_sizes() -> None:
    """On this machine runs without recomputation keep 1.5 times the activations the model
    counts (the rest is as predicted). One such run, whose peak is 40 % activations, and one exact
    run with selective recomputation: configs without recomputation whose larger activations
    would then overflow the GPU are not proposed, though their sizes differ from the measured
    one's."""
    s = spec()
    limit = s.search.memory_headroom * 80.0
    known = {c.config.key(): c for c in enumerate_space(s).ranked() + enumerate_space(s).probes}

    def true_gib(c: ParallelConfig) -> float:
        m = known[c.key()].memory
        extra = 0.5 * m.activation_share * m.allocated if c.recompute == "none" else 0.0
        return (m.allocated + extra) / GIB

    def risky(c: ParallelConfig) -> bool:  # would really OOM
        m = known[c.key()].memory
        return m.peak / GIB + true_gib(c) - m.allocated / GIB > limit

    def fastest(recompute: str, share: float) -> ParallelConfig:  # that fits, SP on
        return next(
            c.config for c in enumerate_space(s).ranked()
            if c.config.recompute == recompute and c.config.sequence_parallel
            and c.memory.activation_share >= share and not risky(c.config)
        )  # fmt: skip

    none, selective = fastest("none", 0.4), fastest("selective", 0.0)

    def ran(*configs: ParallelConfig) -> dict[ParallelConfig, tuple[float, float]]:
        return {c: (known[c.key()].memory.allocated / GIB, true_gib(c)) for c in configs}

    assert true_gib(none) > 1.2 * known[none.key()].memory.allocated / GIB
    assert any(risky(c) for c in proposals_after(s, ran(selective))), "the test needs risky picks"
    assert not any(risky(c) for c in proposals_after(s, ran(selective, none)))


def _belief_after(s: StudySpec, measured: list[ParallelConfig]) -> tuple[Any, Any]:
    """The sampler and its belief after ``measured`` ran at 1.3x the model's prediction."""
    pred = predicted(s)
    sampler = ModelGuidedSampler(s, seed=0)
    study = optuna.create_study(sampler=sampler)
    for config in measured:
        trial = study.ask(distributions(s))
        trial.set_user_attr("key", config.key())
        trial.set_user_attr("config", dataclasses.asdict(config))
        trial.set_user_attr("outcome", str(Outcome.OK))
        study.tell(trial, pred[config.key()] * 1.3)
    return sampler, sampler.belief(study.get_trials())


def test_the_prior_width_is_the_models_stated_held_out_sd() -> None:
    """Before anything is measured, the average config's correction has the prior sd the time
    model states for it (its catalog terms' held-out error), not the wide generic prior's."""
    s = spec()
    sampler = ModelGuidedSampler(s, seed=0)
    sampler._candidates()
    report = enumerate_space(s)  # the sampler's candidates: the ranking, then memory probes
    stated = np.array([c.time.sigma for c in report.ranked() + report.probes if c.time])
    shape = np.square(sampler._x[:, 1:]) @ (1.0 / sampler._precision[1:])
    assert math.sqrt(shape.mean()) == pytest.approx(math.sqrt(np.mean(np.square(stated))))
    generic = np.square(sampler._x[:, 1:]) @ (1.0 / sampler._features.prior_precision[1:])
    assert shape.mean() < generic.mean() / 4  # the generic prior was far wider than stated
    assert sampler._precision[0] == sampler._features.prior_precision[0]  # intercept: kept


def test_measuring_a_config_narrows_its_neighbours_more_than_strangers() -> None:
    """The belief is correlated through shared knob values: after measuring configs with tp 1
    and 2, an untried config sharing their values is believed more tightly than one with a tp
    never measured, and each measurement narrows the neighbours further."""
    s = spec()
    ranked = [c.config for c in enumerate_space(s).ranked()]
    small = [c for c in ranked if c.tp in (1, 2)]
    sampler, few = _belief_after(s, small[:2])
    _, more = _belief_after(s, small[:6])
    configs = sampler._candidates()
    tp8 = np.array([configs[i].tp == 8 for i in few.open_])
    assert few.sd[~tp8].mean() < few.sd[tp8].mean()
    common = sorted(set(few.open_) & set(more.open_))
    sd_few = dict(zip(few.open_, few.sd, strict=True))
    sd_more = dict(zip(more.open_, more.sd, strict=True))
    narrower = [sd_more[i] < sd_few[i] for i in common if configs[i].tp in (1, 2)]
    assert narrower and all(narrower)
