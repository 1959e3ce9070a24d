"""Mixture of experts and FP8: presets, Megatron's expert-parallel rules, memory and time terms."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tuner._loader import load_dataclass
from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.config.rules import validate
from tuner.errors import ConfigError
from tuner.launch.megatron_flags import megatron_moe_flags, megatron_precision_flags
from tuner.models.memory.estimate import estimate_memory
from tuner.models.memory.overheads import communicators
from tuner.models.memory.terms import layer_activations, param_counts
from tuner.models.moe import (
    allgather_gathered_bytes,
    dispatch_buffer_bytes,
    expert_params_per_layer,
    expert_tokens,
    moe_layer_activations,
    moe_layer_flags,
    moe_layers_per_stage,
    nonexpert_delta_per_layer,
)
from tuner.models.rates import catalog_rates
from tuner.models.time.estimate import estimate_time, model_flops_per_step
from tuner.spec.file import _expand_model, study_from_mapping
from tuner.spec.moe import MoESpec, parse_pattern
from tuner.spec.study import ModelSpec, TrainingSpec

H100 = get_gpu("h100-sxm-80gb")

# A small MoE worked by hand below: h 64, MHA 4 heads, SwiGLU experts of width 128, 4 experts,
# top-2, RMSNorm, no biases, 2 layers, both MoE.
SMALL = ModelSpec(
    num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, vocab_size=1000,
    seq_length=128, swiglu=True, tied_embeddings=False, normalization="rmsnorm",
    position_embedding="rope", dropout=False, add_bias_linear=False,
    moe=MoESpec(num_experts=4, router_topk=2, ffn_hidden_size=128),
)  # fmt: skip


def preset(name: str, **changes: Any) -> ModelSpec:
    data: Any = _expand_model({"preset": name})
    return dataclasses.replace(load_dataclass(ModelSpec, data, "model"), **changes)


def total_and_active(m: ModelSpec) -> tuple[float, float]:
    c = ParallelConfig()
    assert m.moe is not None
    n = sum(moe_layer_flags(m))
    experts = n * expert_params_per_layer(m, c)
    total = (
        param_counts(m).total(m.num_layers, m.vocab_size, m.tied_embeddings)
        + n * nonexpert_delta_per_layer(m, c)
        + experts
    )
    return total, total - experts * (1 - m.moe.router_topk / m.moe.num_experts)


@pytest.mark.parametrize(
    ("name", "total_b", "active_b"),
    [
        ("mixtral-8x7b", 46.7, 12.9),  # Mistral AI model card: 46.7B total, 12.9B active
        ("deepseek-moe-16b", 16.4, 2.8),  # Dai et al. 2024: 16.4B total, 2.8B activated
        ("qwen1.5-moe-a2.7b", 14.3, 2.7),  # Qwen blog "Qwen1.5-MoE": 14.3B total, 2.7B active
    ],
)
def test_presets_have_the_published_parameter_counts(
    name: str, total_b: float, active_b: float
) -> None:
    total, active = total_and_active(preset(name))
    assert total / 1e9 == pytest.approx(total_b, abs=0.06)
    assert active / 1e9 == pytest.approx(active_b, abs=0.06)


def test_layer_patterns_follow_megatron() -> None:
    assert parse_pattern("([0]*1+[1]*3)") == (False, True, True, True)
    assert parse_pattern("([1]*1+[0]*1)*2") == (True, False, True, False)
    assert parse_pattern("[0,1]") == (False, True)
    assert MoESpec(num_experts=4, layer_freq=2).moe_layers(4) == (True, False, True, False)
    deepseek = preset("deepseek-moe-16b")
    assert sum(moe_layer_flags(deepseek)) == 27 and not moe_layer_flags(deepseek)[0]
    # pp 4 of 28 layers: the dense first layer sits on stage 0
    c = ParallelConfig(pp=4, dp=2, global_batch_size=8)
    assert moe_layers_per_stage(deepseek, c, "megatron") == (6, 7, 7, 7)
    with pytest.raises(ConfigError, match="Invalid length of moe_layer_pattern: 3"):
        dataclasses.replace(SMALL, moe=MoESpec(num_experts=4, layer_freq="[0,1,1]"))
    with pytest.raises(ConfigError, match="not a layer pattern"):
        parse_pattern("__import__('os')")


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"num_experts": 0}, "num_experts", "must be in 1.."),
        ({"router_topk": 9}, "router_topk", "must be in 1..num_experts (8)"),
        ({"router_topk": 1}, "router_topk", "Please use --moe-router-pre-softmax when topk is 1"),
        ({"pad_to_capacity": True}, "pad_to_capacity", "moe_expert_capacity_factor must be set"),
        ({"capacity_factor": -1.0}, "capacity_factor", "must be > 0"),
        ({"imbalance": 0.5}, "imbalance", "must be in 1..num_experts"),
    ],
)
def test_bad_moe_settings_name_the_field(changes: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        MoESpec(**{"num_experts": 8, **changes})
    assert info.value.path == path and words in str(info.value)


def test_sinkhorn_top1_needs_no_pre_softmax_and_is_passed_on() -> None:
    """Megatron exempts sinkhorn routing from its top-1 pre-softmax rule (transformer_config.py)
    and the launch passes the load-balancing type when it is not Megatron's default."""
    m = dataclasses.replace(SMALL, moe=MoESpec(num_experts=4, router_topk=1,
                                               load_balancing="sinkhorn"))  # fmt: skip
    flags = megatron_moe_flags(m, ParallelConfig(dp=4, ep=2, global_batch_size=8))
    assert ("--moe-router-load-balancing-type", "sinkhorn") in flags
    assert not any(f[0] == "--moe-router-load-balancing-type" for f in megatron_moe_flags(
        SMALL, ParallelConfig(dp=4, ep=2, global_batch_size=8)))  # fmt: skip


