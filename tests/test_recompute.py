"""Selective recompute's modules: one spelling everywhere, the strict loader, Megatron's rules."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from tuner.config.parallel import ParallelConfig
from tuner.config.rules import validate
from tuner.errors import ConfigError
from tuner.space.enumerate import config_from_settings, enumerate_space, expand_axes
from tuner.space.trials import config_from_params, config_params, distributions, oom_dominates
from tuner.spec.file import study_from_mapping
from tuner.spec.recompute import RECOMPUTE_MODULES, parse_recompute, recompute_text
from tuner.spec.study import StudySpec, TrainingSpec

# A small MoE (the stand-in runs it end to end in tests/test_study.py): 4 layers, 4 experts,
# top-2, no shared experts, grouped GEMM (the tuner's default).
MOE_STUDY: dict[str, Any] = {
    "name": "rc",
    "model": {
        "num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 512, "num_attention_heads": 4,
        "vocab_size": 1000, "seq_length": 256, "swiglu": True, "add_bias_linear": False,
        "moe": {"num_experts": 4, "router_topk": 2, "shared_expert_ffn_hidden_size": 512},
    },
    "training": {"global_batch_size": 16, "precision": "bf16"},
    "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 2, "nodes": ["a"]},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt", "megatron_path": "/opt/Megatron-LM"},
    "space": {"recompute": ["none", "selective", "selective:moe_act+core_attn"], "ep": [1, 2]},
}  # fmt: skip


def moe_study(**changes: Any) -> StudySpec:
    data = copy.deepcopy(MOE_STUDY)
    for path, value in changes.items():
        section, key = path.split("__")
        data[section][key] = value
    return study_from_mapping(data)


def test_one_spelling_reads_back() -> None:
    for text in ("none", "selective", "selective:core_attn+moe_act", "full:block:2",
                 "selective:" + "+".join(RECOMPUTE_MODULES)):  # fmt: skip
        k = parse_recompute(text)
        assert recompute_text(k.granularity, k.method, k.num_layers, k.modules) == text
    # Megatron's order, and core_attn alone is the default
    assert parse_recompute("selective:moe_act+core_attn").modules == ("core_attn", "moe_act")
    assert parse_recompute("selective:core_attn").modules is None
    c = ParallelConfig(recompute="selective", recompute_modules=["moe_act", "core_attn"])  # type: ignore[arg-type]
    assert c.recompute_modules == ("core_attn", "moe_act")
    assert c.recompute_setting == "selective:core_attn+moe_act"
    assert "recompute=selective:core_attn+moe_act" in c.key()
    stored = json.loads(json.dumps(dataclasses.asdict(c)))  # a trial's user_attrs["config"]
    assert stored["recompute_modules"] == ["core_attn", "moe_act"]
    assert ParallelConfig(**stored) == c
    default = ParallelConfig(recompute="selective", recompute_modules=("core_attn",))
    assert default == ParallelConfig(recompute="selective") and default.recompute_modules is None
    assert default.recomputed_modules == ("core_attn",)
    assert ParallelConfig(recompute="full").recomputed_modules == ()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (["selective:core_attn+attn"], "Invalid choices for recompute_modules: {'attn'}. "
         "Allowed modules are: {'core_attn', 'moe_act', 'layernorm', 'mla_up_proj', 'mlp', "
         "'moe', 'shared_experts'}"),
        (["selective:"], "is not one of"),
        (["full:uniform:1"], "recompute_method and recompute_num_layers"),
        (["selective", "selective:core_attn"], "listed twice"),
        (["selective:moe+moe"], "lists a module twice"),
    ],
)  # fmt: skip
def test_the_loader_refuses_bad_modules_naming_the_field(value: list[str], words: str) -> None:
    with pytest.raises(ConfigError) as info:
        moe_study(space__recompute=value)
    assert info.value.path.startswith("space.recompute[")
    text = str(info.value)
    assert words in text and "\n" not in text


def _violations(config: ParallelConfig, spec: StudySpec, **training: Any) -> dict[str, str]:
    t = TrainingSpec(global_batch_size=16, **training)
    return {
        v.rule: v.message for v in validate(config, spec.model, spec.world_size, spec.framework, t)
    }


def sel(*modules: str, **kw: Any) -> ParallelConfig:
    return ParallelConfig(dp=2, global_batch_size=16, recompute="selective",
                          recompute_modules=modules, **kw)  # fmt: skip


def test_each_rule_with_megatrons_message() -> None:
    spec = moe_study()
    assert _violations(sel("core_attn", "moe_act", "layernorm", "shared_experts"), spec) == {}
    no_grouped = moe_study(
        model__moe={"num_experts": 4, "router_topk": 2, "grouped_gemm": False},
        space__recompute=["selective"],
    )
    assert _violations(sel("moe_act"), no_grouped) == {
        "moe_act_grouped_gemm": "moe_act in recompute_modules is only supported with "
        "moe_grouped_gemm."
    }
    assert _violations(sel("mla_up_proj"), spec)["mla_up_proj_mla"] == (
        "mla_up_proj in recompute_modules is only supported with multi_latent_attention."
    )
    fp8 = _violations(sel("layernorm"), spec, precision="fp8", fp8_recipe="delayed")
    assert fp8["fp8_delayed_recompute"] == (
        "Delayed scaling does not support moe_act and layernorm recompute for fp8."
    )
    assert _violations(sel("moe_act"), spec, precision="fp8", fp8_recipe="tensorwise") == {}
    assert (
        "Invalid choices for recompute_modules: {'attn'}"
        in (_violations(sel("attn"), spec)["recompute_modules_invalid"])
    )
    full = ParallelConfig(dp=2, global_batch_size=16, recompute="full", recompute_method="uniform",
                          recompute_num_layers=1, recompute_modules=("moe",))  # fmt: skip
    assert "only used with selective" in _violations(full, spec)["recompute_modules_granularity"]
    assert "recomputes nothing" in _violations(sel(), spec)["recompute_modules_empty"]


def test_modules_with_nothing_to_recompute_are_refused() -> None:
    """A module the model lacks would repeat another config: the tuner's own rule."""
    spec = moe_study()  # every layer is MoE: no dense MLP for mlp
    assert "mlp" in _violations(sel("mlp"), spec)["recompute_module_idle"]
    assert "moe_act" in _violations(sel("moe", "moe_act"), spec)["recompute_module_idle"]
    dense = moe_study(model__moe=None, space__ep=[1], space__recompute=["selective"])
    for module in ("moe", "shared_experts", "layernorm"):
        assert module in _violations(sel(module), dense)["recompute_module_idle"]
    assert _violations(sel("mlp"), dense) == {}


