"""Per-stage, per-phase memory: which phase peaks, first vs last stage, the stack overheads
(catalog and a study's cluster.overheads), and DeepSpeed's own estimators as an oracle."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
from typing import Any

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import in_flight, stage_layers
from tuner.errors import ConfigError
from tuner.models.memory.estimate import GIB, MEMORY_UNCERTAINTY, estimate_memory
from tuner.space.enumerate import study_gpu
from tuner.space.probes import MEMORY_SIGMA
from tuner.spec.file import study_from_mapping
from tuner.spec.study import ModelSpec

H100 = get_gpu("h100-sxm-80gb")
GPT = ModelSpec(
    num_layers=24, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
    vocab_size=50257, seq_length=2048,
)  # fmt: skip
LLAMA = ModelSpec(
    num_layers=32, hidden_size=4096, ffn_hidden_size=11008, num_attention_heads=32,
    vocab_size=32000, seq_length=4096, swiglu=True, tied_embeddings=False, dropout=False,
)  # fmt: skip


def test_every_stage_is_reported_with_its_layers_and_in_flight() -> None:
    c = ParallelConfig(tp=2, pp=4, dp=1, micro_batch_size=1, global_batch_size=16)
    m = estimate_memory(LLAMA, c, H100)
    assert [s.stage for s in m.stages] == [0, 1, 2, 3]
    assert tuple(s.layers for s in m.stages) == stage_layers(LLAMA, c, "megatron")
    assert [s.in_flight for s in m.stages] == [in_flight(c, i) for i in range(4)]
    first, middle, last = m.stages[0], m.stages[1], m.stages[3]
    # 1F1B: the first stage holds p micro-batches, the last one; the first holds the embedding,
    # the last the output layer and the logits.
    fwd = [s.phases[0] for s in m.stages]
    assert fwd[0].activations == pytest.approx(4 * fwd[3].activations)
    assert first.params > middle.params and last.params > middle.params
    assert fwd[3].stage_extras > fwd[1].stage_extras == 0
    assert m.peak == max(p.device for s in m.stages for p in s.phases)
    d = m.to_dict()
    assert len(d["stages"]) == 4 and d["stages"][0]["phases"][1]["phase"] == "step"


def test_long_sequence_without_recompute_peaks_in_forward_backward() -> None:
    long = dataclasses.replace(LLAMA, seq_length=16384)
    # the same ZeRO-1 setting whose step peaks on short sequences (test below)
    c = ParallelConfig(tp=8, dp=64, micro_batch_size=1, global_batch_size=64, zero_stage=1)
    m = estimate_memory(long, c, H100, "deepspeed", "bf16")
    fwd, step = m.stages[0].phases
    assert m.phase == "fwd_bwd" and fwd.device > step.device
    assert m.activations > m.weights + m.grads + m.optimizer


def test_fp16_optimizer_copies_make_the_step_peak_with_small_activations() -> None:
    # DeepSpeed fp16 without ZeRO -> FP16_Optimizer: the step flattens the 16-bit grads and makes
    # their fp32 copy (6 B per parameter) after the activations are gone.
    short = dataclasses.replace(GPT, seq_length=256)
    c = ParallelConfig(dp=8, micro_batch_size=1, global_batch_size=8, recompute="full",
                       recompute_method="uniform", recompute_num_layers=1)  # fmt: skip
    m = estimate_memory(short, c, H100, "deepspeed", "fp16")
    assert m.phase == "step" and m.activations == 0
    step = m.worst_stage.phases[1]
    assert step.framework_buffers == pytest.approx(6 * m.params)


def test_zero_step_adds_the_fp32_gradient_partition_and_dp_shrinks_it() -> None:
    def step_buffers(dp: int) -> float:
        c = ParallelConfig(dp=dp, micro_batch_size=1, global_batch_size=dp, zero_stage=2)
        return (
            estimate_memory(GPT, c, H100, "deepspeed", "bf16")
            .stages[0]
            .phases[1]
            .framework_buffers
        )

    assert step_buffers(8) == pytest.approx(2 * step_buffers(16))


def test_megatron_fp16_step_copy_is_sharded_by_the_distributed_optimizer() -> None:
    def step(distopt: bool) -> float:
        c = ParallelConfig(tp=8, dp=8, micro_batch_size=1, global_batch_size=8,
                           distributed_optimizer=distopt)  # fmt: skip
        return (
            estimate_memory(LLAMA, c, H100, "megatron", "fp16")
            .stages[0]
            .phases[1]
            .framework_buffers
        )

    assert step(False) == pytest.approx(8 * step(True))


@pytest.mark.parametrize("gpus", [8, 64])
def test_zero2_step_states_equal_deepspeeds_estimator(gpus: int) -> None:
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    c = ParallelConfig(dp=gpus, micro_batch_size=1, global_batch_size=gpus, zero_stage=2)
    step = estimate_memory(GPT, c, H100, "deepspeed", "fp16").stages[0].phases[1]
    psi = estimate_memory(GPT, c, H100, "deepspeed", "fp16").params
    with contextlib.redirect_stdout(io.StringIO()):
        _, gpu_mem = estimate_zero2_model_states_mem_needs(
            int(psi), num_gpus_per_node=gpus, cpu_offload=False
        )
    ours = step.weights + step.grads + step.optimizer + step.framework_buffers
    assert ours == pytest.approx(gpu_mem, rel=1e-6)


def test_zero3_covers_deepspeeds_estimator_plus_the_16bit_partition() -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    c = ParallelConfig(dp=16, micro_batch_size=1, global_batch_size=16, zero_stage=3)
    m = estimate_memory(GPT, c, H100, "deepspeed", "fp16")
    fwd = m.stages[0].phases[0]
    largest = 12 * GPT.hidden_size**2 + 13 * GPT.hidden_size
    with contextlib.redirect_stdout(io.StringIO()):
        _, gpu_mem, _ = estimate_zero3_model_states_mem_needs(
            int(m.params), largest, num_gpus_per_node=16, cpu_offload=False,
            cpu_offload_params=False,
        )  # fmt: skip
    states = fwd.weights + fwd.grads + fwd.optimizer + fwd.framework_buffers
    # [DS] leaves out the 16-bit parameter shard (2 B / N) that a real run holds; the step's
    # fp32 gradient partition (4 B / N) is in the step phase instead.
    assert gpu_mem - 4 * m.params / 16 <= states <= gpu_mem + 2 * m.params / 16 + 2 * 5e7 + 1e6


def test_cpu_has_no_context_nccl_or_allocator_slack() -> None:
    c = ParallelConfig(pp=2, dp=1, micro_batch_size=1, global_batch_size=8)
    m = estimate_memory(GPT, c, get_gpu("cpu"), "deepspeed", "fp32")
    for s in m.stages:
        for p in s.phases:
            assert p.cuda_context == p.comm_buffers == p.slack == p.workspaces == 0
            assert p.device == p.allocated


def test_nccl_buffers_grow_with_the_communicators_the_config_creates() -> None:
    def comm(**kw: Any) -> float:
        c = ParallelConfig(micro_batch_size=1, global_batch_size=64, **kw)
        return estimate_memory(LLAMA, c, H100).stages[0].phases[0].comm_buffers

    dp_only, tp_dp = comm(dp=8), comm(tp=8, dp=8)
    assert 0 < dp_only < tp_dp < comm(tp=8, pp=4, dp=8)
    per_ring = H100.nccl_channels * H100.nccl_buffer_mib * 2**20
    assert tp_dp - dp_only == pytest.approx(2 * per_ring)  # the TP and model-parallel groups


STUDY: dict[str, Any] = {
    "name": "t", "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64, "precision": "bf16"},
    "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": ["a"]},
    "framework": "megatron", "launch": {"template": "megatron_gpt"},
    "space": {"tp": [1, 2]}, "search": {"n_trials": 5},
}  # fmt: skip


def test_cluster_overheads_replace_the_catalog_figures() -> None:
    data = copy.deepcopy(STUDY)
    data["cluster"]["overheads"] = {"cuda_context_gib": 1.5, "nccl_channels": 8}
    spec = study_from_mapping(data)
    gpu = study_gpu(spec)
    assert gpu.cuda_context_gib == 1.5 and gpu.nccl_channels == 8
    assert gpu.nccl_buffer_mib == H100.nccl_buffer_mib  # not given: the catalog's
    c = ParallelConfig(tp=2, dp=4, micro_batch_size=1, global_batch_size=64)
    ours = estimate_memory(spec.model, c, gpu).stages[0].phases[0]
    catalog = estimate_memory(spec.model, c, H100).stages[0].phases[0]
    assert ours.cuda_context - catalog.cuda_context == pytest.approx((1.5 - 0.75) * GIB)
    assert ours.comm_buffers == pytest.approx(catalog.comm_buffers / 4)


@pytest.mark.parametrize(
    ("overheads", "path"),
    [({"cuda_context_gib": -1}, "cuda_context_gib"), ({"nccl_channels": 99}, "nccl_channels"),
     ({"allocator_fragmentation": 2}, "allocator_fragmentation"), ({"nccl_chanels": 2}, None)],
)  # fmt: skip
def test_bad_cluster_overheads_are_one_line_errors(overheads: dict, path: str | None) -> None:
    data = copy.deepcopy(STUDY)
    data["cluster"]["overheads"] = overheads
    with pytest.raises(ConfigError) as info:
        study_from_mapping(data)
    assert "\n" not in str(info.value)
    if path:
        assert path in str(info.value)


def test_the_stated_uncertainty_is_in_the_estimate() -> None:
    """The estimate states the sd its own terms give (every one from the catalog here), its 90%
    band and each term's source; not the former fixed 8%."""
    m = estimate_memory(LLAMA, ParallelConfig(tp=8, dp=1, micro_batch_size=1, global_batch_size=1),
                        H100)  # fmt: skip
    out = m.to_dict()
    assert out["uncertainty"] == round(m.sigma, 4) and m.sigma > MEMORY_UNCERTAINTY
    low, high = out["band_gib"]
    assert low < out["peak_gib"] < high
    assert {s["source"] for s in out["sources"].values()} == {"catalog"}
    assert MEMORY_SIGMA == MEMORY_UNCERTAINTY  # the probes' default for callers with no breakdown


