"""Transformer Engine's FP8 casts in the step-time model: bytes by hand, recipes, the breakdown."""

from __future__ import annotations

import dataclasses

import pytest

from tuner._loader import load_dataclass
from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.rates import catalog_rates, wave_fraction
from tuner.models.time.estimate import CROSS_ENTROPY_BYTES_PER_LOGIT, estimate_time
from tuner.models.time.fp8 import (
    amax_sync_seconds,
    fp8_cast_times,
    fp8_moe_cast_delta,
    gathered_bytes,
    quantize_bytes,
    tp_gather_ratios,
)
from tuner.spec.file import _expand_model
from tuner.spec.fp8 import Fp8Recipe
from tuner.spec.study import ModelSpec, Precision, TrainingSpec

H100 = get_gpu("h100-sxm-80gb")
RATES = catalog_rates(H100, "fp8")


def _small() -> ModelSpec:
    """h 64, FFN 256 GeLU, 4 heads of 16 (multi-head: K and V are h wide each), sequence 128."""
    return ModelSpec(
        num_layers=4, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
        vocab_size=1024, seq_length=128,
    )  # fmt: skip


def test_one_gemm_input_costs_a_read_and_two_one_byte_copies() -> None:
    """A 1024-element bf16 tensor: read 2 B, write the row-wise and column-wise FP8 copies."""
    n = 1024.0
    assert quantize_bytes("delayed", n) == n * (2 + 1 + 1)
    assert quantize_bytes("tensorwise", n) == n * (2 + 2 + 1 + 1)  # the amax pass reads it first
    assert quantize_bytes("blockwise", n) == pytest.approx(n * (2 + 2 + 2 * 4 / 128))
    assert quantize_bytes("mxfp8", n) == pytest.approx(n * (2 + 2 + 2 / 32))
    # behind the norm: delayed scaling's norm writes FP8 itself, the transpose is left (1 + 1 B);
    # current scaling's norm finds the amax, so the cast skips its amax pass
    assert quantize_bytes("delayed", n, fused_norm=True) == n * 2
    assert quantize_bytes("tensorwise", n, fused_norm=True) == n * 4


def test_a_gathered_input_casts_its_shard_and_transposes_the_whole() -> None:
    """Sequence parallel over 4 ranks: per-tensor recipes gather row-wise FP8 only, so the
    local quarter is cast row-wise (read 2 + write 1) and the gathered tensor transposed in the
    backward (read 1 + write 1); block recipes cast both copies of the shard."""
    n = 4096.0
    assert gathered_bytes("delayed", n, 4) == (n / 4 * 3, n * 2)
    assert gathered_bytes("delayed", n, 4, fused_norm=True) == (0.0, n * 2)
    assert gathered_bytes("tensorwise", n, 4) == (n / 4 * 5, n * 2)
    assert gathered_bytes("mxfp8", n, 4) == (quantize_bytes("mxfp8", n / 4), 0.0)


def test_a_dense_layer_by_hand() -> None:
    """tp 1, delayed scaling, T = 128 tokens, h 64, F 256, K and V 2h wide.
    forward: QKV and fc1 inputs behind the norms (2 B each), proj input (4 B x h), fc2 input
    (4 B x F); backward: output gradients of proj and fc2 (h), QKV (3h), fc1 (F), 4 B each;
    weights once per step: 4h^2 + 2hF elements, read 2 B, write 2 x 1 B; one launch per cast."""
    model = _small()
    c = ParallelConfig(micro_batch_size=1, global_batch_size=8)
    t, h, f = 128.0, 64.0, 256.0
    fwd = t * (2 * h + 4 * h + 2 * h + 4 * f)
    bwd = t * (4 * h + 4 * 3 * h + 4 * h + 4 * f)
    weights = (4 * h * h + 2 * h * f) * 4
    lat = RATES.op_latency
    cast = fp8_cast_times(model, RATES, c, "delayed", 8)
    assert cast.fwd == pytest.approx(fwd / RATES.hbm + 4 * lat)
    assert cast.bwd == pytest.approx(bwd / RATES.hbm + 4 * lat)
    assert cast.weights == pytest.approx(weights / RATES.hbm + 4 * lat)