def test_frameworks_without_the_flag_refuse_modules() -> None:
    spec = moe_study()
    c = sel("core_attn", "moe_act")
    for framework in ("megatron-deepspeed", "deepspeed"):
        found = validate(c, spec.model, spec.world_size, framework)  # type: ignore[arg-type]
        assert "recompute_modules_framework" in {v.rule for v in found}


def test_study_wide_rules_name_the_space_entry() -> None:
    with pytest.raises(ConfigError) as info:
        moe_study(training__precision="fp8", training__fp8_recipe="delayed")
    assert info.value.path == "space.recompute[2]"
    assert str(info.value).endswith(
        "Delayed scaling does not support moe_act and layernorm recompute for fp8."
    )
    with pytest.raises(ConfigError, match="only supported with multi_latent_attention"):
        moe_study(space__recompute=["selective:mla_up_proj"])


def test_the_space_optuna_and_set_carry_the_modules() -> None:
    spec = moe_study()
    axes = expand_axes(spec)
    assert ("selective", None, None, ("core_attn", "moe_act")) in axes.recompute
    dist = distributions(spec, axes)["recompute"]
    assert "selective:core_attn+moe_act" in dist.choices  # type: ignore[attr-defined]
    report = enumerate_space(spec, with_time=False)
    settings = {c.config.recompute_setting for c in report.viable}
    assert settings == {"none", "selective", "selective:core_attn+moe_act"}
    for cand in report.viable:
        assert config_from_params(spec, config_params(cand.config, axes)) == cand.config
    c = config_from_settings(spec, ["recompute=selective:moe_act+layernorm", "ep=2"])
    assert (c.recompute, c.recompute_modules) == ("selective", ("moe_act", "layernorm"))
    full = config_from_settings(spec, ["recompute=full:block:2"])
    assert full.recompute_setting == "full:block:2"
    with pytest.raises(ConfigError, match="--set recompute: Invalid choices"):
        config_from_settings(spec, ["recompute=selective:bogus"])


def test_fewer_recomputed_modules_need_at_least_as_much_memory() -> None:
    more, fewer = sel("core_attn", "moe_act"), sel("core_attn")
    assert oom_dominates(more, fewer) and not oom_dominates(fewer, more)
    assert oom_dominates(more, ParallelConfig(dp=2, global_batch_size=16))
