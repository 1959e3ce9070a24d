"""The plan of ``tune profile``: GEMM shapes, groups, message sizes and the probe's dtype."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.test_profile import study
from tuner.models.optimizer_layout import DEEPSPEED_ZERO_DEFAULTS
from tuner.models.time.dp import MEGATRON_BUCKET_PARAMS, rank_params
from tuner.profile.job import DTYPES
from tuner.profile.plan import (
    CPU_MAX_MESSAGE,
    CPU_MESSAGES,
    CPU_STREAM_BYTES,
    GPU_MAX_MESSAGE,
    GPU_MESSAGES,
    GPU_STREAM_BYTES,
    GRAD_BYTES,
    MESSAGE_STEP,
    ProbeOptions,
    attention_backend,
    attention_shapes,
    gemm_shapes,
    groups,
    largest_message,
    make_plan,
    message_sizes,
)
from tuner.spec.file import study_from_mapping


def test_gemm_shapes_follow_tp_and_micro_batch() -> None:
    data = study(space={"tp": [1, 2], "micro_batch_size": [1, 4]})
    data["framework"], data["launch"] = "megatron", {"template": "megatron_gpt"}
    spec = study_from_mapping(data)
    shapes = {g["label"]: (g["m"], g["k"], g["n"]) for g in gemm_shapes(spec)}
    # QKV is column-parallel (n = 3h / tp), the MLP's second GEMM row-parallel (k = ffn / tp);
    # tokens per rank are mbs x seq
    assert shapes["qkv mbs=1 tp=1 cp=1"] == (32, 64, 192)
    assert shapes["qkv mbs=4 tp=2 cp=1"] == (128, 64, 96)
    assert shapes["fc2 mbs=1 tp=2 cp=1"] == (32, 128, 64)
    assert shapes["lm_head mbs=4 tp=1 cp=1"] == (128, 64, 128)


def test_an_fp8_study_is_probed_in_bf16() -> None:
    """Megatron's FP8 training runs --bf16 with TE's linear layers in FP8; the probe's
    torch.matmul has no FP8 dtype, so it measures bf16 (the 16-bit GEMMs' rate)."""
    data = study(cluster={"gpu": "h100-sxm-80gb", "gpus_per_node": 8},
                 training={"precision": "fp8"})  # fmt: skip
    data["framework"], data["launch"] = "megatron", {"template": "megatron_gpt"}
    plan = make_plan(study_from_mapping(data), ProbeOptions())
    assert plan["dtype"] == "bf16" and plan["dtype"] in DTYPES
    data["training"]["precision"] = "bf16"
    assert make_plan(study_from_mapping(data), ProbeOptions())["dtype"] == "bf16"


def test_groups_are_placed_within_and_across_nodes() -> None:
    data = study(cluster={"gpus_per_node": 2, "num_nodes": 2},
                 space={"tp": [1, 2], "pp": [1, 2]})  # fmt: skip
    data["framework"], data["launch"] = "megatron", {"template": "megatron_gpt"}
    spec = study_from_mapping(data)
    placed = {(g["link"], tuple(g["ranks"]), g["ops"][0]) for g in groups(spec)}
    assert ("intra", (0, 1), "all_reduce") in placed  # tp=2 (or dp=2) on one node
    assert ("inter", (0, 2), "all_reduce") in placed  # the same size across the two nodes
    assert ("inter", (0, 1, 2, 3), "all_reduce") in placed  # dp=4 spans both nodes
    assert ("inter", (0, 2), "send_recv") in placed  # pipeline neighbours on two nodes
    assert not any(op == "send_recv" and len(r) != 2 for _, r, op in placed)


def megatron(**changes: Any) -> dict[str, Any]:
    data = study(**changes)
    data["framework"], data["launch"] = "megatron", {"template": "megatron_gpt"}
    return data


def test_a_small_model_keeps_the_default_ladder() -> None:
    spec = study_from_mapping(study())  # 2 layers of h 64: ~100k parameters, 0.4 MB of grads
    assert largest_message(spec) < CPU_MESSAGES[-1]
    assert message_sizes(spec) == CPU_MESSAGES
    plan = make_plan(spec, ProbeOptions())
    assert plan["message_bytes"] == list(CPU_MESSAGES)
    assert plan["stream_bytes"] == CPU_STREAM_BYTES
    # sizes given on the command line are measured as given
    assert make_plan(spec, ProbeOptions(message_bytes=(4096,)))["message_bytes"] == [4096]


def test_the_ladder_reaches_the_gradients_of_the_largest_rank() -> None:
    """The demo's model (4 layers of h 256, vocabulary 4096): its ~5M fp32 gradients are one
    DeepSpeed bucket of ~21 MB, which the 4 KiB-1 MiB ladder would only extrapolate to."""
    model = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
             "ffn_hidden_size": 1024, "seq_length": 256, "vocab_size": 4096}  # fmt: skip
    spec = study_from_mapping(study(model=model))
    grads = rank_params(spec.model, 1, 1)[0] * GRAD_BYTES  # pp 1 holds every layer
    assert largest_message(spec) == int(grads) and 16e6 < grads < 32e6
    sizes = message_sizes(spec)
    assert sizes[: len(CPU_MESSAGES)] == CPU_MESSAGES
    assert all(b == a * MESSAGE_STEP for a, b in zip(sizes, sizes[1:], strict=False))
    assert sizes[-2] < grads <= sizes[-1] == 64 << 20


