"""FSDP2's step-time terms (tuner/models/time/fsdp2.py): torchtitan's eager element-wise kernels,
what torch.compile removes of them, FSDP2's copies on the compute stream, and the part the
published H100 rows ran on."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.rates import catalog_rates
from tuner.models.time.estimate import estimate_time
from tuner.models.time.fsdp2 import (
    COMPOSITE_NORM_FP32_BYTES,
    ROPE_EXTRA_BYTES,
    copy_seconds,
    eager_elementwise_bytes,
    eager_elementwise_seconds,
)
from tuner.spec.file import study_from_mapping
from tuner.spec.study import TrainingSpec

STUDY = {
    "name": "tt", "model": {"preset": "llama3-8b"},
    "training": {"global_batch_size": 16, "precision": "bf16"},
    "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 1, "executor": "local"},
    "framework": "torchtitan",
    "launch": {"template": "torchtitan_llama",
               "script_args": ["--module", "llama3", "--config", "llama3_8b"]},
    "space": {"tp": [1]},
}  # fmt: skip
MODEL = study_from_mapping(STUDY).model
H, KV, F = 4096, 1024, 14336  # Llama 3 8B: 32 query heads, 8 KV heads of 128


def _config(**kw: object) -> ParallelConfig:
    base: dict[str, object] = {
        "dp": 8, "micro_batch_size": 2, "global_batch_size": 16, "recompute": "selective",
    }  # fmt: skip
    return ParallelConfig(**(base | kw))  # type: ignore[arg-type]


def test_eager_bytes_count_rope_the_output_copy_and_swiglu_by_hand() -> None:
    e = 2
    release = ROPE_EXTRA_BYTES * (H + KV) + 2 * e * H + 2 * e * F
    assert eager_elementwise_bytes(MODEL, 1, True, e, False) == pytest.approx(release)
    # the 2024 code adds its composite RMSNorm on two norms and repeat_kv for K and V
    code_2024 = release + 2 * (2 * e + COMPOSITE_NORM_FP32_BYTES) * H + 2 * e * (KV + H)
    assert eager_elementwise_bytes(MODEL, 1, True, e, True) == pytest.approx(code_2024)
    # TP splits the heads and the FFN; without SP the norms stay whole
    no_sp = eager_elementwise_bytes(MODEL, 2, False, e, True)
    assert no_sp == pytest.approx((release + 2 * e * (KV + H)) / 2 + 2 * (2 * e + 28) * H)


def test_compile_removes_the_eager_passes_and_checkpointing_runs_them_again() -> None:
    rates = catalog_rates(get_gpu("h100-sxm-80gb"), "bf16")
    fwd, bwd, redo = eager_elementwise_seconds(MODEL, _config(), rates, False)
    assert bwd == pytest.approx(2 * fwd) and redo == fwd > 0
    assert eager_elementwise_seconds(MODEL, _config(recompute="none"), rates, False)[2] == 0.0
    assert eager_elementwise_seconds(MODEL, _config(compile=True), rates, False) == (0, 0, 0)


def test_compile_and_the_2024_code_order_the_step_times() -> None:
    gpu, training = get_gpu("h100-sxm-80gb"), TrainingSpec(global_batch_size=16)

    def step(c: ParallelConfig, code_2024: bool = False) -> float:
        return estimate_time(
            MODEL, training, c, gpu, 8, "torchtitan", torchtitan_2024=code_2024
        ).step

    compiled, eager, old = step(_config(compile=True)), step(_config()), step(_config(), True)
    assert compiled < eager < old
    # only torchtitan runs the eager kernels: a Megatron config's step ignores the flag
    mc = dataclasses.replace(_config(), recompute="none")
    assert estimate_time(MODEL, training, mc, gpu, 8).step == pytest.approx(
        estimate_time(MODEL, training, mc, gpu, 8, torchtitan_2024=True).step
    )


def test_fsdp2_copies_read_and_write_every_parameter() -> None:
    rates = catalog_rates(get_gpu("a100-80gb"), "bf16")
    out, into = copy_seconds(8e9, rates)
    assert out == pytest.approx(8e9 * 4 / rates.hbm)  # bf16 read + bf16 write
    assert into == pytest.approx(8e9 * 6 / rates.hbm)  # bf16 gradient in, fp32 reduce input out


def test_the_published_h100_part_sits_between_nvl_and_sxm() -> None:
    part, sxm = get_gpu("h100-hbm2e-96gb-500w"), get_gpu("h100-sxm-80gb")
    assert 835.0 < part.peak_tflops < sxm.peak_tflops and part.hbm_gbps == 2400.0
    assert part.mamf_tflops / part.peak_tflops == pytest.approx(
        sxm.mamf_tflops / sxm.peak_tflops, abs=1e-3
    )


def test_torchtitan_attention_is_sdpa_flash2_on_hopper_and_unchanged_before() -> None:
    from tuner.models.time.fsdp2 import SDPA_HOPPER_FLASH2_EFFICIENCY, sdpa_rates

    hopper = catalog_rates(get_gpu("h100-sxm-80gb"), "bf16")
    flash2 = sdpa_rates(hopper, 9.0).attention
    assert flash2 == ((1.0,) + (hopper.peak * SDPA_HOPPER_FLASH2_EFFICIENCY,) * 2,)
    assert len(hopper.attention) > 1  # Transformer Engine's cuDNN table stays Megatron's
    ampere = catalog_rates(get_gpu("a100-80gb"), "bf16")
    assert sdpa_rates(ampere, 8.0) is ampere
    blackwell = catalog_rates(get_gpu("b200-180gb"), "bf16")
    assert sdpa_rates(blackwell, 10.0) is blackwell  # no measured FlashAttention-2 figure
