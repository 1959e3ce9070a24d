"""Achieved rates: tile / wave quantization of GEMMs, NIC aggregation of groups across nodes,
and a measured ``Rates`` replacing the catalog's."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.rates import (
    FLASH_ATTENTION_EFFICIENCY,
    GEMM_EFFICIENCY,
    HOPPER_ATTENTION,
    attention_rates,
    attention_seconds,
    catalog_rates,
    gemm16_seconds,
    gemm_efficiency,
    gemm_rate,
    gemm_seconds,
    group_link,
    wave_fraction,
)
from tuner.models.time.estimate import estimate_time
from tuner.spec.study import ModelSpec, TrainingSpec

A100 = get_gpu("a100-80gb")
SMS = A100.sm_count


def test_a_full_wave_of_whole_tiles_keeps_the_whole_rate() -> None:
    assert SMS == 108
    assert wave_fraction(SMS, 128, 128 * SMS, 128) == pytest.approx(1.0)
    assert wave_fraction(SMS, 128 * SMS, 128, 4096) == pytest.approx(1.0)


def test_one_tile_past_a_wave_idles_about_half_the_gpu() -> None:
    # 109 tiles of 128 x 128: two waves for 1.01 waves of work; no tile of GEMM_TILES does better
    assert wave_fraction(SMS, 128, 128 * (SMS + 1), 128) == pytest.approx(109 / 216, rel=0.02)


def test_split_k_rescues_a_sub_wave_grid_with_a_long_reduction() -> None:
    short = wave_fraction(SMS, 1024, 1024, 512)  # 64 tiles, K too short to split
    long = wave_fraction(SMS, 1024, 1024, 8192)
    assert short == pytest.approx(64 / SMS)
    assert long > short + 0.1


def test_padding_to_whole_tiles_costs_the_padded_share() -> None:
    # 1800 columns (h = 14400 over TP 8) pad to 15 x 128 = 1920 with 128-wide tiles
    aligned = wave_fraction(SMS, 128 * 108, 1792, 14400)
    padded = wave_fraction(SMS, 128 * 108, 1800, 14400)
    assert padded < aligned


def test_small_micro_batches_lower_the_achieved_gemm_rate() -> None:
    rates = catalog_rates(A100, "bf16")
    big = gemm_rate(rates, 8192, 5376, 14336)  # BLOOM-like QKV at TP 8, micro-batch 4
    small = gemm_rate(rates, 2048, 5376, 14336)  # micro-batch 1
    assert small < 0.9 * big <= rates.gemm


def test_cpu_ranks_have_no_tiles() -> None:
    rates = catalog_rates(get_gpu("cpu"), "fp32")
    assert gemm_rate(rates, 7, 13, 5) == rates.gemm


def test_a_ring_across_nodes_uses_the_network_share_of_all_its_ranks_on_a_node() -> None:
    rates = catalog_rates(A100, "bf16")
    assert group_link(rates, 8, 1, 8) is rates.intra
    tp16 = group_link(rates, 16, 1, 8)  # TP over two DGX nodes: 8 NICs per node carry the ring
    assert tp16.bandwidth == pytest.approx(8 * rates.inter.bandwidth)
    assert tp16.latency == rates.inter.latency
    dp = group_link(rates, 4, 8, 8)  # one rank per node: one GPU's share
    assert dp.bandwidth == rates.inter.bandwidth
    half = group_link(rates, 8, 2, 8)  # 4 ranks per node
    assert half.bandwidth == pytest.approx(4 * rates.inter.bandwidth)
    h100 = catalog_rates(get_gpu("b200-180gb"), "bf16")
    assert group_link(h100, 16, 1, 8).bandwidth <= h100.intra.bandwidth


def test_gloo_ranks_share_one_link() -> None:
    rates = catalog_rates(get_gpu("cpu"), "fp32")
    assert group_link(rates, 4, 1, 2).bandwidth == rates.inter.bandwidth


def _gpt() -> ModelSpec:
    return ModelSpec(
        num_layers=8, hidden_size=4096, ffn_hidden_size=16384, num_attention_heads=32,
        vocab_size=51200, seq_length=2048,
    )  # fmt: skip


def test_estimate_time_reads_every_rate_from_the_rates_it_is_given() -> None:
    model, training = _gpt(), TrainingSpec(global_batch_size=64)
    config = ParallelConfig(tp=2, pp=2, dp=4, micro_batch_size=2, global_batch_size=64)
    base = estimate_time(model, training, config, A100, 8)
    rates = catalog_rates(A100, training.precision)
    assert estimate_time(model, training, config, A100, 8, rates=rates) == base
    # a profile that measured every GEMM at half the catalog's rate: GEMM time doubles, the rest
    # (element-wise, attention softmax, communication, optimizer) does not move
    samples = tuple((m, n, k, rates.gemm / 2) for m in (2e3, 8e3) for n in (1e3, 2e4)
                    for k in (1e3, 2e4))  # fmt: skip
    slow = dataclasses.replace(rates, gemm_samples=samples)
    halved = estimate_time(model, training, config, A100, 8, rates=slow)
    assert base.compute < halved.compute < 2 * base.compute
    assert halved.dp_comm == base.dp_comm and halved.optimizer == base.optimizer
    faster_net = dataclasses.replace(
        rates, inter=dataclasses.replace(rates.inter, bandwidth=10 * rates.inter.bandwidth)
    )
    spanning = ParallelConfig(tp=2, pp=2, dp=4, micro_batch_size=2, global_batch_size=64)
    assert (
        estimate_time(model, training, spanning, A100, 2, rates=faster_net).step
        < estimate_time(model, training, spanning, A100, 2).step
    )


H100 = get_gpu("h100-sxm-80gb")


def test_fp8_linear_gemms_read_one_byte_operands_and_write_16_bits() -> None:
    """Transformer Engine's FP8 GEMM of (4096 x 8192) @ (8192 x 1024): 2mnk FLOPs at the FP8
    tile-model rate, 1 B per input and weight element, 2 B per output element; bf16 reads 2 B."""
    m, n, k = 4096.0, 1024.0, 8192.0
    fp8, bf16 = catalog_rates(H100, "fp8"), catalog_rates(H100, "bf16")
    assert fp8.fp8 and not bf16.fp8
    rate = fp8.gemm * wave_fraction(H100.sm_count, m, n, k)
    moved = 1 * (m * k + k * n) + 2 * m * n
    by_hand = 2 * m * n * k / rate + moved / fp8.hbm + fp8.op_latency
    assert gemm_seconds(fp8, m, n, k) == pytest.approx(by_hand, rel=1e-12)
    moved16 = 2 * (m * k + k * n + m * n)
    rate16 = bf16.gemm * wave_fraction(H100.sm_count, m, n, k)
    by_hand16 = 2 * m * n * k / rate16 + moved16 / bf16.hbm + bf16.op_latency
    assert gemm_seconds(bf16, m, n, k) == pytest.approx(by_hand16, rel=1e-12)


def test_16_bit_gemms_under_fp8_run_at_the_16_bit_rate() -> None:
    """The LM head / router under fp8: the bf16 rate (dense 16-bit peak x its efficiency) and
    2-byte operands, exactly what the same GEMM costs in a bf16 run; under bf16 both functions
    are one GEMM."""
    fp8, bf16 = catalog_rates(H100, "fp8"), catalog_rates(H100, "bf16")
    assert fp8.gemm16 == bf16.gemm == H100.peak_tflops * 1e12 * gemm_efficiency(H100)
    assert fp8.gemm == H100.fp8_peak_tflops * 1e12 * gemm_efficiency(H100, fp8=True)
    for shape in ((2048.0, 32064.0, 8192.0), (8192.0, 8.0, 4096.0), (8192.0, 4096.0, 32064.0)):
        assert gemm16_seconds(fp8, *shape) == gemm_seconds(bf16, *shape)
        assert gemm16_seconds(bf16, *shape) == gemm_seconds(bf16, *shape)
        assert gemm16_seconds(fp8, *shape) > gemm_seconds(fp8, *shape)


def test_measured_16_bit_samples_price_only_the_16_bit_gemms_under_fp8() -> None:
    """A profile's samples are bf16 torch.matmul: under fp8 they replace the 16-bit rate, while
    Transformer Engine's FP8 GEMMs keep the catalog's FP8 tile model."""
    fp8 = catalog_rates(H100, "fp8")
    measured = dataclasses.replace(fp8, gemm_samples=((4096.0, 4096.0, 4096.0, 500e12),))
    assert gemm_rate(measured, 4096, 4096, 4096, True) == 500e12
    assert gemm_rate(measured, 4096, 4096, 4096) == gemm_rate(fp8, 4096, 4096, 4096)
    bf16 = dataclasses.replace(catalog_rates(H100, "bf16"), gemm_samples=measured.gemm_samples)
    assert gemm_rate(bf16, 4096, 4096, 4096) == gemm_rate(bf16, 4096, 4096, 4096, True) == 500e12


def test_attention_before_hopper_runs_at_flashattention_2s_rate_at_every_length() -> None:
    rates = catalog_rates(A100, "bf16")
    peak = A100.peak_tflops * 1e12
    for seq in (256, 2048, 32768):
        assert attention_rates(rates, seq) == (peak * FLASH_ATTENTION_EFFICIENCY,) * 2


def test_hopper_attention_follows_cudnns_measured_speed_by_sequence_length() -> None:
    """Transformer Engine's cuDNN attention on H100: slower than A100's FlashAttention-2 share,
    slower still for short sequences, the backward below the forward; between the measured
    lengths the rate is interpolated, beyond them held."""
    h100 = get_gpu("h100-sxm-80gb")
    rates = catalog_rates(h100, "bf16")
    peak = h100.peak_tflops * 1e12
    seq, fwd, bwd = HOPPER_ATTENTION[3]
    assert attention_rates(rates, seq) == pytest.approx((peak * fwd, peak * bwd))
    low, high = attention_rates(rates, 2048), attention_rates(rates, 4096)
    middle = attention_rates(rates, 2896)  # ~ geometric middle
    assert low[0] < middle[0] < high[0] and low[1] < middle[1] < high[1]
    assert attention_rates(rates, 100) == attention_rates(rates, 512)
    assert attention_rates(rates, 1 << 20) == attention_rates(rates, 16384)
    assert all(f < FLASH_ATTENTION_EFFICIENCY and b <= f for _, f, b in HOPPER_ATTENTION)
    assert catalog_rates(h100, "fp8").attention == rates.attention  # attention stays 16-bit


def test_attention_backward_is_two_and_a_half_forwards_at_the_backward_rate() -> None:
    rates = catalog_rates(get_gpu("h100-sxm-80gb"), "bf16")
    fwd_rate, bwd_rate = attention_rates(rates, 8192)
    fwd, bwd = attention_seconds(rates, 1e12, 8192)
    assert fwd == pytest.approx(1e12 / fwd_rate + rates.op_latency)
    assert bwd == pytest.approx(2.5e12 / bwd_rate + rates.op_latency)


def test_context_parallel_attention_runs_at_the_rate_of_its_shorter_ring_steps() -> None:
    """Under CP each rank's fused attention calls cover s/cp tokens: on Hopper, where the rate
    grows with the call length, the same attention FLOPs take longer split over cp ranks."""
    from tuner.models.time.estimate import _attention_core

    model = ModelSpec(num_layers=2, hidden_size=4096, ffn_hidden_size=16384,
                      num_attention_heads=32, vocab_size=32000, seq_length=4096)  # fmt: skip
    h100 = catalog_rates(get_gpu("h100-sxm-80gb"), "bf16")
    whole = _attention_core(model, h100, 4096, 4096, 1)
    split = _attention_core(model, h100, 2048, 2048, 1)  # one of two CP ranks: half the queries
    assert split[0] > whole[0] / 2 and split[1] > whole[1] / 2
    a100 = catalog_rates(A100, "bf16")  # flat rate: the halves add up to the whole
    halves = _attention_core(model, a100, 2048, 2048, 1)
    whole_a100 = _attention_core(model, a100, 4096, 4096, 1)
    assert 2 * halves[0] - whole_a100[0] == pytest.approx(a100.op_latency)


def test_gemm_efficiency_is_each_gpus_measured_matmul_ceiling() -> None:
    """A full wave of a large GEMM runs at the GPU's measured maximum achievable matmul rate
    (ml-engineering's MAMF table: A100 SXM 271.2 of 312 BF16, H100 SXM 794.5 of 989 BF16 and
    1402.6 of 1979 FP8); a GPU without a measurement gets the A100's share."""
    assert gemm_efficiency(get_gpu("a100-80gb")) == pytest.approx(271.2 / 312.0)
    assert GEMM_EFFICIENCY == pytest.approx(271.2 / 312.0)
    assert gemm_efficiency(H100) == pytest.approx(794.5 / 989.0)
    assert gemm_efficiency(H100, fp8=True) == pytest.approx(1402.6 / 1979.0)
    assert gemm_efficiency(H100, fp8=True) < gemm_efficiency(H100) < GEMM_EFFICIENCY
    unmeasured = dataclasses.replace(H100, mamf_tflops=0.0, mamf_fp8_tflops=0.0)
    assert gemm_efficiency(unmeasured) == gemm_efficiency(unmeasured, fp8=True) == GEMM_EFFICIENCY
    assert catalog_rates(H100, "bf16").gemm == pytest.approx(794.5e12)