def test_recipes_order_by_the_bytes_they_move() -> None:
    model = _small()
    c = ParallelConfig(tp=2, sequence_parallel=True, micro_batch_size=2, global_batch_size=8)
    delayed, tensorwise, blockwise = (
        fp8_cast_times(model, RATES, c, r, 8) for r in ("delayed", "tensorwise", "blockwise")
    )
    assert tensorwise.fwd > delayed.fwd and tensorwise.weights > delayed.weights
    assert blockwise.weights > delayed.weights  # the block scales beside the copies
    # delayed scaling alone reduces amaxes once per model chunk, forward and backward
    assert amax_sync_seconds(RATES, c, "delayed", 8) > 0.0
    assert amax_sync_seconds(RATES, c, "tensorwise", 8) == 0.0
    interleaved = dataclasses.replace(c, vp=2)
    assert amax_sync_seconds(RATES, interleaved, "delayed", 8) == pytest.approx(
        2 * amax_sync_seconds(RATES, c, "delayed", 8)
    )


def test_bf16_pays_no_cast_and_fp8_pays_it_in_the_step() -> None:
    model = _small()
    c = ParallelConfig(tp=2, pp=2, sequence_parallel=True, micro_batch_size=1,
                       global_batch_size=8)  # fmt: skip
    bf16 = estimate_time(model, TrainingSpec(global_batch_size=8), c, H100, 8)
    assert bf16.fp8_cast == 0.0 and bf16.moe_routing == 0.0
    fp8 = estimate_time(model, TrainingSpec(global_batch_size=8, precision="fp8"), c, H100, 8)
    layers, m = model.num_layers / c.pp, c.num_microbatches
    cast = fp8_cast_times(model, RATES, c, "delayed", 8)
    amax = amax_sync_seconds(RATES, c, "delayed", 8)
    assert fp8.fp8_cast == pytest.approx(
        m * layers * (cast.fwd + cast.bwd) + layers * cast.weights + m * amax
    )
    parts = (
        "compute",
        "recompute",
        "tp_comm",
        "cp_comm",
        "ep_comm",
        "pp_p2p",
        "pp_bubble",
        "dp_comm",
        "optimizer",
        "stage_imbalance",
        "overhead",
        "fp8_cast",
        "moe_routing",
    )
    assert fp8.step == pytest.approx(sum(getattr(fp8, p) for p in parts))  # fmt: skip


def test_full_recompute_casts_the_rerun_forward_again() -> None:
    model = _small()
    c = ParallelConfig(micro_batch_size=1, global_batch_size=8)
    full = dataclasses.replace(c, recompute="full", recompute_method="uniform",
                               recompute_num_layers=1)  # fmt: skip
    t = TrainingSpec(global_batch_size=8, precision="fp8")
    cast = fp8_cast_times(model, RATES, c, "delayed", 8)
    extra = (
        estimate_time(model, t, full, H100, 8).fp8_cast
        - estimate_time(model, t, c, H100, 8).fp8_cast
    )
    assert extra == pytest.approx(c.num_microbatches * model.num_layers * cast.fwd)


def test_moe_layers_cast_the_routed_tokens_for_their_experts() -> None:
    """Mixtral at EP 8: each rank's experts see topk = 2 x its tokens, and their fc1 input is
    the permuted rows (a full cast, not the norm's fused one), so the experts' casts exceed the
    dense MLP's they replace; their weights (one expert per rank, 3 h F_e with F_e = F) cost
    what the dense MLP's did."""
    model = load_dataclass(ModelSpec, _expand_model({"preset": "mixtral-8x7b"}), "model")
    c = ParallelConfig(pp=4, dp=16, ep=8, global_batch_size=256, distributed_optimizer=True)
    delta = fp8_moe_cast_delta(model, RATES, c, "delayed", 8)
    assert delta.fwd > 0 and delta.bwd > 0
    assert delta.weights == pytest.approx(0.0, abs=1e-7)  # same width, one expert per rank


