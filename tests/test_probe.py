"""Memory probes: the near-limit configs a model error could hide get one launch, the rest none."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from statistics import NormalDist
from typing import Any

import optuna
import pytest

from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import GIB
from tuner.outcome import Outcome
from tuner.search.sampler import ModelGuidedSampler
from tuner.space.enumerate import enumerate_space
from tuner.space.probes import MEMORY_SIGMA, MIN_FIT_PROBABILITY, fit_probability, may_probe
from tuner.space.trials import config_from_params, distributions
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec
from tuner.study.build import build_loop

BASE: dict[str, Any] = {
    "name": "probe",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "num_nodes": 1, "executor": "local"},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt"},
    "space": {"tp": [1, 2, 4, 8], "micro_batch_size": [1, 2, 4, 8],
              "recompute": ["none", "selective", "full"], "sequence_parallel": [True],
              "distributed_optimizer": [True, False]},
    "search": {"sampler": "model", "seed": 0},
}  # fmt: skip


def spec(memory_gib: float | None = None, **search: Any) -> StudySpec:
    data = copy.deepcopy(BASE)
    if memory_gib is not None:
        data["cluster"]["gpu_memory_gib"] = memory_gib
    data["search"].update(search)
    return study_from_mapping(data)


def fastest() -> tuple[ParallelConfig, float]:
    """The time model's fastest config of the space when memory is no object, and its peak."""
    best = enumerate_space(spec(memory_gib=10_000.0)).ranked()[0]
    return best.config, best.memory.peak / GIB


def test_the_chance_of_fitting_is_a_log_normal_tail() -> None:
    assert fit_probability(80.0, 80.0) == pytest.approx(0.5)
    assert fit_probability(80.0 * math.exp(MEMORY_SIGMA), 80.0) == pytest.approx(0.1587, abs=1e-3)
    assert fit_probability(60.0, 80.0) > 0.99
    assert fit_probability(120.0, 80.0) < 1e-6
    assert may_probe(82.7, 80.0)  # the replayed cluster's hidden best: 3% over
    assert not may_probe(80.0 * math.exp(2 * MEMORY_SIGMA), 80.0)
    assert fit_probability(81.0, 80.0, sigma=0.0) == 0.0


def test_a_fast_config_just_over_the_limit_is_probed_not_pruned() -> None:
    config, peak = fastest()
    s = spec(memory_gib=peak / 1.03)  # 3% over the GPU, far over the 92% headroom
    report = enumerate_space(s)
    assert config.key() not in {c.config.key() for c in report.viable}
    probes = [c.config.key() for c in report.probes]
    assert probes[0] == config.key()
    assert len(probes) <= s.search.memory_probes
    assert report.counts()["memory_probes"] == len(probes)
    for c in report.probes:  # each is faster than anything that fits, and could fit
        assert c.time is not None and c.time.step < report.ranked()[0].time.step  # type: ignore[union-attr]
        assert fit_probability(c.memory.peak / GIB, s.cluster.gpu_memory_gib or 0) >= (
            MIN_FIT_PROBABILITY
        )


def test_the_probes_band_is_the_configs_own_stated_sd() -> None:
    """Whether a config is probed depends on its own stated sd (its terms' held-out errors,
    tuner.models.uncertainty), not on the former fixed 8%: a config over the GPU by more than
    the 8% band allows, but within its own, is probed."""
    best = enumerate_space(spec(memory_gib=10_000.0)).ranked()[0]
    sd, peak = best.memory.sigma, best.memory.peak / GIB
    assert sd > MEMORY_SIGMA  # a catalog device figure of a stack never measured
    z = -NormalDist().inv_cdf(MIN_FIT_PROBABILITY)
    over = math.exp(z * (MEMORY_SIGMA + sd) / 2)  # past the 8% band, inside its own
    capacity = peak / over
    assert fit_probability(peak, capacity, MEMORY_SIGMA) < MIN_FIT_PROBABILITY
    report = enumerate_space(spec(memory_gib=capacity))
    assert best.config.key() in {c.config.key() for c in report.probes}


def test_clearly_over_the_limit_stays_pruned() -> None:
    config, peak = fastest()
    report = enumerate_space(spec(memory_gib=peak / 1.3))
    assert config.key() not in {c.config.key() for c in report.probes}


