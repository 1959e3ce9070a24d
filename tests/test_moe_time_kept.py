"""One MoE layer's times and its routing's, kept per the knobs they read (moe.MOE_TIME_KNOBS),
against the same terms computed afresh, for every valid config of MoE spaces that vary each
knob (the expert grid, the three dispatchers, SP, micro-batch, recompute, the optimizer,
DeepSpeed-MoE's padded capacity) on the links the time model gives them. Leaving any of the
key's knobs out fails it but sequence parallelism, which no rule lets vary among valid MoE
configs at tp > 1 (Megatron requires it there) and which the terms read all the same."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tuner.models import moe
from tuner.models.moe import (
    MOE_TIME_KNOBS,
    framework_moe,
    moe_layer_times,
    moe_layer_times_uncached,
    tp_ep_group_size,
)
from tuner.models.rates import catalog_rates, group_link
from tuner.models.time import moe as time_moe
from tuner.models.time.moe import moe_routing_times, moe_routing_times_uncached
from tuner.space.enumerate import iter_configs, study_gpu, study_violations
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec


def _with(name: str, **space: Any) -> StudySpec:
    spec = load_study(name)
    return dataclasses.replace(spec, space=dataclasses.replace(spec.space, **space))


SPACES = {
    "megatron": lambda: _with(
        "mixtral-8x7b",
        tp=(1, 2, 4),
        pp=(1, 2),
        cp=(1, 2),
        ep=(1, 2, 8),
        etp=(1, 2),
        micro_batch_size=(1, 2),
        sequence_parallel=(True, False),
        recompute=("none", "full"),
        distributed_optimizer=(True, False),
        moe_token_dispatcher=("alltoall", "allgather", "flex"),
    ),
    "deepspeed": lambda: _with("demo-moe", zero_stage=(0, 1, 2), micro_batch_size=(1, 2, 4)),
}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_the_kept_moe_times_are_each_configs_own(name: str) -> None:
    spec = SPACES[name]()
    rates = catalog_rates(study_gpu(spec), spec.training.precision)
    gpn = spec.cluster.gpus_per_node
    moe._LAYER_TIMES.clear()
    time_moe._ROUTING_TIMES.clear()
    calls = 0
    for c in iter_configs(spec):
        if study_violations(c, spec):
            continue
        model = framework_moe(spec.model, c, spec.framework)
        ring = group_link(rates, tp_ep_group_size(c), 1, gpn)
        tp_cp = group_link(rates, c.tp * c.cp, 1, gpn)
        # kept from an earlier config that differs only in knobs the terms do not read
        assert moe_layer_times(model, rates, c, gpn, ring) == moe_layer_times_uncached(
            model, rates, c, gpn, ring
        )
        assert moe_routing_times(model, rates, c, tp_cp, ring) == moe_routing_times_uncached(
            model, rates, c, tp_cp, ring
        )
        calls += 1
    assert calls > len(moe._LAYER_TIMES) > 0, "configs shared kept layer times"
    assert calls > len(time_moe._ROUTING_TIMES) > 0, "configs shared kept routing times"


def test_the_knobs_of_the_key_are_config_fields() -> None:
    config = next(iter(iter_configs(load_study("mixtral-8x7b"))))
    assert set(MOE_TIME_KNOBS) <= set(dataclasses.asdict(config))