def test_zero1_reduce_bucket_makes_the_step_peak_at_large_dp() -> None:
    # ZeRO-1 all-reduces the full 16-bit gradients after backward, each reduce_bucket_size piece
    # flattened into a new tensor; with full recompute on short sequences the activations are
    # smaller than that bucket. The later update moment (non-owned gradients freed, owned ones
    # flattened and made fp32) is smaller at large DP.
    short = dataclasses.replace(GPT, seq_length=512)
    c = ParallelConfig(
        dp=64, micro_batch_size=1, global_batch_size=64, zero_stage=1, recompute="full",
        recompute_method="uniform", recompute_num_layers=1,
    )  # fmt: skip
    m = estimate_memory(short, c, H100, "deepspeed", "bf16")
    assert m.phase == "step" and m.activations == 0
    assert m.grads == pytest.approx(2 * m.params)
    assert m.framework_buffers == pytest.approx(2 * min(5e8, m.params))
    # a smaller bucket in the study's ds_config shrinks it (the one definition is overridable)
    small = estimate_memory(short, c, H100, "deepspeed", "bf16", {"reduce_bucket_size": 5e7})
    assert small.stages[0].phases[1].framework_buffers == pytest.approx(2 * 5e7)


def test_zero1_update_moment_wins_at_small_dp() -> None:
    c = ParallelConfig(dp=2, micro_batch_size=1, global_batch_size=2, zero_stage=1)
    step = estimate_memory(GPT, c, H100, "deepspeed", "bf16").stages[0].phases[1]
    psi = estimate_memory(GPT, c, H100, "deepspeed", "bf16").params
    # owned 16-bit grads, their flat copy and its fp32 conversion beat the 5e8-element bucket
    assert step.grads == pytest.approx(2 * psi / 2)
    assert step.framework_buffers == pytest.approx((2 + 4) * psi / 2)


