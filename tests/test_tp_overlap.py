"""Megatron's --tp-comm-overlap (Transformer Engine userbuffers): its rules, the search axis, the
flag the launch passes, its buffers in the memory model and its time in the time model."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.config.rules import validate
from tuner.models.memory.estimate import estimate_memory
from tuner.models.rates import Link, catalog_rates, gemm_seconds
from tuner.models.time.estimate import estimate_time
from tuner.models.time.tp_overlap import (
    UB_COMM_SMS,
    UB_PIPELINE_SPLITS,
    Block,
    margin_rates,
    pipelined_reduce_scatter,
    ring_exchange,
    ub_buffer_bytes,
)
from tuner.space.enumerate import config_from_settings, enumerate_space, expand_axes, iter_configs
from tuner.space.trials import config_from_params, config_params, distributions
from tuner.spec.file import study_from_mapping
from tuner.spec.study import ModelSpec, TrainingSpec

H100 = get_gpu("h100-sxm-80gb")
MODEL = ModelSpec(num_layers=32, hidden_size=8192, ffn_hidden_size=28672,
                  num_attention_heads=64, num_query_groups=8, vocab_size=128256,
                  seq_length=8192, swiglu=True, add_bias_linear=False)  # fmt: skip
BF16 = TrainingSpec(global_batch_size=64, precision="bf16")
TP8 = ParallelConfig(tp=8, pp=2, dp=4, sequence_parallel=True, micro_batch_size=1,
                     global_batch_size=64, distributed_optimizer=True)  # fmt: skip
MEGATRON_SP_MESSAGE = (
    "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is "
    "enabled"
)


def rules(config: ParallelConfig, framework: str = "megatron", **kw: Any) -> set[str]:
    return {v.rule for v in validate(config, MODEL, config.world_size, framework, **kw)}  # type: ignore[arg-type]


def test_rules_follow_megatron_and_userbuffers() -> None:
    on = dataclasses.replace(TP8, tp_comm_overlap=True)
    assert rules(on) == set()
    # Megatron's validate_args assertion, word for word
    no_sp = dataclasses.replace(on, sequence_parallel=False)
    messages = [v.message for v in validate(no_sp, MODEL, 64, "megatron")]
    assert messages == [MEGATRON_SP_MESSAGE]
    # userbuffers map the peers over NVLink: the TP group must sit in one node
    assert rules(on, gpus_per_node=4) == {"tp_overlap_node"}
    assert rules(on, gpus_per_node=8) == set()
    # the flag is Megatron-LM core's, not DeepSpeed's pipeline engine's
    assert "tp_overlap_framework" in rules(on, "megatron-deepspeed")
    moe = dataclasses.replace(MODEL, moe=study_from_mapping(_moe_study()).model.moe)
    assert "tp_overlap_moe" in {v.rule for v in validate(on, moe, 64, "megatron")}


def _moe_study() -> dict[str, Any]:
    return {
        "name": "m", "model": {"preset": "mixtral-8x7b"}, "training": {"global_batch_size": 64},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": ["a", "b"]},
        "framework": "megatron", "launch": {"template": "megatron_gpt"},
    }  # fmt: skip


SPACE: dict[str, Any] = {
    "name": "tpo",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": ["n1", "n2"]},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt"},
    "space": {"tp": [1, 2, 4, 8], "pp": [1, 2], "micro_batch_size": [1, 2],
              "sequence_parallel": [True, False], "tp_comm_overlap": [False, True],
              "distributed_optimizer": [True]},
}  # fmt: skip


def test_the_axis_puts_userbuffers_only_on_sequence_parallel_configs() -> None:
    spec = study_from_mapping(copy.deepcopy(SPACE))
    axes = expand_axes(spec)
    configs = list(iter_configs(spec, axes))
    assert len(configs) == axes.size == len({c.key() for c in configs})
    on = [c for c in configs if c.tp_comm_overlap]
    assert on and all(c.sequence_parallel and c.tp > 1 for c in on)
    # per (tp > 1, pp, mbs): sp off, sp on, sp on + userbuffers
    assert len(on) == 3 * 2 * 2
    report = enumerate_space(spec)
    assert any(c.config.tp_comm_overlap for c in report.viable)
    # the Optuna parameter exists only where the study searches it, and round-trips
    dist = distributions(spec, axes)
    assert list(dist["tp_comm_overlap"].choices) == [False, True]  # type: ignore[attr-defined]
    for config in (on[0], configs[0]):
        params = config_params(config, axes)
        assert config_from_params(spec, params) == config
    plain = study_from_mapping({**copy.deepcopy(SPACE), "space": {"tp": [2]}})
    assert "tp_comm_overlap" not in distributions(plain)
    # --set tpo=1 builds the config; without SP it defaults to off
    assert config_from_settings(spec, ["tp=4", "sp=1", "tpo=1"]).tp_comm_overlap
    assert not config_from_settings(spec, ["tp=4", "sp=0"]).tp_comm_overlap


def test_userbuffers_are_twelve_activation_sized_buffers_outside_the_allocator() -> None:
    tokens = MODEL.seq_length * TP8.micro_batch_size
    assert ub_buffer_bytes(tokens, MODEL.hidden_size, False) == 12 * tokens * 8192 * 2
    # FP8: the eight all-gather buffers hold 1-byte elements, the four others stay 16-bit
    assert ub_buffer_bytes(tokens, MODEL.hidden_size, True) == (8 + 4 * 2) * tokens * 8192
    off = estimate_memory(MODEL, TP8, H100, "megatron", "bf16")
    on = estimate_memory(MODEL, dataclasses.replace(TP8, tp_comm_overlap=True), H100,
                         "megatron", "bf16")  # fmt: skip
    assert on.comm_buffers - off.comm_buffers == pytest.approx(12 * tokens * 8192 * 2)
    assert on.allocated == pytest.approx(off.allocated)  # not PyTorch's tensors
    assert on.peak > off.peak


def test_a_ring_exchange_hides_a_smaller_transfer_and_exposes_a_larger_one() -> None:
    rates = catalog_rates(H100, "bf16")
    b = Block(8192, 1280, 8192, comm_bytes=8192 * 8192 * 2)
    gemm = gemm_seconds(rates, b.m, b.n, b.k)
    fast = Link(bandwidth=1e15, latency=0.0)
    assert ring_exchange(rates, b, 8, fast) == pytest.approx(gemm)  # all hidden
    slow = Link(bandwidth=1e9, latency=0.0)  # each step far longer than a chunk
    step = b.comm_bytes / 8 / slow.bandwidth
    assert ring_exchange(rates, b, 8, slow) == pytest.approx(7 * step + gemm / 8)
    # the pipelined reduce-scatter runs on UB_COMM_SMS fewer SMs and exposes its last chunk
    assert margin_rates(rates).sm_count == rates.sm_count - UB_COMM_SMS
    spared = gemm_seconds(margin_rates(rates), b.m, b.n, b.k)
    assert spared > gemm
    rs = 7 / 8 * b.comm_bytes / UB_PIPELINE_SPLITS / fast.bandwidth
    assert pipelined_reduce_scatter(rates, b, 8, fast) == pytest.approx(spared + rs)


def test_userbuffers_hide_tp_traffic_of_a_tp8_layer_on_h100() -> None:
    off = estimate_time(MODEL, BF16, TP8, H100, 8)
    on = estimate_time(MODEL, BF16, dataclasses.replace(TP8, tp_comm_overlap=True), H100, 8)
    assert on.compute == pytest.approx(off.compute)  # the GEMMs' own time is unchanged
    # what stays: the chunks' and the SM margin's cost, and the LM head's own (non-TE) traffic
    assert 0.0 < on.tp_comm < off.tp_comm
    assert on.step < off.step
    # configs that cannot take it keep their TP traffic (tp = 1: nothing to overlap)
    one = ParallelConfig(tp=1, pp=2, dp=32, global_batch_size=64)
    assert estimate_time(MODEL, BF16, one, H100, 8).tp_comm == 0.0
