"""The memory model against the published formula values and DeepSpeed's own estimators."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import (
    DEEPSPEED_ESTIMATOR,
    GIB,
    ZERO_PAPER,
    ModelStateBytes,
    estimate_memory,
    fits,
    layer_activations,
    model_state_bytes,
    padded_vocab,
    param_counts,
    zero_model_state_total,
)
from tuner.models.memory.terms import global_buffer_bytes
from tuner.spec.study import ModelSpec

A100 = get_gpu("a100-80gb")
MEGATRON_BF16 = ModelStateBytes(param=2, grad=4, grad_fp32=0, optimizer=12)  # 18 B/param


def korthikanti(layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
        num_attention_heads=heads, vocab_size=51200, seq_length=2048,
        flash_attention=False, dropout=True,
    )  # fmt: skip


# Korthikanti et al. 2022 Figure 1 (reference/memory-and-time-formulas.md), GiB per GPU.
FIG1 = [
    # name, L, h, a, t, p, v, b, states, TP-only activations, TP+SP+selective activations
    ("22B", 48, 6144, 64, 8, 1, 1, 4, 45.5625, 59.25, 9.5625),
    ("175B", 96, 12288, 96, 8, 8, 3, 1, 45.5625, 66.84375, 12.3515625),
    ("530B", 105, 20480, 128, 8, 35, 3, 1, 31.640625, 114.0234375, 23.076171875),
    ("1T", 128, 25600, 160, 8, 64, 1, 1, 32.958984375, 131.25, 26.5625),
]


@pytest.mark.parametrize("case", FIG1, ids=[c[0] for c in FIG1])
def test_korthikanti_figure1(case: tuple) -> None:
    _, L, h, a, t, p, v, b, states, tp_only, sp_sel = case
    model = korthikanti(L, h, a)
    # Figure 1 counts 12 L h^2 parameters per model (embeddings excluded) at 18 B each.
    psi = 12 * L * h * h / (t * p)
    assert sum(model_state_bytes(psi, 1, 0, MEGATRON_BF16)) / GIB == pytest.approx(
        states, rel=1e-3
    )
    gbs = b * p * 4  # enough micro-batches that 1F1B holds p of them on the first stage
    base = ParallelConfig(tp=t, pp=p, vp=v, micro_batch_size=b, global_batch_size=gbs)
    got = estimate_memory(model, base, A100)
    first = got if got.stage == 0 else None
    assert first is not None
    assert first.activations / GIB == pytest.approx(tp_only, rel=1e-3)
    sel = ParallelConfig(
        tp=t, pp=p, vp=v, micro_batch_size=b, global_batch_size=gbs,
        sequence_parallel=True, recompute="selective",
    )  # fmt: skip
    got = estimate_memory(model, sel, A100)
    stage0 = got if got.stage == 0 else None
    if stage0 is None:  # the last stage won on logits: recompute the first stage's activations
        pytest.fail("expected the first stage to be the most loaded")
    assert stage0.activations / GIB == pytest.approx(sp_sel, rel=1e-3)


# Korthikanti Figure 7: activation memory relative to the TP-only baseline, %. The values were
# read off the bar chart (as hard-coded in Calculon): up to +-0.2 point of reading error.
FIG7 = [
    ("22B", 48, 6144, 64, 66.84, 49.42, 16.18, 7.64),
    ("175B", 96, 12288, 96, 62.04, 56.53, 18.49, 8.71),
    ("530B", 105, 20480, 128, 58.31, 62.04, 20.27, 9.42),
]


@pytest.mark.parametrize("case", FIG7, ids=[c[0] for c in FIG7])
def test_korthikanti_figure7_ratios(case: tuple) -> None:
    _, L, h, a, sp, sel, sp_sel, full = case
    act = layer_activations(korthikanti(L, h, a), 1, 1, "bf16")
    base = act.stored(8, False, "none")
    assert 100 * act.stored(8, True, "none") / base == pytest.approx(sp, abs=0.2)
    assert 100 * act.stored(8, False, "selective") / base == pytest.approx(sel, abs=0.2)
    assert 100 * act.stored(8, True, "selective") / base == pytest.approx(sp_sel, abs=0.2)
    assert 100 * act.stored(8, False, "full") / base == pytest.approx(full, abs=0.2)


@pytest.mark.parametrize(("stage", "expected_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_worked_example(stage: int, expected_gb: float) -> None:
    # ZeRO paper Figure 1: Psi = 7.5B, Nd = 64, K = 12 (GB = 1e9 bytes, one decimal).
    got = zero_model_state_total(7.5e9, 64, stage, ZERO_PAPER) / 1e9
    assert got == pytest.approx(expected_gb, abs=0.05)


ZERO_TABLE = [  # ZeRO paper Table 1 (Psi = 7.5B): Nd, P_os, P_os+g, P_os+g+p in GB
    (4, 52.5, 41.3, 30.0),
    (16, 35.6, 21.6, 7.5),
    (256, 30.4, 15.4, 0.47),
    (1024, 30.1, 15.1, 0.12),
]


@pytest.mark.parametrize("row", ZERO_TABLE)
def test_zero_paper_table1(row: tuple) -> None:
    nd, os_, osg, osgp = row
    for stage, expected in ((1, os_), (2, osg), (3, osgp)):
        got = zero_model_state_total(7.5e9, nd, stage, ZERO_PAPER) / 1e9
        assert got == pytest.approx(expected, rel=0.01, abs=0.05)


def _deepspeed_zero_modules() -> tuple:
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install '.[train]')")
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    return stage_1_and_2, stage3


@pytest.mark.torch
@pytest.mark.parametrize("psi", [1.3e9, 6.7e9, 70e9])
@pytest.mark.parametrize(("gpus", "nodes"), [(8, 1), (8, 4), (4, 16)])
def test_deepspeed_zero2_estimator(psi: float, gpus: int, nodes: int) -> None:
    z2, _ = _deepspeed_zero_modules()
    _, expected = z2.estimate_zero2_model_states_mem_needs(
        total_params=int(psi), num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=False
    )
    got = zero_model_state_total(psi, gpus * nodes, 2, DEEPSPEED_ESTIMATOR)
    assert got == pytest.approx(expected, rel=0.01)
    # The printed "all_cold" table (GB, 2 decimals) agrees too.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        z2.estimate_zero2_model_states_mem_needs_all_cold(
            total_params=int(psi), num_gpus_per_node=gpus, num_nodes=nodes
        )
    printed = re.findall(r"([\d.]+)GB \|\s+([\d.]+)GB \| offload_optimizer=none", out.getvalue())
    assert printed, out.getvalue()
    assert got / GIB == pytest.approx(float(printed[0][1]), rel=0.01)


@pytest.mark.torch
@pytest.mark.parametrize(("psi", "largest"), [(2.851e9, 32.9e6), (13e9, 0.2e9), (70e9, 1.0e9)])
@pytest.mark.parametrize(("gpus", "nodes"), [(8, 1), (8, 8)])
def test_deepspeed_zero3_estimator(psi: float, largest: float, gpus: int, nodes: int) -> None:
    _, z3 = _deepspeed_zero_modules()
    _, expected, _ = z3.estimate_zero3_model_states_mem_needs(
        total_params=int(psi), largest_layer_params=int(largest), num_gpus_per_node=gpus,
        num_nodes=nodes, cpu_offload=False, cpu_offload_params=False,
    )  # fmt: skip
    got = zero_model_state_total(psi, gpus * nodes, 3, DEEPSPEED_ESTIMATOR, largest)
    assert got == pytest.approx(expected, rel=0.01)


def test_param_count_gpt3_and_llama() -> None:
    gpt3 = ModelSpec(
        num_layers=96, hidden_size=12288, ffn_hidden_size=49152, num_attention_heads=96,
        vocab_size=50257, seq_length=2048,
    )  # fmt: skip
    total = param_counts(gpt3).total(96, padded_vocab(50257, 1, "megatron"), tied=True)
    assert total / 1e9 == pytest.approx(174.6, rel=0.01)  # Narayanan et al. Table 1: 174.6B
    llama = ModelSpec(
        num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
        num_query_groups=8, vocab_size=32000, seq_length=4096, swiglu=True,
        tied_embeddings=False, normalization="rmsnorm", position_embedding="rope",
        add_bias_linear=False,
    )  # fmt: skip
    total = param_counts(llama).total(80, 32000, tied=False)
    assert total / 1e9 == pytest.approx(68.98, rel=0.005)  # Llama-2-70B: 68,976,648,192


def test_vocab_padding() -> None:
    assert padded_vocab(50257, 1, "megatron") == 50304
    assert padded_vocab(50257, 8, "megatron") == 51200
    assert padded_vocab(50257, 8, "deepspeed") == 50257


LLAMA70 = ModelSpec(
    num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
    num_query_groups=8, vocab_size=32000, seq_length=4096, swiglu=True, tied_embeddings=False,
    normalization="rmsnorm", position_embedding="rope", dropout=False, add_bias_linear=False,
)  # fmt: skip
H100 = get_gpu("h100-sxm-80gb")


def cfg(**kw: object) -> ParallelConfig:
    base: dict[str, object] = dict(tp=8, pp=4, dp=16, micro_batch_size=1, global_batch_size=1024)
    base.update(kw)
    return ParallelConfig(**base)  # type: ignore[arg-type]


def test_recompute_orders_activation_memory() -> None:
    none = estimate_memory(LLAMA70, cfg(), H100).activations
    sel = estimate_memory(LLAMA70, cfg(recompute="selective"), H100).activations
    full = estimate_memory(
        LLAMA70, cfg(recompute="full", recompute_method="uniform", recompute_num_layers=1), H100
    ).activations
    assert full < sel <= none
    # With FlashAttention there is no score matrix, so selective saves only the LSE bytes.
    assert sel == pytest.approx(none, rel=0.01)


def test_activation_share_is_the_activations_part_of_the_allocated_peak() -> None:
    none = estimate_memory(LLAMA70, cfg(), H100)
    w = none.worst
    assert none.activation_share == pytest.approx((w.activations + w.stage_extras) / w.allocated)
    full = estimate_memory(
        LLAMA70, cfg(recompute="full", recompute_method="uniform", recompute_num_layers=1), H100
    )
    assert 0 < full.activation_share < none.activation_share < 1


def test_full_recompute_block_between_none_and_all_layers() -> None:
    def act(n: int) -> float:
        c = cfg(recompute="full", recompute_method="block", recompute_num_layers=n)
        return estimate_memory(LLAMA70, c, H100).activations

    none = estimate_memory(LLAMA70, cfg(), H100).activations
    assert act(20) < act(10) < act(1) < none


def test_distributed_optimizer_and_sequence_parallel_reduce_memory() -> None:
    plain = estimate_memory(LLAMA70, cfg(), H100)
    dist = estimate_memory(LLAMA70, cfg(distributed_optimizer=True), H100)
    assert dist.optimizer == pytest.approx(plain.optimizer / 16)
    assert dist.weights == plain.weights and dist.grads == plain.grads
    sp = estimate_memory(LLAMA70, cfg(sequence_parallel=True), H100)
    assert sp.activations < plain.activations


def test_pipeline_in_flight_and_interleave() -> None:
    few = estimate_memory(LLAMA70, cfg(global_batch_size=32), H100)  # m = 2 < p = 4
    assert few.in_flight == 2
    many = estimate_memory(LLAMA70, cfg(), H100)
    assert many.in_flight == 4
    inter = estimate_memory(LLAMA70, cfg(vp=2), H100)
    assert inter.activations == pytest.approx(many.activations * (1 + 3 / 8))


def test_last_stage_wins_with_big_vocab_and_no_pipeline_overlap() -> None:
    # Llama 3's 128K vocabulary at tp=1: the last stage's fp32 logits dominate at m < p.
    model = ModelSpec(
        num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
        num_query_groups=8, vocab_size=128256, seq_length=8192, swiglu=True,
        tied_embeddings=False, dropout=False,
    )  # fmt: skip
    c = ParallelConfig(tp=1, pp=4, dp=2, micro_batch_size=4, global_batch_size=8)
    got = estimate_memory(model, c, H100)
    assert got.stage == 3
    assert got.stage_extras > 6 * 8192 * 4 * 128256 * 0.99


def test_context_parallel_splits_activations() -> None:
    one = estimate_memory(LLAMA70, cfg(dp=16), H100).activations
    two = estimate_memory(LLAMA70, cfg(cp=2, dp=8), H100).activations
    assert two == pytest.approx(one / 2, rel=0.01)


def test_deepspeed_zero_stages_shrink_model_states() -> None:
    gpt = ModelSpec(
        num_layers=24, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
        vocab_size=50257, seq_length=2048,
    )  # fmt: skip
    states = []
    for z in range(4):
        c = ParallelConfig(dp=8, micro_batch_size=1, global_batch_size=8, zero_stage=z)
        m = estimate_memory(gpt, c, H100, "deepspeed")
        states.append(m.weights + m.grads + m.optimizer)
    assert states[0] > states[1] > states[2] > states[3]


def test_peak_includes_documented_overheads_and_fits() -> None:
    m = estimate_memory(LLAMA70, cfg(distributed_optimizer=True, sequence_parallel=True), H100)
    assert m.peak > m.allocated
    assert m.peak - m.allocated == pytest.approx(m.fragmentation + m.cuda_context + m.comm_buffers)
    assert fits(m, H100, 0.92)
    d = m.to_dict()
    assert set(d) >= {"weights", "grads", "optimizer", "activations", "peak_gib"}
    tiny = get_gpu("h100-sxm-80gb", memory_gib=8.0)
    assert not fits(m, tiny, 0.92)


# Measured on the demo study's workload (workloads/gpt_deepspeed.py, L=4 h=256 a=4 ffn=1024
# s=256 v=4096 untied, fp32, DeepSpeed 0.19.8 on 2 CPU ranks, dp=2 at pp=1): the largest
# tuner-step max_allocated_gib of the run. (pp, micro-batch, ZeRO stage, recompute, GiB)
DEMO_MEASURED = [
    (1, 2, 3, "none", 0.1009), (1, 1, 0, "none", 0.0994), (2, 1, 0, "full", 0.0441),
    (2, 1, 0, "none", 0.0558), (1, 1, 2, "none", 0.1002), (2, 2, 1, "none", 0.0815),
    (2, 1, 1, "full", 0.0541), (1, 1, 3, "full", 0.0652), (1, 2, 2, "none", 0.1203),
    (1, 2, 0, "none", 0.1194), (1, 1, 1, "none", 0.0895),
]  # fmt: skip


@pytest.mark.parametrize("case", DEMO_MEASURED, ids=lambda c: f"pp{c[0]}-mbs{c[1]}-z{c[2]}-{c[3]}")
def test_demo_deepspeed_runs_within_25_percent(case: tuple) -> None:
    pp, mbs, zero, rc, measured = case
    model = ModelSpec(num_layers=4, hidden_size=256, num_attention_heads=4, ffn_hidden_size=1024,
                      seq_length=256, vocab_size=4096, tied_embeddings=False, dropout=False,
                      flash_attention=True)  # fmt: skip
    config = ParallelConfig(
        pp=pp, dp=2 // pp, micro_batch_size=mbs, global_batch_size=8, zero_stage=zero,
        recompute=rc, recompute_method="uniform" if rc == "full" else None,
        recompute_num_layers=1 if rc == "full" else None,
    )  # fmt: skip
    peak = estimate_memory(model, config, get_gpu("cpu"), "deepspeed", "fp32").peak / GIB
    assert peak == pytest.approx(measured, rel=0.25)


def test_sequence_parallel_output_layer_gathers_into_megatrons_global_buffer() -> None:
    """Megatron's output layer (tensor_parallel ColumnParallelLinear) all-gathers its
    sequence-parallel input into the global memory buffer, kept for the whole run: s/cp x b x h x
    e on the last stage = 128 x 2 x 64 x 2 = 32768 B; none on other stages, without SP, at
    tp = 1 (Megatron turns SP off), or outside Megatron-core; a larger MoE gather takes the
    same tensor."""
    tiny = ModelSpec(
        name="t", num_layers=4, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
        vocab_size=512, seq_length=128,
    )  # fmt: skip
    sp = ParallelConfig(tp=2, pp=2, micro_batch_size=2, global_batch_size=8,
                        sequence_parallel=True)  # fmt: skip
    assert global_buffer_bytes(tiny, sp, 1, "bf16", 0.0) == 32768
    assert global_buffer_bytes(tiny, sp, 0, "bf16", 0.0) == 0.0
    assert global_buffer_bytes(tiny, sp, 1, "fp32", 0.0) == 65536
    assert global_buffer_bytes(tiny, sp, 1, "bf16", 40000.0) == 40000.0  # max, one tensor
    no_sp = ParallelConfig(tp=2, pp=2, micro_batch_size=2, global_batch_size=8)
    assert global_buffer_bytes(tiny, no_sp, 1, "bf16", 0.0) == 0.0
    a100 = get_gpu("a100-80gb")
    with_sp, without = (estimate_memory(tiny, x, a100).stages for x in (sp, no_sp))
    assert with_sp[1].phases[1].workspaces - without[1].phases[1].workspaces == 32768
    assert with_sp[0].phases[1].workspaces == without[0].phases[1].workspaces
    ds = estimate_memory(tiny, sp, a100, "megatron-deepspeed").stages[1].phases[1]
    ds_no = estimate_memory(tiny, no_sp, a100, "megatron-deepspeed").stages[1].phases[1]
    assert ds.workspaces == ds_no.workspaces