def test_only_first_and_last_stage_join_the_tied_embedding_group() -> None:
    tied = GPT
    c = ParallelConfig(tp=2, pp=4, dp=2, micro_batch_size=1, global_batch_size=16)
    comm = [s.phases[0].comm_buffers for s in estimate_memory(tied, c, H100).stages]
    ring = H100.nccl_channels * H100.nccl_buffer_mib * 2**20
    p2p_peer = H100.nccl_p2p_channels * H100.nccl_p2p_buffer_mib * 2**20
    # first and last: one pipeline neighbour fewer, the embedding group more
    assert comm[0] == comm[3] == pytest.approx(comm[1] + ring - p2p_peer)
    assert comm[1] == comm[2]


def test_zero3_keeps_norms_under_the_persistence_threshold_whole() -> None:
    c = ParallelConfig(dp=16, micro_batch_size=1, global_batch_size=16, zero_stage=3)
    keep = estimate_memory(GPT, c, H100, "deepspeed", "bf16").stages[0].phases[0]
    # a threshold below the hidden size partitions the norms too
    part = (
        estimate_memory(
            GPT, c, H100, "deepspeed", "bf16", {"stage3_param_persistence_threshold": 1000}
        )
        .stages[0]
        .phases[0]
    )
    # per layer: two LayerNorms (weight + bias) and the two row-parallel output biases; the final
    # LayerNorm: 6h per layer + 2h, each tensor h elements
    small = GPT.num_layers * 6 * GPT.hidden_size + 2 * GPT.hidden_size
    assert keep.weights - part.weights == pytest.approx(2 * small)


def test_zero2_with_one_micro_batch_holds_no_partition_beside_the_bucket_on_cpu_ranks() -> None:
    """DeepSpeed ZeRO-2 makes its contiguous gradient partition after a micro-batch's reduction:
    with one micro-batch per step a tensor accounting by views (CPU ranks) never sees it beside
    the reduce bucket in the forward and backward phase, with two it does (the first's
    partition lives through the second's backward); GPUs (an allocator, whose bucket is one
    allocation) keep the sum either way."""
    cpu = get_gpu("cpu")

    def fwd_grads(gpu: Any, gbs: int) -> float:
        c = ParallelConfig(dp=8, micro_batch_size=1, global_batch_size=gbs, zero_stage=2)
        return estimate_memory(GPT, c, gpu, "deepspeed", "fp32").stages[0].phases[0].grads

    assert fwd_grads(cpu, 8) == 0.0
    assert fwd_grads(cpu, 16) == fwd_grads(H100, 8) == fwd_grads(H100, 16) > 0
