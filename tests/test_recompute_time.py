"""What selective recompute's modules add to the backward, and to the hardware FLOPs."""

from __future__ import annotations

import dataclasses

import pytest

from tests.test_recompute_memory import SMALL
from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.moe import mlp_seconds, moe_layer_times
from tuner.models.rates import catalog_rates, group_link
from tuner.models.time.estimate import estimate_time, hardware_flops_per_step
from tuner.models.time.recompute import NORM_PASSES
from tuner.spec.study import ModelSpec, TrainingSpec

H100 = get_gpu("h100-sxm-80gb")
TRAINING = TrainingSpec(global_batch_size=8)
RATES = catalog_rates(H100, "bf16")


def times(model: ModelSpec, c: ParallelConfig) -> tuple[float, float, float]:
    t = estimate_time(model, TRAINING, c, H100, 8, "megatron", RATES)
    return t.recompute, t.tp_comm, t.ep_comm


def sel(*modules: str, **kw: object) -> ParallelConfig:
    kw = {"dp": 8} | kw
    return ParallelConfig(global_batch_size=8, recompute="selective",
                          recompute_modules=modules, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_moe_runs_the_moe_block_and_its_dispatch_again() -> None:
    """SMALL: every layer MoE, 1 micro-batch per rank, both layers on one stage."""
    c = sel("core_attn", "moe", ep=2)
    base = times(SMALL, sel("core_attn", ep=2))
    with_moe = times(SMALL, c)
    mt = moe_layer_times(SMALL, RATES, c, 8, group_link(RATES, c.tp * c.ep, 1, 8))
    dense_f = mlp_seconds(RATES, 128, 64, 256, True)[0]  # the dense MLP fwd_delta is against
    layers = 2  # x 1 micro-batch
    assert with_moe[0] - base[0] == pytest.approx(layers * (mt.fwd_delta + dense_f))
    assert with_moe[2] - base[2] == pytest.approx(layers * mt.comm_fwd)
    assert with_moe[2] > base[2] > 0


def test_without_core_attn_the_attention_core_is_not_recomputed() -> None:
    only_act = times(SMALL, sel("moe_act"))[0]
    both = times(SMALL, sel("core_attn", "moe_act"))[0]
    attention = times(SMALL, sel("core_attn"))[0]
    assert both == pytest.approx(only_act + attention)
    # moe_act: one element pass over the routed tokens' fc1 output (2 x 128) and fc2 input (128)
    stream = 256 * 128 * 3 * RATES.elem / RATES.hbm + RATES.op_latency
    assert only_act == pytest.approx(2 * stream)
    assert times(SMALL, sel("moe"))[0] > only_act > 0


def test_dense_mlp_recompute_with_its_tp_traffic() -> None:
    dense = dataclasses.replace(SMALL, moe=None)
    c = sel("core_attn", "mlp", tp=2, sequence_parallel=True, dp=4)
    rec, tp, _ = times(dense, c)
    base_rec, base_tp, _ = times(dense, dataclasses.replace(c, recompute_modules=None))
    tokens, e = 128, RATES.elem
    gemms = mlp_seconds(RATES, tokens, 64, 256 / 2, True)[0]
    act = tokens * (2 * 256 + 256) * e / 2 / RATES.hbm + RATES.op_latency
    norm = NORM_PASSES * tokens / 2 * 64 * e / RATES.hbm + RATES.op_latency
    runs = 2 * 2  # layers x micro-batches (gbs 8 / dp 4)
    assert rec - base_rec == pytest.approx(runs * (gemms + act + norm))
    # the MLP block's all-gather + reduce-scatter (SP), half of the layer's forward TP traffic
    link = group_link(RATES, 2, 1, 8)
    ring = (2 - 1) / 2 * tokens * 64 * e / link.bandwidth
    assert tp - base_tp == pytest.approx(runs * 2.0 * (ring + link.latency))


def test_hardware_flops_count_the_recomputed_gemms() -> None:
    dense = dataclasses.replace(SMALL, moe=None)
    b, s, h, f, layers = 8, 128, 64, 256, 2
    core = 4.0 * s * s * h
    mlp = s * 2.0 * h * 3 * f  # fc1 (2F) + fc2, 2 FLOPs per MAC
    base = hardware_flops_per_step(dense, ParallelConfig(global_batch_size=b))
    assert hardware_flops_per_step(dense, sel("core_attn", "mlp")) == pytest.approx(
        base + b * layers * (core + mlp)
    )
    assert hardware_flops_per_step(dense, sel("mlp")) == pytest.approx(base + b * layers * mlp)
    # MoE layers: the router and top-2 experts of width 128 per token run again
    moe_mlp = s * (2.0 * h * 3 * 128 * 2 + 2.0 * h * 4)
    moe_base = hardware_flops_per_step(SMALL, ParallelConfig(global_batch_size=b))
    assert hardware_flops_per_step(SMALL, sel("moe")) == pytest.approx(
        moe_base + b * layers * moe_mlp
    )
