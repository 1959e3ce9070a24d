"""torchtitan as a framework: its knobs in the space, its own rules, its trial parameters."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import stage_layers
from tuner.errors import ConfigError
from tuner.models.memory.estimate import estimate_memory
from tuner.space.enumerate import enumerate_space, expand_axes, iter_configs, study_violations
from tuner.space.trials import config_from_params, config_params, distributions
from tuner.spec.file import study_from_mapping
from tuner.spec.torchtitan import stage_layer_counts

TITAN: dict[str, Any] = {
    "name": "tt",
    "model": {"preset": "llama3-8b"},
    "training": {"global_batch_size": 64, "precision": "bf16"},
    "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 1, "executor": "local"},
    "framework": "torchtitan",
    "launch": {"template": "torchtitan_llama",
               "script_args": ["--module", "llama3", "--config", "llama3_8b"]},
    "space": {
        "tp": [1, 2], "pp": [1, 2], "cp": [1, 2], "micro_batch_size": [1, 2],
        "sequence_parallel": [True], "recompute": ["none", "selective", "full"],
        "dp_replicate": [1, 2], "pp_schedule": ["1F1B", "Interleaved1F1B"],
        "reshard_after_forward": ["default", "never"], "compile": [False, True],
    },
}  # fmt: skip


def titan(**space: Any) -> Any:
    data = copy.deepcopy(TITAN)
    data["space"].update(space)
    return study_from_mapping(data)


def test_dp_shard_takes_the_rest_and_the_schedule_sets_the_stages_per_rank() -> None:
    configs = list(iter_configs(titan()))
    c = next(c for c in configs if (c.tp, c.pp, c.cp, c.dp_replicate) == (2, 2, 1, 1))
    assert c.dp_shard == 2 and c.dp == 2  # 8 / (tp 2 x pp 2)
    hsdp = next(c for c in configs if (c.tp, c.pp, c.cp, c.dp_replicate) == (1, 1, 2, 2))
    assert (hsdp.dp, hsdp.dp_shard) == (4, 2)
    looped = {c.vp for c in configs if c.pp_schedule == "Interleaved1F1B"}
    assert looped == {2} and {c.vp for c in configs if c.pp == 1} == {1}
    assert {c.pp_schedule for c in configs if c.pp == 1} == {None}  # no schedule runs at pp=1
    assert len({c.key() for c in configs}) == len(configs)  # no config twice


def test_explicit_dp_shard_that_misses_the_world_breaks_parallel_dims() -> None:
    s = titan(dp_shard=[2], tp=[1], pp=[1], cp=[1], dp_replicate=[1])
    errors = study_violations(next(iter_configs(s)), s)
    assert errors[0].rule == "world_divisible"
    assert errors[0].message == (
        "Invalid parallel dims: dp_replicate(1) * dp_shard(2) * cp(1) * tp(1) * pp(1) != "
        "WORLD_SIZE(8)"
    )


def test_torchtitan_rules_say_what_the_release_says() -> None:
    s = titan()
    base = ParallelConfig(tp=1, pp=1, cp=1, dp=8, micro_batch_size=1, global_batch_size=64)

    def messages(**changes: Any) -> list[str]:
        c = ParallelConfig(**_fields(base, changes))
        return [v.message for v in study_violations(c, s)]

    assert messages() == []
    assert messages(tp=8, dp=1, sequence_parallel=True) == []  # 32 heads, 8 KV heads
    gqa = copy.deepcopy(TITAN)
    gqa["model"]["num_query_groups"] = 2
    c = ParallelConfig(**_fields(base, {"tp": 4, "dp": 2, "sequence_parallel": True}))
    assert [v.message for v in study_violations(c, study_from_mapping(gqa))] == [
        "tensor_parallel_degree (4) must divide n_kv_heads (2)."
    ]
    assert messages(cp=3, dp=2)[-1] == (
        "Training sequence length (8192) must be divisible by 6 for the configured "
        "sequence/context parallelism."
    )
    assert "Async TP requires 'model' in --compile.components and --compile.enable" in messages(
        tp=2, dp=4, sequence_parallel=True, tp_comm_overlap=True
    )
    assert messages(tp=2, dp=4, sequence_parallel=True, tp_comm_overlap=True, compile=True) == []
    assert messages(micro_batch_size=3) == [
        "global batch size must be multiple of local batch size times data-parallel degree "
        "(64 % (3 * 8) != 0)"
    ]
    pipelined = messages(pp=2, dp=4, micro_batch_size=3, pp_schedule="1F1B")
    assert pipelined == [
        "training.local_batch_size (16) must be evenly divisible by "
        "parallelism.pipeline_parallel_microbatch_size (3) when pipeline parallelism is enabled."
    ]
    assert messages(recompute="full", recompute_method="block", recompute_num_layers=2)


def _fields(base: ParallelConfig, changes: dict[str, Any]) -> dict[str, Any]:
    out = {name: getattr(base, name) for name in base.__dataclass_fields__}
    return out | changes


def test_every_config_round_trips_through_its_trial_parameters() -> None:
    s = titan(dp_shard=[-1, 4])
    axes = expand_axes(s)
    dists = distributions(s, axes)
    for c in iter_configs(s, axes):
        params = config_params(c, axes)
        for name, value in params.items():
            assert value in dists[name].choices, (name, value)  # type: ignore[attr-defined]
        back = config_from_params(s, params)
        assert back.key() == c.key()


def test_every_torchtitan_knob_is_a_leaderboard_column() -> None:
    from tuner.report.leaderboard import COLUMNS

    names = set(distributions(titan()))
    assert {"dp_shard", "dp_replicate", "pp_schedule", "reshard", "compile"} <= names
    assert names <= set(COLUMNS), names - set(COLUMNS)


def test_torchtitan_knobs_belong_to_torchtitan_studies() -> None:
    data = copy.deepcopy(TITAN)
    data["framework"], data["launch"] = "megatron", {"template": "megatron_gpt"}
    data["space"] = {"dp_replicate": [1, 2]}
    with pytest.raises(ConfigError, match="space.dp_replicate.*torchtitan knob"):
        study_from_mapping(data)
    with pytest.raises(ConfigError, match="space.zero_stage.*FSDP2"):
        titan(zero_stage=[0, 3])
    with pytest.raises(ConfigError, match="space.vp.*pp_schedule"):
        titan(vp=[1, 2])
    fp16 = copy.deepcopy(TITAN)
    fp16["training"]["precision"] = "fp16"
    with pytest.raises(ConfigError, match="training.precision.*bf16.*fp32"):
        study_from_mapping(fp16)


def test_stage_split_follows_torchtitan() -> None:
    # (L + 2) effective layers dealt evenly, the first stages taking the remainder, the first
    # and last each giving one layer's room to the embedding and the output
    assert stage_layer_counts(32, 2) == (16, 16)
    assert stage_layer_counts(32, 4) == (8, 9, 8, 7)
    assert stage_layer_counts(6, 4) == (1, 2, 2, 1)
    c = ParallelConfig(pp=2, vp=2, dp=4, pp_schedule="Interleaved1F1B", global_batch_size=64)
    # stages 0..3 on ranks 0, 1, 0, 1
    assert stage_layers(titan().model, c, "torchtitan") == (8 + 8, 9 + 7)


def test_fsdp2_shards_the_states_over_dp_shard_times_cp() -> None:
    s, gpu = titan(), get_gpu("h100-sxm-80gb")
    common = {"tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 64}
    fsdp4 = estimate_memory(s.model, ParallelConfig(cp=1, dp=4, **common), gpu, "torchtitan")
    fsdp4_cp2 = estimate_memory(s.model, ParallelConfig(cp=2, dp=4, **common), gpu, "torchtitan")
    hsdp = estimate_memory(
        s.model, ParallelConfig(cp=1, dp=4, dp_replicate=2, **common), gpu, "torchtitan"
    )
    # 16 B per parameter (fp32 shard, fp32 sharded grad, Adam), no master copy
    total = fsdp4.weights + fsdp4.grads + fsdp4.optimizer
    assert total == pytest.approx(16 * fsdp4.params / 4)
    assert fsdp4_cp2.optimizer == pytest.approx(fsdp4.optimizer / 2)  # the FSDP mesh is 4 x 2
    assert hsdp.optimizer == pytest.approx(fsdp4.optimizer * 2)  # HSDP shards over 2, not 4
    never = estimate_memory(
        s.model, ParallelConfig(dp=8, reshard_after_forward="never", **common), gpu, "torchtitan"
    )
    default = estimate_memory(s.model, ParallelConfig(dp=8, **common), gpu, "torchtitan")
    # never resharding keeps every unit gathered in bf16 through the step, beyond the two in
    # flight either way (the largest unit here: the output layer, vocab x hidden)
    largest = s.model.vocab_size * s.model.hidden_size
    assert never.framework_buffers - default.framework_buffers == pytest.approx(
        2 * (default.params - 2 * largest)
    )


def test_a_torchtitan_space_enumerates_with_predictions() -> None:
    report = enumerate_space(titan())
    assert report.viable and all(c.time is not None for c in report.viable)
    assert set(report.invalid_by_rule) <= {"world_divisible", "global_batch", "seq_divisible"}


def test_op_sac_keeps_less_than_none_and_more_than_full_and_matches_the_published_peak() -> None:
    """torchtitan's benchmark (pytorch/torchtitan@b5bcd76c66d0
    benchmarks/llama3_h100_202412_torchtitan.md Table 1, 'FSDP'): Llama 3.1 8B on 8 H100
    (96 GB), local batch 2, seq 8192, per-op SAC, max reserved 82.4 GiB on the busiest rank."""
    s = titan()
    gpu = get_gpu("h100-sxm-80gb", 96.0)
    common = {"dp": 8, "micro_batch_size": 2, "global_batch_size": 16}
    peaks = {
        rc: estimate_memory(
            s.model, ParallelConfig(recompute=rc, **common, **_full(rc)), gpu, "torchtitan"
        )
        for rc in ("none", "selective", "full")
    }  # fmt: skip
    assert peaks["full"].activations < peaks["selective"].activations < peaks["none"].activations
    assert peaks["selective"].reserved / 2**30 == pytest.approx(82.4, rel=0.10)


def _full(rc: str) -> dict[str, Any]:
    return {"recompute_method": "uniform", "recompute_num_layers": 1} if rc == "full" else {}


def test_op_sac_recomputes_every_second_matmul() -> None:
    from tuner.models.time.fsdp2 import op_sac_fraction

    m = titan().model  # h 4096, 8 of 32 KV heads, ffn 14336: wk + wo + w3 of all seven GEMMs
    h, kv, f = 4096, 1024, 14336
    assert op_sac_fraction(m) == pytest.approx(
        (h * kv + h * h + h * f) / (2 * h * h + 2 * h * kv + 3 * h * f)
    )