def test_buckets_and_caps_bound_the_ladder() -> None:
    # Megatron reduces a 7B model's fp32 main grads in 40M-parameter buckets: 160 MB, inside the
    # GPU ladder's 256 MiB; a TP all-reduce of 8 x 4096 tokens of h 4096 in bf16 is 256 MiB
    data = megatron(cluster={"gpu": "a100-80gb", "gpus_per_node": 8, "num_nodes": 1},
                    training={"precision": "bf16", "global_batch_size": 64})  # fmt: skip
    data["model"] = {"preset": "llama2-7b"}
    data["space"] = {"tp": [1, 2], "micro_batch_size": [1]}
    spec = study_from_mapping(data)
    assert largest_message(spec) == int(MEGATRON_BUCKET_PARAMS * GRAD_BYTES)
    assert message_sizes(spec) == GPU_MESSAGES
    data["space"] = {"tp": [1, 2], "micro_batch_size": [8]}
    assert largest_message(study_from_mapping(data)) == 8 * 4096 * 4096 * 2
    assert message_sizes(study_from_mapping(data)) == GPU_MESSAGES
    # DeepSpeed's 5e8-element reduce bucket is larger than the GPU cap: the ladder stops at 1 GiB
    ds = copy.deepcopy(data)
    ds["framework"], ds["launch"] = "deepspeed", {"template": "deepspeed_gpt"}
    ds["space"] = {"micro_batch_size": [1]}
    spec = study_from_mapping(ds)
    assert largest_message(spec) == int(DEEPSPEED_ZERO_DEFAULTS["reduce_bucket_size"] * 4)
    assert message_sizes(spec)[-1] == GPU_MAX_MESSAGE
    assert make_plan(spec, ProbeOptions())["stream_bytes"] == GPU_STREAM_BYTES
    # and at 64 MiB on CPUs
    ds["cluster"] = {"gpu": "cpu", "gpus_per_node": 2, "num_nodes": 1, "executor": "local"}
    ds["training"]["precision"] = "fp32"
    assert message_sizes(study_from_mapping(ds))[-1] == CPU_MAX_MESSAGE


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_probe_runs_the_studys_16_bit_dtype(precision: str) -> None:
    data = megatron(cluster={"gpu": "a100-80gb", "gpus_per_node": 8},
                    training={"precision": precision})  # fmt: skip
    assert make_plan(study_from_mapping(data), ProbeOptions())["dtype"] == precision


def test_attention_is_probed_per_call_shape_with_the_frameworks_kernels() -> None:
    data = megatron(space={"tp": [1, 2], "cp": [1, 2], "micro_batch_size": [1, 2]})
    spec = study_from_mapping(data)  # 4 heads of 16 over 32 tokens
    shapes = {(a["batch"], a["heads"], a["seq"], a["head_dim"]) for a in attention_shapes(spec)}
    assert shapes == {(b, 4 // tp, 32 // cp, 16) for b in (1, 2) for tp in (1, 2) for cp in (1, 2)}
    assert make_plan(spec, ProbeOptions())["attention"] == attention_shapes(spec)
    data["model"]["flash_attention"] = False  # unfused scores: GEMMs and streaming kernels
    assert attention_shapes(study_from_mapping(data)) == []
    # Transformer Engine prefers cuDNN's fused attention on Hopper
    # (tuner.models.rates.HOPPER_ATTENTION)
    assert attention_backend(spec) == "default"  # the CPU kernel
    hopper = megatron(cluster={"gpu": "h100-sxm-80gb", "gpus_per_node": 8},
                      training={"precision": "bf16"})  # fmt: skip
    assert attention_backend(study_from_mapping(hopper)) == "cudnn"
    ampere = megatron(cluster={"gpu": "a100-80gb", "gpus_per_node": 8},
                      training={"precision": "bf16"})  # fmt: skip
    assert attention_backend(study_from_mapping(ampere)) == "default"
    workload = study(cluster={"gpu": "h100-sxm-80gb", "gpus_per_node": 8},
                     training={"precision": "bf16"})  # fmt: skip
    assert attention_backend(study_from_mapping(workload)) == "default"  # torch's own SDPA


def test_an_moe_study_measures_the_all_to_all_on_its_ep_groups_only() -> None:
    from tuner.spec.file import load_study

    placed = {(g["link"], tuple(g["ranks"]), g["ops"][0]) for g in groups(load_study("demo-moe"))}
    assert ("intra", (0, 1), "all_to_all") in placed  # ep 2 of its 2 ranks
    dense = {g["ops"][0] for g in groups(load_study("demo"))}
    assert "all_to_all" not in dense and "all_reduce" in dense
