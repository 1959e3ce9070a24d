"""Time terms of DeepSpeed and Megatron-DeepSpeed: the PipelineEngine, ZeRO-1, ZeRO-3's gathers
and BF16_Optimizer."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.optimizer_layout import DEEPSPEED_ZERO_DEFAULTS
from tuner.models.time.deepspeed import zero3_passes
from tuner.models.time.estimate import TimeBreakdown, estimate_time
from tuner.spec.frameworks import Framework
from tuner.spec.study import ModelSpec, Precision, TrainingSpec

A100 = get_gpu("a100-80gb")
# BLOOM-176B (bigscience tr11-176B-ml.slurm): 70 layers, h 14336, 112 heads, vocab 250880
BLOOM = ModelSpec(
    num_layers=70, hidden_size=14336, ffn_hidden_size=4 * 14336, num_attention_heads=112,
    vocab_size=250880, seq_length=2048, flash_attention=False, dropout=True,
    position_embedding="learned_absolute", normalization="layernorm", add_bias_linear=True,
)  # fmt: skip
PRODUCTION = ParallelConfig(
    tp=4, pp=12, dp=8, micro_batch_size=2, global_batch_size=2048, recompute="full",
    recompute_method="uniform", recompute_num_layers=1, zero_stage=1,
)  # fmt: skip
JEAN_ZAY = dataclasses.replace(A100, inter_node_gbps=6.25)  # 4 x 100 Gb/s Omni-Path / 8 GPUs


def _step(
    config: ParallelConfig, precision: Precision, framework: Framework = "megatron-deepspeed"
) -> TimeBreakdown:
    training = TrainingSpec(global_batch_size=config.global_batch_size, precision=precision)
    return estimate_time(BLOOM, training, config, JEAN_ZAY, 8, framework)


def test_bloom_production_step_is_within_the_published_figure() -> None:
    """bigscience tr11 README / log: 104.7 s per iteration at iteration 85376 (bf16, ZeRO-1 with
    BF16_Optimizer, TP 4, PP 12, DP 8, micro-batch 2, 384 A100 on Jean Zay)."""
    step = _step(PRODUCTION, "bf16").step
    assert abs(step - 104.7) / 104.7 < 0.12


def test_bf16_optimizer_all_reduces_fp32_gradients_then_gathers_bf16_parameters() -> None:
    """pipe/engine.py _bf16_reduce_grads all-reduces the 4-byte grads (2 x 4 B per parameter on
    the ring) and BF16_Optimizer.step all-gathers the 2-byte parameters: 10 B against ZeRO-1
    fp16's reduce-scatter + all-gather of 2-byte elements, 4 B."""
    bf16 = _step(PRODUCTION, "bf16").dp_comm
    fp16 = _step(PRODUCTION, "fp16").dp_comm
    assert bf16 == pytest.approx(2.5 * fp16, rel=0.02)


def test_bf16_optimizer_pays_an_fp32_accumulation_every_micro_batch() -> None:
    """update_hp_grads adds each micro-batch's bf16 grads into the fp32 buffer over the whole
    stage: doubling the micro-batches (same micro-batch size) adds that HBM pass m more times;
    Megatron fuses the accumulation into the weight-gradient GEMM and pays nothing."""
    more = dataclasses.replace(PRODUCTION, global_batch_size=2 * PRODUCTION.global_batch_size)
    grow = _step(more, "bf16").optimizer - _step(PRODUCTION, "bf16").optimizer
    stage_params = 4.5e9  # 70 / 12 layers of 2.46e9 / 4, plus the 0.9e9 / 4 embedding
    hbm = A100.hbm_gbps * 1e9 * 0.8
    assert grow == pytest.approx(128 * stage_params * 20 / hbm, rel=0.15)
    megatron = [_step(c, "bf16", "megatron").optimizer for c in (PRODUCTION, more)]
    assert megatron[0] == pytest.approx(megatron[1])


def test_fp16_autograd_accumulation_is_cheaper_than_bf16_optimizer_accumulation() -> None:
    fp16 = _step(PRODUCTION, "fp16").optimizer
    bf16 = _step(PRODUCTION, "bf16").optimizer
    assert 0.0 < fp16 < bf16 / 2  # 6 B against 20 B per parameter and micro-batch


def test_tied_embedding_all_reduce_uses_the_gradient_dtype_the_engine_holds() -> None:
    """_exec_reduce_tied_grads reduces weight._hp_grad (fp32) under BF16_Optimizer, else the
    16-bit weight.grad: the bf16 step's tied reduction moves twice the bytes."""
    bf16 = _step(PRODUCTION, "bf16").stage_imbalance
    fp16 = _step(PRODUCTION, "fp16").stage_imbalance
    assert bf16 > fp16