def test_probes_can_be_turned_off() -> None:
    _, peak = fastest()
    assert enumerate_space(spec(memory_gib=peak / 1.03, memory_probes=0)).probes == []


def test_the_sampler_probes_only_after_a_measured_peak_and_drops_a_refuted_probe() -> None:
    config, peak = fastest()
    s = spec(memory_gib=peak / 1.03)
    sampler = ModelGuidedSampler(s, seed=0)
    study = optuna.create_study(sampler=sampler)

    def ask() -> tuple[optuna.Trial, ParallelConfig]:
        trial = study.ask(distributions(s))
        c = config_from_params(s, trial.params)
        trial.set_user_attr("key", c.key())
        trial.set_user_attr("config", dataclasses.asdict(c))
        return trial, c

    trial, first = ask()
    assert first.key() != config.key()  # never blind: the first run is the fastest that fits
    predicted = next(c for c in enumerate_space(s).ranked() if c.config.key() == first.key())
    trial.set_user_attr("outcome", str(Outcome.OK))
    trial.set_user_attr("predicted_allocated_gib", predicted.memory.allocated / GIB)
    trial.set_user_attr("peak_memory_gib", predicted.memory.allocated / GIB)  # model exact
    study.tell(trial, 1.0)
    assert sampler.choose(study.get_trials(deepcopy=False)) == config  # now worth its probe

    # Measured peaks 30% over the model everywhere: the probe can no longer fit, so it is dropped.
    study2 = optuna.create_study(sampler=ModelGuidedSampler(s, seed=0))
    study = study2
    trial, first = ask()
    trial.set_user_attr("outcome", str(Outcome.OK))
    trial.set_user_attr("predicted_allocated_gib", predicted.memory.allocated / GIB)
    trial.set_user_attr("peak_memory_gib", 1.3 * predicted.memory.allocated / GIB)
    study.tell(trial, 1.0)
    sampler2 = study2.sampler
    assert isinstance(sampler2, ModelGuidedSampler)
    assert sampler2.choose(study.get_trials(deepcopy=False)) != config


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_the_sampler_and_the_screen_share_one_enumeration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The space is walked (every config's memory and time estimated) once per loop: the seeding,
    the model sampler's candidates and the screen's memory probes come from one enumeration."""
    import tuner.space.enumerate

    walks = []
    walk = tuner.space.enumerate.iter_blocks  # the walk every enumeration takes

    def counted(*args: Any, **kwargs: Any) -> Any:
        walks.append(1)
        return walk(*args, **kwargs)

    monkeypatch.setattr(tuner.space.enumerate, "iter_blocks", counted)
    config, peak = fastest()
    walks.clear()
    s = spec(memory_gib=peak / 1.03)
    loop = build_loop(s, results=str(tmp_path))
    try:
        loop.seed()  # the space's counts for the summary, from the same enumeration
        sampler = loop.study.sampler
        assert isinstance(sampler, ModelGuidedSampler)
        first = sampler.choose([])
        assert first is not None and first.key() != config.key()  # the fastest that fits
        trial = loop.study.ask(distributions(s))
        assert loop.screen(trial, config, [])  # over the headroom, but the study's probe
        assert trial.user_attrs["memory_probe"] is True
    finally:
        loop.executor.close()
    assert len(walks) == 1


def test_a_config_within_the_headroom_but_not_surely_is_at_risk() -> None:
    """tune estimate's verdict (tuner.api.Estimate): a config inside the 92% headroom whose own
    sd leaves at least a 1% chance of exceeding the GPU is at risk, not a sure fit."""
    from tuner.api import estimate

    best = enumerate_space(spec(memory_gib=10_000.0)).ranked()[0]
    peak = best.memory.peak / GIB
    tight = estimate(spec(memory_gib=peak / 0.85), best.config)
    assert tight.fits and tight.memory_risk
    assert tight.fit_probability is not None and tight.fit_probability < 0.99
    roomy = estimate(spec(memory_gib=peak * 3), best.config)
    assert roomy.fits and not roomy.memory_risk
    assert roomy.to_dict()["memory_risk"] is False