# ----------------------------------------------------------------------------- rules


@pytest.mark.parametrize(
    ("config", "model", "world", "rule", "message"),
    [
        (ParallelConfig(dp=4, ep=2, global_batch_size=8), dataclasses.replace(SMALL, moe=None),
         4, "ep_needs_moe", "num_experts must be non None to use expert model parallelism"),
        (ParallelConfig(dp=3, ep=3, global_batch_size=6), SMALL, 3, "experts_ep",
         "Number of experts should be a multiple of expert model parallel_size."),
        (ParallelConfig(tp=2, dp=2, global_batch_size=8), SMALL, 4, "moe_tp_needs_sp",
         "During training, performance may degrade if MoE and tensor parallelismare enabled "
         "without also enabling sequence parallelism."),
        (ParallelConfig(tp=2, dp=1, ep=4, sequence_parallel=True, global_batch_size=8,
                        etp=1, pp=1), SMALL, 2, "expert_grid",
         "world_size (2) is not divisible by expert_tensor_model_pipeline_parallel size (4)"),
        (ParallelConfig(dp=4, etp=3, global_batch_size=8), SMALL, 4, "moe_ffn_etp",
         "128 is not divisible by 3"),
        (ParallelConfig(dp=4, moe_token_dispatcher="flex", global_batch_size=8), SMALL, 4,
         "flex_needs_ep", "Flex token dispatcher requires TPxEP > 1"),
    ],
)  # fmt: skip
def test_each_expert_parallel_rule_has_megatrons_message(
    config: ParallelConfig, model: ModelSpec, world: int, rule: str, message: str
) -> None:
    errors = validate(config, model, world, "megatron")
    assert rule in [e.rule for e in errors], errors
    assert any(message in e.message for e in errors), errors


def test_valid_expert_parallel_configs_pass() -> None:
    for c in (
        ParallelConfig(dp=4, ep=4, global_batch_size=8),
        ParallelConfig(tp=2, dp=2, ep=2, etp=1, sequence_parallel=True, global_batch_size=8),
        ParallelConfig(pp=2, dp=2, ep=2, global_batch_size=8),
    ):
        assert validate(c, SMALL, 4, "megatron") == [], c


