"""Megatron's and DeepSpeed's own rules, each named with its numbers."""

from __future__ import annotations

import pytest

from tuner.config.parallel import ParallelConfig
from tuner.config.rules import check, validate
from tuner.errors import ValidationError
from tuner.spec.study import ModelSpec

MODEL = ModelSpec(
    num_layers=24, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
    num_query_groups=4, vocab_size=50257, seq_length=2048,
)  # fmt: skip


def cfg(**kw: object) -> ParallelConfig:
    base: dict[str, object] = dict(tp=2, pp=2, dp=4, micro_batch_size=2, global_batch_size=64)
    base.update(kw)
    return ParallelConfig(**base)  # type: ignore[arg-type]


def rules(c: ParallelConfig, world: int = 16, framework: str = "megatron") -> list[str]:
    return [e.rule for e in validate(c, MODEL, world, framework)]  # type: ignore[arg-type]


def test_valid_config_and_derived_values() -> None:
    c = cfg()
    assert rules(c) == []
    assert c.world_size == 16 and c.num_microbatches == 8 and c.grad_accum == 8
    assert "tp=2,pp=2" in c.key() and c.to_dict()["grad_accum"] == 8


@pytest.mark.parametrize(
    ("change", "world", "rule", "text"),
    [
        ({"tp": 3, "dp": 2}, 16, "world_divisible", "tp(3) * pp(2) * cp(1) = 6 does not divide"),
        ({"dp": 3}, 16, "dp_mismatch", "dp(3) must be world size 16"),
        ({"tp": 8, "pp": 1, "dp": 2}, 16, "query_groups_tp",
         "num_query_groups (4) must be a multiple of tensor_model_parallel_size (8)"),
        ({"pp": 5, "tp": 1, "dp": 3}, 15, "layers_pp", "num_layers (24) is not divisible"),
        ({"vp": 2, "pp": 1, "dp": 8}, 16, "vp_needs_pp", "needs pipeline-model-parallel size > 1"),
        ({"vp": 5}, 16, "layers_pp_vp", "pp(2) * vp(5) = 10"),
        ({"micro_batch_size": 3}, 16, "global_batch",
         "global batch size (64) is not divisible by micro batch size (3) times data parallel "
         "size (4)"),
        ({"tp": 1, "dp": 8, "sequence_parallel": True}, 16, "sp_needs_tp", "needs tp > 1"),
        ({"cp": 2, "dp": 2}, 16, "cp_seq_ok", ""),
        ({"recompute": "selective", "recompute_method": "block"}, 16, "recompute_method",
         "only used with full"),
        ({"recompute": "full"}, 16, "recompute_method", 'must be "block" or "uniform"'),
        ({"recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 13}, 16,
         "recompute_num_layers", "between 1 and num_layers_per_pipeline_rank: 12"),
        ({"zero_stage": 1}, 16, "zero_megatron", "DeepSpeed setting"),
    ],
)  # fmt: skip
def test_megatron_rules(change: dict, world: int, rule: str, text: str) -> None:
    errors = validate(cfg(**change), MODEL, world, "megatron")
    if rule == "cp_seq_ok":
        assert errors == []  # 2048 % (2 * 2) == 0
        return
    assert rule in [e.rule for e in errors]
    assert any(text in e.message for e in errors), [e.message for e in errors]


def test_cp_needs_sequence_multiple_of_2cp() -> None:
    model = ModelSpec(
        num_layers=24, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
        vocab_size=50257, seq_length=2050,
    )  # fmt: skip
    errors = validate(cfg(cp=4, dp=1), model, 16, "megatron")
    assert any(
        e.message.startswith("seq_length (2050) should be a multiple of 2 * context-parallel-size")
        for e in errors
    )


def test_sequence_parallel_needs_sequence_divisible_by_tp() -> None:
    model = ModelSpec(
        num_layers=24, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
        vocab_size=50257, seq_length=2046,
    )  # fmt: skip
    errors = validate(cfg(sequence_parallel=True, tp=4, dp=2), model, 16, "megatron")
    assert "sp_seq_tp" in [e.rule for e in errors]


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"tp": 1, "pp": 2, "dp": 8, "zero_stage": 2}, "zero_pipeline"),
        ({"tp": 1, "pp": 2, "dp": 8, "zero_stage": 3}, "zero_pipeline"),
        ({"tp": 2, "pp": 1, "dp": 8}, "deepspeed_parallel"),
        ({"tp": 1, "pp": 1, "dp": 16, "distributed_optimizer": True}, "distopt_deepspeed"),
        ({"tp": 1, "pp": 1, "dp": 16, "recompute": "selective"}, "deepspeed_selective"),
    ],
)
def test_deepspeed_rules(change: dict, rule: str) -> None:
    assert rule in rules(cfg(**change), 16, "deepspeed")


def test_deepspeed_valid_pipeline_with_zero1() -> None:
    assert rules(cfg(tp=1, pp=2, dp=8, zero_stage=1), 16, "deepspeed") == []


def test_check_raises_with_every_rule() -> None:
    with pytest.raises(ValidationError) as info:
        check(cfg(tp=3, micro_batch_size=3), MODEL, 16, "megatron")
    assert "does not divide world size 16" in str(info.value)


def test_non_positive_sizes_stop_early() -> None:
    assert rules(cfg(tp=0)) == ["positive"]
