"""What each selective-recompute module drops from the saved activations, worked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import estimate_memory
from tuner.models.memory.recompute import selective_activations
from tuner.models.memory.terms import layer_activations
from tuner.models.moe import moe_layer_activations
from tuner.spec.moe import MoESpec
from tuner.spec.study import ModelSpec

H100 = get_gpu("h100-sxm-80gb")

# tests/test_moe.py's small MoE: h 64, 4 heads, seq 128, SwiGLU, 4 experts of width 128, top-2,
# no dropout, no biases, both layers MoE.
SMALL = ModelSpec(
    num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, vocab_size=1000,
    seq_length=128, swiglu=True, tied_embeddings=False, normalization="rmsnorm",
    position_embedding="rope", dropout=False, add_bias_linear=False,
    moe=MoESpec(num_experts=4, router_topk=2, ffn_hidden_size=128),
)  # fmt: skip

# One MoE layer, one micro-batch, tp = ep = 1, bf16 (2 B), by hand:
#   tokens 128; routed assignments 128 x top-2 = 256
#   moe_act:   fc2's input per routed token, 256 x 128 x 2 B                       = 65,536
#   layernorm: the pre-MLP norm output, 128 x 64 x 2 B                             = 16,384
#   moe:       router 128 x 4 experts x (2 B scores + 1 B map)                     =  1,536
#              + per routed token: dispatched input 64 x 2, fc1 out 256 x 2,
#                fc2 in 128 x 2, its prob 2, index 4 = 902 B x 256                 = 230,912
MOE_ACT, LAYERNORM, MOE = 65_536.0, 16_384.0, 1_536.0 + 230_912.0


def sel(*modules: str, **kw: object) -> ParallelConfig:
    return ParallelConfig(recompute="selective", recompute_modules=modules, **kw)  # type: ignore[arg-type]


def drops(c: ParallelConfig, model: ModelSpec = SMALL, fp8: bool = False) -> tuple[float, float]:
    """(bytes one rank no longer keeps for one layer, bytes it rebuilds in backward)."""
    dense = layer_activations(model, c.micro_batch_size, c.cp, "bf16")
    act = moe_layer_activations(model, c, "bf16", dense) if model.moe else dense
    out, rebuilt = selective_activations(model, c, act, 1.0 if model.moe else 0.0, "bf16", fp8)
    none = "none"
    return act.stored(c.tp, c.sequence_parallel, none) - out.stored(
        c.tp, c.sequence_parallel, none
    ), rebuilt


def test_each_module_of_one_small_moe_layer() -> None:
    assert drops(sel("moe_act")) == (MOE_ACT, MOE_ACT)
    assert drops(sel("layernorm")) == (LAYERNORM, LAYERNORM)
    assert drops(sel("moe")) == (MOE, MOE)
    assert drops(sel("layernorm", "moe")) == (LAYERNORM + MOE, LAYERNORM + MOE)
    # moe holds moe_act: nothing is counted twice
    assert drops(sel("moe", "moe_act")) == drops(sel("moe"))
    # core_attn alone changes nothing here (it is LayerActivations.scores, as before)
    assert drops(sel("core_attn")) == (0.0, 0.0)
    # FP8: fc2's input was its 1-byte copy (tuner.models.memory.fp8), so that is what goes
    assert drops(sel("moe_act"), fp8=True)[0] == MOE_ACT / 2
    # GeLU: the checkpointed activation's output and the probs-weighted product (fc2's input)
    # both go, 256 routed x 128 x (2 + 2) B
    gelu = dataclasses.replace(SMALL, swiglu=False)
    assert drops(sel("moe_act"), gelu) == (131_072.0, 131_072.0)


def test_moe_drops_exactly_what_the_moe_block_adds() -> None:
    """The moe region is tuner.models.moe's MoE terms: the layer less them is the dense layer
    without its MLP."""
    c = sel("moe")
    dense = layer_activations(SMALL, 1, 1, "bf16")
    moe = moe_layer_activations(SMALL, c, "bf16", dense)
    dense_mlp = 128 * 256 * 3 * 2.0  # [K] SwiGLU intermediates, 6 s b F
    assert moe.sharded - (dense.sharded - dense_mlp) == pytest.approx(MOE)


def test_shared_experts_and_the_dense_mlp() -> None:
    shared = dataclasses.replace(SMALL, moe=dataclasses.replace(
        SMALL.moe, shared_expert_ffn_hidden_size=256))  # type: ignore[arg-type]  # fmt: skip
    inter = 128 * 256 * 3 * 2.0  # fc1 out (2 x 256) + fc2 in (256), 2 B, 128 tokens
    assert drops(sel("shared_experts"), shared) == (inter, inter)
    assert drops(sel("moe"), shared)[0] == pytest.approx(MOE + inter)
    dense = dataclasses.replace(SMALL, moe=None)
    # mlp: fc1's input (128 x 64 x 2 B) + intermediates 128 x 256 x 3 x 2 B
    assert drops(sel("mlp"), dense) == (16_384.0 + 196_608.0,) * 2


def test_tensor_and_sequence_parallel_divide_the_drops() -> None:
    c = sel("layernorm", "moe_act", tp=2, sequence_parallel=True, dp=1)
    saved, rebuilt = drops(c)
    # SP splits the norm output over tp; each rank's experts see their ETP share (etp = tp):
    # tuner.models.moe expert_tokens = 64 tokens x top-2 x etp 2 = 256, of width 128 / 2
    assert saved == pytest.approx(LAYERNORM / 2 + MOE_ACT / 2)
    assert rebuilt == saved


def test_per_stage_only_moe_stages_change() -> None:
    """pp = 2, layer 0 MoE and layer 1 dense: moe_act lowers stage 0 only. Stage 0 holds two
    micro-batches (1F1B warm-up, pp - stage) of its MoE layer and rebuilds one layer's fc2
    inputs in backward: 2 x 65,536 - 65,536 fewer bytes at its peak."""
    model = dataclasses.replace(SMALL, moe=dataclasses.replace(
        SMALL.moe, layer_freq="[1,0]"))  # type: ignore[arg-type]  # fmt: skip
    base = ParallelConfig(pp=2, recompute="selective", global_batch_size=4)
    with_act = dataclasses.replace(base, recompute_modules=("core_attn", "moe_act"))
    a, b = (estimate_memory(model, c, H100).stages for c in (base, with_act))
    assert a[0].in_flight == 2
    assert a[0].phases[0].activations - b[0].phases[0].activations == pytest.approx(MOE_ACT)
    assert a[1].phases[0].activations == b[1].phases[0].activations