def study(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "moe", "model": {"preset": "mixtral-8x7b"},
        "training": {"global_batch_size": 64},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 1,
                    "executor": "local"},
        "framework": "megatron",
        "launch": {"template": "megatron_gpt", "megatron_path": "/m"},
        "space": {"tp": [1], "pp": [1, 2], "ep": "auto"},
    }  # fmt: skip
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    return data


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"training": {"global_batch_size": 64, "precision": "fp16"}}, "space.ep",
         "Expert parallelism is not supported with fp16 training."),
        ({"training": {"global_batch_size": 64, "precision": "fp8"},
          "cluster": {"gpu": "a100-80gb"}}, "training.precision",
         "Device compute capability 8.9 or higher required for FP8 execution."),
        ({"training": {"global_batch_size": 64, "precision": "fp8", "fp8_recipe": "mxfp8"}},
         "training.precision", "Device compute capability 10.0 or higher required for MXFP8"),
        ({"training": {"global_batch_size": 64, "precision": "fp8", "fp8_recipe": "blockwise"},
          "cluster": {"gpu": "b200-180gb"}}, "training.precision",
         "FP8 block scaled GEMM requires Hopper"),
        ({"framework": "megatron-deepspeed",
          "launch": {"template": "megatron_deepspeed_gpt", "megatron_path": "/m"}},
         "model.moe", "the megatron-deepspeed template passes no expert flags"),
        ({"framework": "deepspeed", "launch": {"template": "deepspeed_gpt", "script": "t.py"}},
         "model.moe.grouped_gemm", "DeepSpeed-MoE's Experts runs its local experts one after"),
    ],
)  # fmt: skip
def test_study_wide_rules_are_one_line_errors(
    changes: dict[str, Any], path: str, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        study_from_mapping(study(**changes))
    assert info.value.path == path and words in str(info.value)
    assert "\n" not in str(info.value)


def test_ep_auto_takes_the_divisors_of_the_experts() -> None:
    from tuner.space.enumerate import expand_axes

    spec = study_from_mapping(study())
    assert expand_axes(spec).ep == (1, 2, 4, 8)


def test_the_study_reads_ep_auto_as_the_space_does() -> None:
    """One rule for ``ep: auto`` (tuner.spec.moe.ep_auto): on one GPU the axis is ep 1 alone,
    so fp16 (refused with expert parallelism only) is not refused; the study check read auto
    as ep 2 on any MoE model and refused it. Where auto holds ep 2 it still is."""
    from tuner.space.enumerate import expand_axes

    one_gpu = {"gpu": "h100-sxm-80gb", "gpus_per_node": 1, "num_nodes": 1, "executor": "local"}
    fp16 = {"global_batch_size": 64, "precision": "fp16"}
    spec = study_from_mapping(study(cluster=one_gpu, training=fp16))
    assert expand_axes(spec).ep == (1,)
    with pytest.raises(ConfigError, match="Expert parallelism is not supported with fp16"):
        study_from_mapping(study(cluster={**one_gpu, "gpus_per_node": 2}, training=fp16))


# ----------------------------------------------------------------------------- flags


def test_moe_and_fp8_flags_in_megatrons_spelling() -> None:
    m = preset("deepseek-moe-16b")
    c = ParallelConfig(dp=8, ep=8, etp=1, global_batch_size=64)
    words = [w for flag in megatron_moe_flags(m, c) for w in flag]
    assert words == [
        "--num-experts", "64", "--moe-router-topk", "6", "--moe-ffn-hidden-size", "1408",
        "--moe-layer-freq", "([0]*1+[1]*27)", "--moe-shared-expert-intermediate-size", "2816",
        "--moe-aux-loss-coeff", "0.001", "--moe-grouped-gemm",
        "--expert-model-parallel-size", "8", "--expert-tensor-parallel-size", "1",
        "--moe-token-dispatcher-type", "alltoall",
    ]  # fmt: skip
    assert megatron_moe_flags(dataclasses.replace(m, moe=None), c) == []
    fp8 = TrainingSpec(global_batch_size=8, precision="fp8", fp8_recipe="tensorwise")
    assert megatron_precision_flags(fp8) == [
        ("--bf16",), ("--fp8-format", "hybrid"), ("--fp8-recipe", "tensorwise")
    ]  # fmt: skip


# ----------------------------------------------------------------------------- memory


def test_expert_states_shard_over_the_expert_data_parallel_group_by_hand() -> None:
    """SMALL on 4 ranks, ep 2, distributed optimizer, bf16.

    Per layer: attention 4 h^2 = 16384, two RMSNorms 2h = 128, router E h = 256 (dense part);
    experts E/ep x 3 h F_e = 2 x 3 x 64 x 128 = 49152. Embedding and output layer V h each
    (1024 padded rows: 1000 -> multiple of 128) and the final norm h.
    Dense params: 2 x (16384 + 128 + 256) + 2 x 1024 x 64 + 64 = 164672, sharded over dp 4.
    Expert params: 2 x 49152 = 98304, sharded over expert-dp = 4 / (etp 1 x ep 2) = 2.
    """
    c = ParallelConfig(dp=4, ep=2, global_batch_size=8, distributed_optimizer=True)
    assert c.expert_dp == 2
    mem = estimate_memory(SMALL, c, H100, "megatron", "bf16")
    dense, experts = 164672, 98304
    assert mem.weights == pytest.approx(2 * (dense + experts))
    assert mem.grads == pytest.approx(4 * (dense + experts))
    assert mem.optimizer == pytest.approx(12 * dense / 4 + 12 * experts / 2)
    # without EP every rank holds all 4 experts and shards their states over all 4 ranks
    c1 = dataclasses.replace(c, ep=1)
    mem1 = estimate_memory(SMALL, c1, H100, "megatron", "bf16")
    assert mem1.optimizer == pytest.approx(12 * (dense + 2 * experts) / 4)
    # the EP and expert-DP communicators hold NCCL buffers (32 channels x 10 MiB each on H100)
    groups = communicators(c, 0, "megatron", False, moe=True).collective
    assert "ep" in groups and "expert-dp" in groups
    assert mem.comm_buffers - mem1.comm_buffers == pytest.approx(320 * 2**20)


def test_grouped_gemm_holds_transformer_engines_multi_stream_workspaces() -> None:
    """TE's grouped GEMM allocates one cuBLAS workspace per compute stream (4): 32 MiB + 1 KiB
    each on Hopper and newer, 4 MiB on Ampere; SequentialMLP (no grouped GEMM) and a stage
    without MoE layers hold none."""
    c = ParallelConfig(dp=4, ep=2, global_batch_size=8)
    a100 = get_gpu("a100-80gb")
    loop = dataclasses.replace(SMALL, moe=dataclasses.replace(SMALL.moe, grouped_gemm=False))  # type: ignore[type-var]
    for gpu, each in ((H100, 32 * 2**20 + 1024), (a100, 4 * 2**20)):
        grouped = estimate_memory(SMALL, c, gpu, "megatron", "bf16").workspaces
        assert grouped - estimate_memory(loop, c, gpu, "megatron", "bf16").workspaces == (
            pytest.approx(4 * each)
        )
    # layers 0-1 dense, 2-3 MoE: only the second pipeline stage runs grouped GEMMs
    mixed = dataclasses.replace(SMALL, num_layers=4, moe=dataclasses.replace(
        SMALL.moe, layer_freq="([0]*2+[1]*2)"))  # type: ignore[type-var]  # fmt: skip
    stages = estimate_memory(mixed, ParallelConfig(pp=2, dp=2, global_batch_size=8), H100).stages
    first, last = (s.phases[0].workspaces for s in stages)
    assert last - first == pytest.approx(4 * (32 * 2**20 + 1024))


def test_moe_activations_worked_by_hand() -> None:
    """SMALL, one micro-batch of 1 x 128 tokens, tp 1, ep 2, bf16 (e = 2), dropless.

    Dense [K] MLP terms (removed): s b F x 3e = 128 x 256 x 6 = 196608.
    Router: T x E x (e + 1 B map) = 128 x 4 x 3 = 1536.
    Routed tokens per rank: T x topk x etp = 256: each keeps the dispatched input (h e = 128 B),
    three F_e-wide tensors (SwiGLU's fused weighted kernel: fc1 out 2F_e, fc2 in F_e: 3 x 128 x
    e = 768 B), its routing prob (e = 2 B) and the permute index (4 B): 256 x 902 = 230912; the
    probs weigh the activation inside the experts, so unpermute keeps no output (Megatron
    experts.py activation_func_with_probs). Dispatch buffers: 2 x T x topk x h x e = 65536.
    """
    c = ParallelConfig(dp=4, ep=2, global_batch_size=8)
    dense = layer_activations(SMALL, 1, 1, "bf16")
    moe = moe_layer_activations(SMALL, c, "bf16", dense)
    assert moe.sharded - dense.sharded == pytest.approx(-196608 + 1536 + 230912)
    assert moe.replicated == dense.replicated
    assert dispatch_buffer_bytes(SMALL, c, "bf16") == pytest.approx(65536)
    # allgather: the 2 EP ranks' 128 tokens gathered (h e = 128 B each) and the reduce-scatter
    gather = dataclasses.replace(c, moe_token_dispatcher="allgather")
    assert dispatch_buffer_bytes(SMALL, gather, "bf16") == pytest.approx(2 * 256 * 128)
    # the gather spans ETP x EP, not TP x EP (token_dispatcher.py tp_ep_group = the expert grid's
    # tp-ep group): tp 2 (SP shards of 64 tokens) with etp 1, ep 2 gathers 2 x 64 tokens
    split = ParallelConfig(tp=2, dp=2, ep=2, etp=1, sequence_parallel=True, global_batch_size=8,
                           moe_token_dispatcher="allgather")  # fmt: skip
    assert dispatch_buffer_bytes(SMALL, split, "bf16") == pytest.approx(2 * 128 * 128)
    assert expert_tokens(SMALL, split) == pytest.approx(128 * 2 / 2)
    # a stated imbalance of 1.5 scales the routed-token terms; a capacity factor caps it
    skewed = dataclasses.replace(SMALL, moe=dataclasses.replace(SMALL.moe, imbalance=1.5))  # type: ignore[type-var]
    assert moe_layer_activations(skewed, c, "bf16", dense).sharded - moe.sharded == (
        pytest.approx(0.5 * 230912)
    )
    capped = dataclasses.replace(
        SMALL, moe=MoESpec(num_experts=4, ffn_hidden_size=128, imbalance=1.5, capacity_factor=1.2)
    )
    assert moe_layer_activations(capped, c, "bf16", dense).sharded - moe.sharded == (
        pytest.approx(0.2 * 230912)
    )
    # GeLU experts keep three F_e-wide tensors too: fc1 out, GeLU out (kept by the multiply
    # with the probs) and the product; the dense GeLU MLP [K] kept two (s b F x 2e removed)
    gelu = dataclasses.replace(SMALL, swiglu=False)
    dense_gelu = layer_activations(gelu, 1, 1, "bf16")
    assert moe_layer_activations(gelu, c, "bf16", dense_gelu).sharded - dense_gelu.sharded == (
        pytest.approx(-128 * 256 * 4 + 1536 + 230912)
    )


def test_fp8_keeps_16_bit_states_and_adds_the_fp8_weight_copies() -> None:
    m = preset("mixtral-8x7b")
    c = ParallelConfig(pp=4, dp=16, ep=8, global_batch_size=256, distributed_optimizer=True)
    bf16 = estimate_memory(m, c, H100, "megatron", "bf16")
    fp8 = estimate_memory(m, c, H100, "megatron", "fp8")
    assert fp8.optimizer == bf16.optimizer and fp8.grads == bf16.grads
    # a middle stage holds layers only: every parameter but the norms is a GEMM weight
    middle_bf16, middle_fp8 = bf16.stages[1], fp8.stages[1]
    norms = middle_bf16.layers * 2 * m.hidden_size
    extra = middle_fp8.phases[0].weights - middle_bf16.phases[0].weights
    assert extra == pytest.approx(2 * (middle_bf16.params - norms))  # FP8 copy + transpose


def test_fp8_saves_the_gemm_inputs_in_one_byte_by_hand() -> None:
    """Llama 3 8B, tp 1, one micro-batch of 8192 tokens (TE docs, "Memory usage"): per layer the
    QKV and fc1 inputs drop to 1 B (-2 s h), the attention output gains an FP8 copy (+s h), the
    fc2 input drops to 1 B (-s F): -(s h + s F) bytes per layer."""
    m = preset("llama3-8b")
    c = ParallelConfig(dp=8, global_batch_size=64, distributed_optimizer=True)
    bf16 = estimate_memory(m, c, H100, "megatron", "bf16")
    fp8 = estimate_memory(m, c, H100, "megatron", "fp8")
    s, h, f = m.seq_length, m.hidden_size, m.ffn_hidden_size
    assert fp8.activations - bf16.activations == pytest.approx(-m.num_layers * (s * h + s * f))


# ----------------------------------------------------------------------------- time


def test_expert_parallel_all_to_all_costs_more_across_nodes() -> None:
    m = preset("mixtral-8x7b")
    t = TrainingSpec(global_batch_size=256)
    base = ParallelConfig(pp=4, dp=16, global_batch_size=256, distributed_optimizer=True)
    ep1 = estimate_time(m, t, base, H100, 8)
    ep8 = estimate_time(m, t, dataclasses.replace(base, ep=8), H100, 8)
    ep8_across = estimate_time(m, t, dataclasses.replace(base, ep=8), H100, 4)  # 4 GPUs a node
    assert ep1.ep_comm == 0.0 < ep8.ep_comm < ep8_across.ep_comm
    assert ep8.step == pytest.approx(sum(
        getattr(ep8, f) for f in ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm",
                                  "pp_p2p", "pp_bubble", "dp_comm", "optimizer",
                                  "stage_imbalance", "overhead", "fp8_cast", "moe_routing")
    ))  # fmt: skip
    # EP shards the experts' optimizer states: the step streams fewer of them
    assert ep8.optimizer < ep1.optimizer
    # full recompute reruns each layer's forward, its dispatch and combine included: 2 of 4
    full = dataclasses.replace(base, ep=8, recompute="full", recompute_method="uniform",
                               recompute_num_layers=1)  # fmt: skip
    assert estimate_time(m, t, full, H100, 8).ep_comm == pytest.approx(1.5 * ep8.ep_comm)


