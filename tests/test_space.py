"""Space expansion, enumeration and --set parsing."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tuner.config.rules import validate
from tuner.errors import ConfigError
from tuner.space.enumerate import (
    config_from_settings,
    enumerate_space,
    expand_axes,
    iter_configs,
    require_viable,
)
from tuner.spec.file import load_study, study_from_mapping

BASE: dict[str, Any] = {
    "name": "s",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "a100-40gb", "gpus_per_node": 8, "nodes": ["n1", "n2"]},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt"},
    "space": {
        "tp": "auto",
        "pp": "auto",
        "cp": [1],
        "vp": [1, 2],
        "micro_batch_size": [1, 2, 4],
        "sequence_parallel": [True, False],
        "recompute": ["none", "selective", "full"],
        "recompute_method": ["uniform", "block"],
        "recompute_num_layers": "auto",
        "distributed_optimizer": [True, False],
    },  # fmt: skip
}


def spec(**space: Any) -> Any:
    data = copy.deepcopy(BASE)
    data["space"].update(space)
    return study_from_mapping(data)


def test_auto_axes() -> None:
    axes = expand_axes(spec())
    assert axes.tp == (1, 2, 4, 8)  # powers of two up to gpus_per_node dividing 32 heads
    assert axes.pp == (1, 2, 4, 8, 16)  # divisors of 32 layers up to 16 ranks
    # none, selective, then full x {uniform, block} x {1, all layers of the stage}
    assert len(axes.recompute) == 2 + 2 * 1
    # tp 2, 4, 8 with SP on and off, tp=1 with SP off only (Megatron turns it off there)
    assert axes.size == (3 * 2 + 1) * 5 * 1 * 2 * 3 * 4 * 2


def test_enumeration_counts_add_up_and_every_viable_is_valid() -> None:
    s = spec()
    report = enumerate_space(s, keep_oom=True)
    assert report.total == expand_axes(s).size
    assert report.invalid == sum(report.invalid_by_rule.values())
    assert report.total == report.invalid + report.predicted_oom + len(report.viable)
    assert report.predicted_oom > 0 and report.viable
    for cand in report.viable:
        assert validate(cand.config, s.model, s.world_size, "megatron") == []
        assert cand.config.world_size == 16
    assert all(not c.fits for c in report.oom)
    keys = [c.key() for c in iter_configs(s)]
    assert len(keys) == len(set(keys))


def test_sequence_parallel_on_keeps_tp1_configs_with_sp_off() -> None:
    """`sequence_parallel: [true]` means SP where it applies, not "drop every tp=1 config"."""
    s = spec(tp=[1, 2], pp=[1], vp=[1], micro_batch_size=[1], sequence_parallel=[True],
             recompute=["none"], distributed_optimizer=[False])  # fmt: skip
    configs = list(iter_configs(s))
    assert [(c.tp, c.sequence_parallel) for c in configs] == [(1, False), (2, True)]
    assert expand_axes(s).size == len(configs) == 2
    assert all(not validate(c, s.model, s.world_size, s.framework) for c in configs)

    from tuner.space.trials import config_from_params, config_params

    params = config_params(configs[1]) | {"tp": 1}  # what an Optuna sampler may propose
    assert config_from_params(s, params).sequence_parallel is False
    # enqueuing the tp=1 config must use a value the SP distribution has: True, meaning off
    tp1 = config_params(configs[0], expand_axes(s))
    assert tp1["sp"] is True
    assert config_from_params(s, tp1) == configs[0]


def test_auto_recompute_layers_uses_the_stage_size() -> None:
    configs = [c for c in iter_configs(spec()) if c.recompute == "full" and c.pp == 4]
    assert {c.recompute_num_layers for c in configs if c.vp == 1} == {8}


def test_set_builds_one_config() -> None:
    s = spec()
    c = config_from_settings(s, ["tp=2", "pp=2", "mbs=4", "sp=true", "recompute=full"])
    assert (c.tp, c.pp, c.dp, c.micro_batch_size) == (2, 2, 4, 4)
    assert c.sequence_parallel and c.recompute_method == "uniform" and c.recompute_num_layers
    c = config_from_settings(s, ["recompute=selective"])
    assert c.recompute_method is None and c.recompute_num_layers is None


@pytest.mark.parametrize(
    ("item", "words"),
    [("tp", "expected key=value"), ("tp=two", "--set tp: expected an integer"),
     ("sp=maybe", "--set sp: expected true or false"), ("color=red", "--set color: unknown key"),
     ("recompute=most", "not one of"),
     ("micro_batch_sizes=2", r"--set micro_batch_sizes: unknown key; did you mean "
                             r"'micro_batch_size'\? \(known: ")],
)  # fmt: skip
def test_set_errors(item: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        config_from_settings(spec(), [item])


def test_gpt70b_space_has_viable_configs_and_prunes_oom() -> None:
    report = enumerate_space(load_study("gpt-70b"))
    counts = report.counts()
    assert counts["viable"] > 100 and counts["predicted_oom"] > 100
    # tp=1 without recompute cannot hold a 70B model's activations at 4096 tokens on 80 GB.
    assert not any(c.config.tp == 1 and c.config.recompute == "none" for c in report.viable)


def test_a_space_with_no_viable_config_is_refused_with_its_counts() -> None:
    s = spec(tp=[1], pp=[1], vp=[1], micro_batch_size=[16], recompute=["none"],
             sequence_parallel=[False], distributed_optimizer=[False])  # fmt: skip
    report = enumerate_space(s)
    assert not report.viable
    with pytest.raises(ConfigError) as info:
        require_viable(s, report)
    message = str(info.value)
    assert info.value.path == "space" and "\n" not in message
    assert "search space of s" in message
    assert f"{report.total} total" in message
    assert f"{report.predicted_oom} predicted OOM" in message
    require_viable(spec(), enumerate_space(spec()))  # a space with viable configs passes


def test_auto_pp_of_a_deep_model_is_fast_and_an_exploding_space_is_refused() -> None:
    deep = copy.deepcopy(BASE)
    deep["model"] = {"preset": "llama2-7b", "num_layers": 4096}
    assert expand_axes(study_from_mapping(deep)).pp == (1, 2, 4, 8, 16)
    many = list(range(1, 101))
    with pytest.raises(ConfigError, match="combinations, more than 1,000,000") as info:
        expand_axes(spec(tp=many, pp=many, micro_batch_size=many))
    assert info.value.path == "space"
