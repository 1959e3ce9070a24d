"""The space's configs built field by field (tuner.config.build) are the constructor's: every
config of spaces that vary each knob, torchtitan's own and selective-recompute modules given
in a non-canonical order included, equals ``ParallelConfig(**fields)`` field by field and in
type, and hashes alike."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tuner.config.build import FIELDS, built, replaced
from tuner.config.parallel import ParallelConfig
from tuner.space.enumerate import expand_axes, iter_configs
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec


def _with(name: str, **space: Any) -> StudySpec:
    spec = load_study(name)
    return dataclasses.replace(spec, space=dataclasses.replace(spec.space, **space))


SPACES = {
    "gpt-70b": lambda: load_study("gpt-70b"),
    "moe": lambda: _with(
        "mixtral-8x7b",
        ep=(1, 2, 8),
        etp=(1, 2),
        tp_comm_overlap=(False, True),
        recompute=("none", "selective:moe_act+core_attn", "selective", "full"),
        recompute_method=("uniform", "block"),
        recompute_num_layers=(1, 2),
        moe_token_dispatcher=("alltoall", "allgather", "flex"),
    ),  # fmt: skip
    "deepspeed": lambda: _with("demo", pp=(1, 2), zero_stage=(0, 1, 2, 3)),
    "torchtitan": lambda: _with("demo-fsdp", micro_batch_size=(1, 2), dp_replicate=(1, 2)),
}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_every_config_is_the_constructors(name: str) -> None:
    spec = SPACES[name]()
    configs = list(iter_configs(spec))
    assert len(configs) == expand_axes(spec).size or spec.framework == "torchtitan"
    for config in configs:
        fields = {f: getattr(config, f) for f in FIELDS}
        rebuilt = ParallelConfig(**fields)
        assert rebuilt == config and hash(rebuilt) == hash(config)
        assert all(type(getattr(rebuilt, f)) is type(fields[f]) for f in FIELDS)
    if name == "moe":  # the modules as the constructor stores them: core_attn alone is None
        assert {c.recompute_modules for c in configs} == {None, ("core_attn", "moe_act")}


def test_built_sets_exactly_the_values_given() -> None:
    config = ParallelConfig(tp=2, pp=4, vp=2, ep=2, recompute="full", recompute_method="block",
                            recompute_num_layers=3, pipeline_split="first=1,last=1")  # fmt: skip
    values = tuple(getattr(config, f) for f in FIELDS)
    assert built(values) == config
    with pytest.raises(ValueError):  # every field, no fewer
        built(values[:-1])


def test_replaced_is_dataclasses_replace() -> None:
    spec = SPACES["moe"]()
    configs = list(iter_configs(spec))[::97]
    changes: list[dict[str, Any]] = [
        {"moe_token_dispatcher": "alltoall"},
        {"tp": 4, "cp": 1, "dp": 3, "global_batch_size": 12},
        {"compile": True, "pp_schedule": "1F1B"},
    ]
    for config in configs:
        for change in changes:
            assert replaced(config, **change) == dataclasses.replace(config, **change)
    with pytest.raises(ValueError, match="recompute_modules"):
        replaced(configs[0], recompute_modules=("moe_act",))