def test_top_k_routing_sets_the_model_flops() -> None:
    """Model FLOPs count the k routed experts (6 x active params per token, plus attention)."""
    m = preset("mixtral-8x7b")
    _, active = total_and_active(m)
    s, layers, h = m.seq_length, m.num_layers, m.hidden_size
    embedding = m.vocab_size * h  # the input embedding is a look-up: no FLOPs
    attention_core = 3 * layers * 4 * s * s * h  # scores and scores x V, fwd + bwd
    expected = 6 * s * (active - embedding) + attention_core
    # norms and the router's E x h are counted by params but are no GEMM of the convention
    assert model_flops_per_step(m, 1) == pytest.approx(expected, rel=0.01)


def test_load_imbalance_and_fp8_change_the_step() -> None:
    m = preset("mixtral-8x7b")
    c = ParallelConfig(pp=4, dp=16, ep=8, global_batch_size=256, distributed_optimizer=True)
    t = TrainingSpec(global_batch_size=256)
    even = estimate_time(m, t, c, H100, 8)
    assert m.moe is not None
    skew = dataclasses.replace(m, moe=dataclasses.replace(m.moe, imbalance=1.3))
    assert estimate_time(skew, t, c, H100, 8).compute > even.compute
    fp8 = TrainingSpec(global_batch_size=256, precision="fp8")
    faster = estimate_time(m, fp8, c, H100, 8, rates=catalog_rates(H100, "fp8"))
    assert faster.compute < even.compute and faster.mfu > even.mfu
    assert catalog_rates(H100, "fp8").peak == catalog_rates(H100, "bf16").peak