def test_deepspeed_grad_reduction_is_not_hidden_behind_backward() -> None:
    """Megatron overlaps its gradient reduce with the last backward; DeepSpeed's pipeline engine
    reduces after the flush (ReduceGrads), so ZeRO-1's reduce-scatter + all-gather of 2-byte
    elements is exposed whole: 2 x 7/8 x 4.53e9 x 2 B over a ring with two ranks per node
    (2 x 6.25 GB/s x 0.8 of Omni-Path)."""
    fp16 = _step(PRODUCTION, "fp16").dp_comm
    assert fp16 == pytest.approx(2 * 7 / 8 * 4.53e9 * 2 / (2 * 6.25e9 * 0.8), rel=0.03)


def test_zero3_regathers_in_the_backward_only_what_it_released() -> None:
    """DeepSpeed ZeRO-3 keeps a parameter gathered from its forward to its backward use when
    the parameters fetched in between (the modules after it, once in the forward and once in
    the backward) are under ``stage3_max_reuse_distance`` (1e9 by default): a stage of up to
    5e8 parameters is gathered once per micro-batch (all-gather and reduce-scatter, 2 passes), a
    175B one re-gathers almost all of it in the backward (3 passes)."""
    assert zero3_passes(4e8) == 2.0 and zero3_passes(5e8) == 2.0
    assert zero3_passes(1e9) == pytest.approx(2.5)
    assert zero3_passes(175e9) == pytest.approx(3.0, abs=0.003)
    assert zero3_passes(1e9) < zero3_passes(2e9) < zero3_passes(175e9) < 3.0


def test_zero3_traffic_follows_the_reuse_distance(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same small model (its gathers far under the prefetch bucket, so all exposed) with
    DeepSpeed's default reuse distance and with ``stage3_max_reuse_distance: 0`` (every
    parameter released after its forward use): two passes per micro-batch against three."""
    tiny = ModelSpec(num_layers=4, hidden_size=256, ffn_hidden_size=1024,
                     num_attention_heads=4, vocab_size=4096, seq_length=256)  # fmt: skip
    config = ParallelConfig(dp=8, micro_batch_size=1, global_batch_size=16, zero_stage=3)
    training = TrainingSpec(global_batch_size=16, precision="bf16")

    def comm() -> float:
        return estimate_time(tiny, training, config, A100, 8, "deepspeed").dp_comm

    kept = comm()
    monkeypatch.setitem(DEEPSPEED_ZERO_DEFAULTS, "stage3_max_reuse_distance", 0)
    assert kept == pytest.approx(comm() * 2 / 3, rel=1e-9)


H100 = get_gpu("h100-sxm-80gb")
# A 13B Llama-style GPT: 40 layers, h 5120, GQA 8 groups, 32k vocabulary, SwiGLU, 4k context.
GPT13B = ModelSpec(
    num_layers=40, hidden_size=5120, ffn_hidden_size=13824, num_attention_heads=40,
    num_query_groups=8, vocab_size=32000, seq_length=4096, swiglu=True, normalization="rmsnorm",
    position_embedding="rope", add_bias_linear=False, dropout=False,
)  # fmt: skip


def test_zero3_gathers_are_paid_every_micro_batch_and_hide_only_behind_its_compute() -> None:
    """ZeRO-3 gathers the parameters in every micro-batch's forward and backward and
    reduce-scatters its gradients (fetch_sub_module per submodule, prefetching the next
    ``stage3_prefetch_bucket_size`` elements): about 2.96 passes over 11.2e9 parameters of 2 B
    per micro-batch. Inside one DGX H100 (DP 8 on NVLink) that is about 0.19 s against about
    0.49 s of compute per micro-batch, 37% of each layer's forward and backward: hidden but for
    the first prefetch of each pass (ms). Across two nodes (DP 16 at one NIC's share) it is about
    1.5 s per micro-batch: exposed, and twice the micro-batches pay it twice."""

    def dp_comm(dp: int, batch: int) -> float:
        config = ParallelConfig(dp=dp, micro_batch_size=1, global_batch_size=batch, zero_stage=3)
        training = TrainingSpec(global_batch_size=batch, precision="bf16")
        return estimate_time(GPT13B, training, config, H100, 8, "deepspeed").dp_comm

    one_node = dp_comm(8, 64)  # 8 micro-batches
    assert 0.0 < one_node < 0.01
    assert dp_comm(8, 128) == pytest.approx(2 * one_node, rel=1e-9)
    two_nodes = dp_comm(16, 128)  # 8 micro-batches
    assert two_nodes > 8 * 1.0
    assert dp_comm(16, 256) == pytest.approx(2 * two_nodes, rel=1e-9)
