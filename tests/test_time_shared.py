"""One step-time estimate per configs the time model reads alike (``tuner.models.time.shared``):
each shared estimate equal to a fresh one on every valid config of spaces that list full
recompute's methods and chunks, and the recompute fraction shown to belong in the key."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tuner.config.parallel import ParallelConfig
from tuner.models.time import shared
from tuner.models.time.estimate import TimeBreakdown, estimate_time
from tuner.models.time.shared import SharedTimes
from tuner.space.enumerate import enumerate_space, iter_configs, study_gpu, study_violations
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec


def _moe() -> StudySpec:
    """mixtral-8x7b, full recompute by both methods in chunks of 1 to 4 layers, pp 1 to 8."""
    spec = load_study("mixtral-8x7b")
    knobs: dict[str, Any] = dict(
        tp=(1, 2), pp=(1, 2, 4, 8), vp=(1, 2), ep=(1, 4), micro_batch_size=(1, 2),
        recompute=("none", "full"), recompute_method=("uniform", "block"),
        recompute_num_layers=(1, 2, 4), moe_token_dispatcher=("alltoall", "flex"),
    )  # fmt: skip
    return dataclasses.replace(spec, space=dataclasses.replace(spec.space, **knobs))


def _dense() -> StudySpec:
    """llama3-8b with both methods in chunks of 1 to 8 layers."""
    spec = load_study("llama3-8b")
    knobs: dict[str, Any] = dict(
        recompute=("selective", "full"), recompute_method=("uniform", "block"),
        recompute_num_layers=(1, 2, 8),
    )  # fmt: skip
    return dataclasses.replace(spec, space=dataclasses.replace(spec.space, **knobs))


def _valid(spec: StudySpec) -> list[ParallelConfig]:
    return [c for c in iter_configs(spec) if not study_violations(c, spec)]


def _fresh(spec: StudySpec, config: ParallelConfig) -> TimeBreakdown:
    gpu, gpn = study_gpu(spec), spec.cluster.gpus_per_node
    return estimate_time(spec.model, spec.training, config, gpu, gpn, spec.framework)


def _shared_times(spec: StudySpec) -> tuple[list[TimeBreakdown], int]:
    """Every valid config's estimate through SharedTimes, walked in order; how many it made."""
    made: list[int] = []

    def estimate(config: ParallelConfig) -> TimeBreakdown:
        made.append(1)
        return _fresh(spec, config)

    times = SharedTimes(spec.model, estimate)
    return [times(c) for c in _valid(spec)], len(made)


@pytest.mark.parametrize("make", [_moe, _dense], ids=["moe", "dense"])
def test_a_shared_estimate_is_the_fresh_one_on_every_config(make: Any) -> None:
    spec = make()
    got, made = _shared_times(spec)
    assert got == [_fresh(spec, c) for c in _valid(spec)]
    assert made < 0.9 * len(got)  # shared, not only equal


@pytest.mark.parametrize("make", [_moe, _dense], ids=["moe", "dense"])
def test_the_recompute_fraction_belongs_in_the_key(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without it, the block method's partial chunks take the uniform method's estimate."""
    spec = make()
    monkeypatch.setattr(shared, "time_key", lambda config, model: shared._rest(config))
    got, _ = _shared_times(spec)
    assert got != [_fresh(spec, c) for c in _valid(spec)]


def test_the_enumeration_shares_only_on_the_fast_path_with_catalog_terms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[ParallelConfig] = []
    real = SharedTimes.__call__

    def counted(self: SharedTimes, config: ParallelConfig) -> TimeBreakdown:
        made.append(config)
        return real(self, config)

    monkeypatch.setattr(SharedTimes, "__call__", counted)
    spec = _dense()
    fast = enumerate_space(spec, keep_oom=True)
    assert made
    made.clear()
    exact = enumerate_space(spec, keep_oom=True, fast=False)
    assert not made
    assert [(c.config, c.time) for c in fast.ranked()] == [
        (c.config, c.time) for c in exact.ranked()
    ]
    enumerate_space(load_study("llama3-8b"))  # one full-recompute setting: nothing alike
    assert not made