def test_a_nan_load_balancing_loss_is_divergence() -> None:
    """Megatron prints MoE aux losses as ``| load_balancing_loss: X |`` beside ``lm loss``
    (training.py track_moe_metrics); a NaN there is a diverged run like a NaN lm loss."""
    from tuner.logs import parse_log
    from tuner.outcome import Outcome

    line = (
        " [2026-01-01 00:00:00] iteration {i:8d}/      10 | consumed samples: {s:12d} | "
        "elapsed time per iteration (ms): 1000.0 | learning rate: 3.0E-04 | "
        "global batch size:    16 | lm loss: 2.5E+00 | load_balancing_loss: {aux} | "
        "loss scale: 1.0 | grad norm: 1.0 | number of skipped iterations:   0 | "
        "number of nan iterations:   0 |"
    )
    ok = "\n".join(line.format(i=i, s=16 * i, aux="1.01E+00") for i in range(1, 6))
    assert parse_log(ok, "megatron", exit_codes=[0]).outcome is Outcome.OK
    bad = ok + "\n" + line.format(i=6, s=96, aux="nan")
    metrics = parse_log(bad, "megatron", exit_codes=[1])
    assert metrics.outcome is Outcome.DIVERGED
    assert "load_balancing_loss" in str(metrics.reason)


