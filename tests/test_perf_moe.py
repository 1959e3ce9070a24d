"""MoE routing in the step-time model: router, scores, aux loss, permute / unpermute by hand."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.rates import catalog_rates, gemm16_seconds, gemm_seconds
from tuner.models.time.estimate import estimate_time
from tuner.models.time.moe import moe_routing_times, routing_bytes
from tuner.spec.moe import MoESpec
from tuner.spec.study import ModelSpec, TrainingSpec

H100 = get_gpu("h100-sxm-80gb")
RATES = catalog_rates(H100, "bf16")
C = ParallelConfig(micro_batch_size=1, global_batch_size=8)
T, E, H, K = 128.0, 4.0, 64.0, 2.0  # tokens per rank, experts, hidden, top-k
ROW = H * 2  # one bf16 token row


def _moe(**moe: object) -> ModelSpec:
    spec = MoESpec(num_experts=4, router_topk=2, **moe)  # type: ignore[arg-type]
    return ModelSpec(
        num_layers=4, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
        vocab_size=1024, seq_length=128, swiglu=True, moe=spec,
    )  # fmt: skip


def test_routing_bytes_by_hand() -> None:
    """bf16 scores (2 B), unfused permute, no aux loss, one rank: softmax read + write, top-k
    read, probs write, bool map: T E (4 x 2 + 1); permute transposes map and probs (2 T E
    (1 + 2)) and copies the T k rows (read + write); unpermute gathers the probs again
    (2 T E 2), multiplies and scatter-adds the rows (3 T k) into a zero-filled output (2 T)."""
    scores = T * E * 9 + 2 * T * E * 3 + 2 * T * E * 2
    rows = 2 * T * K * ROW + 3 * T * K * ROW + 2 * T * ROW
    assert routing_bytes(_moe(), C, 2) == (scores, rows)
    # the aux loss: a second softmax (read + write), the probs sum and the map sum
    with_aux = routing_bytes(_moe(aux_loss_coeff=0.01), C, 2)
    assert with_aux == (scores + T * E * (3 * 2 + 1), rows)
    # TE's fused permute / unpermute: each row read once and written once, no transposes
    fused = routing_bytes(_moe(permute_fusion=True), C, 2)
    assert fused == (T * E * 9, 2 * T * K * ROW + T * K * ROW + T * ROW)
    # fp32 router scores: 4 B per score
    assert routing_bytes(_moe(router_dtype="fp32"), C, 2)[0] == (
        T * E * 17 + 2 * T * E * 5 + 2 * T * E * 4
    )


def test_two_local_experts_regroup_the_received_rows() -> None:
    """EP 2 with 4 experts: each rank's 2 experts receive T k rows (even load) and the
    dispatcher sorts them by expert after the all-to-all and back before the combine."""
    ep2 = dataclasses.replace(C, ep=2, dp=2)
    base = routing_bytes(_moe(), C, 2)[1]
    assert routing_bytes(_moe(), ep2, 2)[1] == base + 2 * 2 * T * K * ROW


def test_router_term_by_hand() -> None:
    """Forward: the (T x h) @ (h x E) router GEMM, the bytes above at the achieved HBM rate,
    one launch per pass (4 score passes, 9 permute / unpermute kernels); backward: the router's
    two gradient GEMMs and twice the streaming."""
    model = _moe()
    scores, rows = routing_bytes(model, C, 2)
    stream = (scores + rows) / RATES.hbm + 13 * RATES.op_latency
    rt = moe_routing_times(model, RATES, C, RATES.intra, RATES.intra)
    assert rt.fwd == pytest.approx(gemm_seconds(RATES, T, E, H) + stream)
    backward = gemm_seconds(RATES, T, H, E) + gemm_seconds(RATES, H, E, T) + 2 * stream
    assert rt.bwd == pytest.approx(backward)


def test_the_router_gemm_stays_16_bit_under_fp8() -> None:
    """The router is no TE module (moe_utils.py RouterGatingLinearFunction): under fp8 its GEMMs
    run at the 16-bit rate with 2-byte operands, so the routing costs what it costs in bf16,
    while an FP8 GEMM of the router's shape would be faster."""
    model, fp8 = _moe(), catalog_rates(H100, "fp8")
    rt8 = moe_routing_times(model, fp8, C, fp8.intra, fp8.intra)
    rt16 = moe_routing_times(model, RATES, C, RATES.intra, RATES.intra)
    assert (rt8.fwd, rt8.bwd) == (rt16.fwd, rt16.bwd)
    assert gemm16_seconds(fp8, T, E, H) == gemm_seconds(RATES, T, E, H)
    assert gemm16_seconds(fp8, T, E, H) > gemm_seconds(fp8, T, E, H)


def test_the_step_carries_the_routing_of_every_moe_layer() -> None:
    model = _moe()
    t = estimate_time(model, TrainingSpec(global_batch_size=8), C, H100, 8)
    rt = moe_routing_times(model, RATES, C, RATES.intra, RATES.intra)
    assert t.moe_routing == pytest.approx(
        C.num_microbatches * model.num_layers * (rt.fwd + rt.bwd)
    )
    dense = dataclasses.replace(model, moe=None)
    assert estimate_time(dense, TrainingSpec(global_batch_size=8), C, H100, 8).moe_routing == 0


def test_full_recompute_routes_the_rerun_forward_again() -> None:
    model = _moe()
    full = dataclasses.replace(C, recompute="full", recompute_method="uniform",
                               recompute_num_layers=1)  # fmt: skip
    t = TrainingSpec(global_batch_size=8)
    rt = moe_routing_times(model, RATES, C, RATES.intra, RATES.intra)
    extra = (
        estimate_time(model, t, full, H100, 8).moe_routing
        - estimate_time(model, t, C, H100, 8).moe_routing
    )
    assert extra == pytest.approx(C.num_microbatches * model.num_layers * rt.fwd)


def test_moe_layers_drop_the_dense_mlp_blocks_tp_traffic() -> None:
    """With TP 2 and SP, an MoE layer keeps the attention block's TP all-gather and
    reduce-scatter, but its routed experts gather over ETP only: half the dense layer's TP
    traffic. Shared experts (a TP-split MLP) bring the other half back."""
    model = dataclasses.replace(_moe(), num_layers=4)
    dense = dataclasses.replace(model, moe=None)
    c = ParallelConfig(tp=2, pp=2, sequence_parallel=True, micro_batch_size=1,
                       global_batch_size=8)  # fmt: skip
    t = TrainingSpec(global_batch_size=8)
    tp_dense = estimate_time(dense, t, c, H100, 8).tp_comm
    assert tp_dense > 0
    assert estimate_time(model, t, c, H100, 8).tp_comm == pytest.approx(tp_dense / 2)
    assert model.moe is not None
    shared = dataclasses.replace(
        model, moe=dataclasses.replace(model.moe, shared_expert_ffn_hidden_size=128)
    )
    assert estimate_time(shared, t, c, H100, 8).tp_comm == pytest.approx(tp_dense)