def test_the_lm_head_runs_at_16_bits_under_fp8() -> None:
    """Megatron's output layer is its own ColumnParallelLinear, not a TE module: under fp8 the
    last stage's head (T = 128 tokens, h 64, vocab 1024, its GEMM and two gradient GEMMs) costs
    what it costs in bf16, by hand: the 16-bit rate, 2-byte operands, the fp32 logits' loss
    (unfused: CROSS_ENTROPY_BYTES_PER_LOGIT)."""
    model = dataclasses.replace(_small(), tied_embeddings=False)
    c = ParallelConfig(pp=2, micro_batch_size=1, global_batch_size=8)
    fp8 = estimate_time(model, TrainingSpec(global_batch_size=8, precision="fp8"), c, H100, 8)
    bf16 = estimate_time(model, TrainingSpec(global_batch_size=8), c, H100, 8)
    t, h, v = 128.0, 64.0, 1024.0

    def gemm16(m: float, n: float, k: float) -> float:
        rate = RATES.gemm16 * wave_fraction(H100.sm_count, m, n, k)
        return 2 * m * n * k / rate + 2 * (m * k + k * n + m * n) / RATES.hbm + RATES.op_latency

    head = gemm16(t, v, h) + gemm16(t, h, v) + gemm16(h, v, t)
    # the loss's passes over the fp32 logits, the last norm and its input
    head += t * (v * CROSS_ENTROPY_BYTES_PER_LOGIT + 4 * h * 2) / RATES.hbm
    # pp 2, even stages, tp 1, untied: the last stage's extra work is the head alone
    assert fp8.stage_imbalance == pytest.approx(c.num_microbatches * head, rel=1e-12)
    assert fp8.stage_imbalance == pytest.approx(bf16.stage_imbalance, rel=1e-12)


def test_fp8_gathers_halve_the_sequence_parallel_all_gathers() -> None:
    """tp 2 with SP, T = 128 tokens of h 64: every ring moves (tp-1)/tp x T h x 2 B at 16 bits.
    Forward: the QKV and fc1 inputs' all-gathers carry FP8 (1 B) under delayed scaling, the
    proj and fc2 reduce-scatters 16 bits; backward: the proj and fc2 output gradients'
    all-gathers FP8 on the critical path, the QKV and fc1 input gradients' reduce-scatters
    behind the weight-gradient GEMMs (this layer's are shorter than two launches, so 2 x the
    latency is left). The LM head's gathers stay 16-bit."""
    model = _small()
    c = ParallelConfig(tp=2, sequence_parallel=True, micro_batch_size=1, global_batch_size=8)
    link = RATES.intra
    ring, lat = 0.5 * 128 * 64 * 2 / link.bandwidth, link.latency
    layers, m = model.num_layers, c.num_microbatches
    head = 4 * (ring + lat)
    for precision, g in (("bf16", 1.0), ("fp8", 0.5)):
        t = estimate_time(model, TrainingSpec(global_batch_size=8, precision=precision), c,
                          H100, 8)  # fmt: skip
        fwd = 2 * (g * ring + lat) + 2 * (ring + lat)
        bwd = 2 * (g * ring + lat) + 2 * lat
        assert t.tp_comm == pytest.approx(m * (layers * (fwd + bwd) + head), rel=1e-12)


def test_which_gathers_each_recipe_quantizes() -> None:
    """Bytes per gathered element over bf16's 2: the forward gathers row-wise FP8 with its
    scales (1x128 fp32, 1x32 E8M0); the backward gathers row-wise data under per-tensor
    recipes, both copies under block-scaled ones; bf16 gathers bf16."""

    def ratios(precision: Precision, recipe: Fp8Recipe) -> tuple[float, float]:
        training = TrainingSpec(global_batch_size=8, precision=precision, fp8_recipe=recipe)
        return tp_gather_ratios(training, 2)

    assert ratios("bf16", "delayed") == (1.0, 1.0)
    assert ratios("fp8", "delayed") == ratios("fp8", "tensorwise") == (0.5, 0.5)
    assert ratios("fp8", "blockwise") == pytest.approx(((1 + 4 / 128) / 2, (2 + 8 / 128) / 2))
    assert ratios("fp8", "mxfp8") == pytest.approx(((1 + 1 / 32) / 2, (2 + 2 / 32) / 2))