def test_the_mixtral_study_ranks_megatrons_published_mapping_first() -> None:
    """studies/mixtral-8x7b.yaml: Megatron's MoE README gives TP1 EP8 PP4 as the best mapping
    for Mixtral 8x7B on 64 H100 ("EP8TP1 is better than EP4TP2 for 8x7B"); the model agrees."""
    from tuner.space.enumerate import enumerate_space
    from tuner.spec.file import load_study

    report = enumerate_space(load_study("mixtral-8x7b"))
    assert report.invalid_by_rule["expert_grid"] > 0
    best = report.ranked()[0].config
    assert (best.tp, best.ep, best.pp) == (1, 8, 4)
    by_key = {c.config.key(): c for c in report.viable}
    ep4tp2 = dataclasses.replace(best, tp=2, ep=4, sequence_parallel=True, dp=8)
    slower, fastest = by_key[ep4tp2.key()].time, report.ranked()[0].time
    assert slower is not None and fastest is not None and slower.step > fastest.step


def test_allgather_dispatch_gathers_into_megatrons_global_buffer() -> None:
    """token_dispatch gathers the hidden states with use_global_buffer=True: SMALL, dp 4, ep 2,
    allgather, 1 x 128 tokens per rank -> 2 x 128 tokens x h 64 x 2 B = 32768 B, held from the
    first forward on (the step phase keeps it), no longer inside the dispatch transient."""
    alltoall = ParallelConfig(dp=4, ep=2, global_batch_size=8)
    c = dataclasses.replace(alltoall, moe_token_dispatcher="allgather")
    assert allgather_gathered_bytes(SMALL, c, "bf16") == pytest.approx(2 * 128 * 64 * 2)
    assert allgather_gathered_bytes(SMALL, alltoall, "bf16") == 0.0
    one_rank = ParallelConfig(dp=8, global_batch_size=8, moe_token_dispatcher="allgather")
    assert allgather_gathered_bytes(SMALL, one_rank, "bf16") == 0.0  # ETP x EP of 1: no gather
    stage = estimate_memory(SMALL, c, H100).stages[0]
    fwd, step = stage.phases
    base = estimate_memory(SMALL, alltoall, H100).stages[0].phases[1]
    assert step.workspaces - base.workspaces == pytest.approx(32768)
    assert fwd.workspaces == step.workspaces
    # the transient keeps the reduce-scatter's input only: 2 x 256 x 128 B - the gathered copy
    assert dispatch_buffer_bytes(SMALL, c, "bf16") - 32768 == pytest.approx(32768)
