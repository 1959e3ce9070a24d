"""DeepSpeed-MoE (framework deepspeed): its rules with DeepSpeed's messages, the workload's flags,
and the memory and time terms against the workload's own parameters and a measured run."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.config.rules import validate
from tuner.errors import ConfigError
from tuner.launch.megatron_flags import deepspeed_moe_flags, moe_flags
from tuner.launch.templates import render_launch
from tuner.models.memory.estimate import estimate_memory
from tuner.models.moe import expert_params_per_layer, framework_moe, nonexpert_delta_per_layer
from tuner.models.time.estimate import estimate_time
from tuner.spec.file import load_study, study_from_mapping
from tuner.spec.moe import MoESpec
from tuner.spec.study import ModelSpec, TrainingSpec

REPO = Path(__file__).resolve().parents[1]
DEMO_MOE = REPO / "tuner" / "studies" / "demo-moe.yaml"
CPU = get_gpu("cpu")

# The demo-moe model: GELU experts with biases, 4 experts, top-2, capacity factor 1.
MOE = MoESpec(num_experts=4, router_topk=2, capacity_factor=1.0, aux_loss_coeff=0.01,
              grouped_gemm=False)  # fmt: skip
MODEL = ModelSpec(
    num_layers=2, hidden_size=128, num_attention_heads=4, ffn_hidden_size=512, seq_length=128,
    vocab_size=1024, tied_embeddings=False, dropout=False, flash_attention=True, moe=MOE,
)  # fmt: skip


def cfg(**changes: Any) -> ParallelConfig:
    base: dict[str, Any] = {"dp": 2, "ep": 2, "micro_batch_size": 1, "global_batch_size": 4,
                            "zero_stage": 1}  # fmt: skip
    return ParallelConfig(**{**base, **changes})


def rules(config: ParallelConfig, model: ModelSpec = MODEL, world: int = 2) -> dict[str, str]:
    return {v.rule: v.message for v in validate(config, model, world, "deepspeed")}


# ----------------------------------------------------------------------------- per-config rules


def test_a_valid_deepspeed_moe_config_breaks_no_rule() -> None:
    assert rules(cfg()) == {}
    assert rules(cfg(ep=1, zero_stage=2, micro_batch_size=2, global_batch_size=4)) == {}


@pytest.mark.parametrize(
    ("changes", "world", "rule", "words"),
    [
        ({"ep": 3, "dp": 3, "global_batch_size": 3}, 3, "experts_ep",
         "Number of experts (4) should be divisible by expert parallel size (3)"),
        ({"ep": 4, "dp": 2}, 2, "ep_dp", "2 is not divisible by 4"),
        ({"zero_stage": 3}, 2, "moe_zero3",
         "Native DeepSpeed MoE is not supported with ZeRO Stage 3"),
        ({"pp": 2, "dp": 1, "ep": 1}, 2, "moe_pipeline", "run without pipeline stages (pp=2)"),
        ({"etp": 2}, 2, "deepspeed_etp", "no expert tensor parallelism (etp=2)"),
        ({"moe_token_dispatcher": "allgather"}, 2, "deepspeed_dispatcher",
         "one all-to-all dispatcher (moe_token_dispatcher=allgather)"),
    ],
)  # fmt: skip
def test_deepspeed_moe_rules_name_every_factor(
    changes: dict[str, Any], world: int, rule: str, words: str
) -> None:
    broken = rules(cfg(**changes), world=world)
    assert rule in broken and words in broken[rule], broken
    assert "\n" not in broken[rule]


def test_top1_needs_as_many_tokens_as_the_min_capacity() -> None:
    top1 = dataclasses.replace(MOE, router_topk=1, router_pre_softmax=True, min_capacity=256)
    model = dataclasses.replace(MODEL, moe=top1)
    broken = rules(cfg(), model)  # 1 x 128 tokens per rank < 256
    assert "(tokens=128, min_capacity=256)" in broken["moe_min_capacity"]
    assert "moe_min_capacity" not in rules(cfg(micro_batch_size=2, global_batch_size=4), model)


def test_ep_on_a_dense_deepspeed_model_is_refused() -> None:
    broken = rules(cfg(), dataclasses.replace(MODEL, moe=None))
    assert "ep_size (2) > 1 needs model.moe" in broken["ep_needs_moe"]


def test_the_messages_are_deepspeeds_own() -> None:
    """The quoted words are in DeepSpeed's source (the installed 0.19.8)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or spec.origin is None:
        pytest.skip("deepspeed not installed")
    root = Path(spec.origin).parent
    assert "should be divisible by expert parallel size" in (root / "moe/layer.py").read_text()
    engine = (root / "runtime/engine.py").read_text()  # the message is split over two lines
    assert '"Native DeepSpeed MoE is not supported with ZeRO Stage 3. "' in engine
    assert '"Use AutoEP or choose ZeRO stage 1/2."' in engine
    assert (
        "No. of tokens (batch-size) should be greater than min_capacity"
        in (root / "moe/sharded_moe.py").read_text()
    )
    assert "is not divisible by" in (root / "utils/groups.py").read_text()


# ----------------------------------------------------------------------------- study-wide rules


def deepspeed_study(**moe: Any) -> dict[str, Any]:
    return {
        "name": "dsmoe",
        "model": {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                  "ffn_hidden_size": 512, "seq_length": 128, "vocab_size": 1024,
                  "tied_embeddings": False,
                  "moe": {"num_experts": 4, "grouped_gemm": False, **moe}},
        "training": {"global_batch_size": 4, "precision": "fp32"},
        "cluster": {"gpu": "cpu", "gpus_per_node": 2, "num_nodes": 1, "executor": "local"},
        "framework": "deepspeed",
        "launch": {"template": "deepspeed_gpt", "script": "t.py"},
        "space": {"ep": [1, 2]},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("moe", "space", "path", "words"),
    [
        ({"shared_expert_ffn_hidden_size": 256}, {}, "model.moe.shared_expert_ffn_hidden_size",
         "DeepSpeed-MoE has no shared experts"),
        ({"router_dtype": "fp64"}, {}, "model.moe.router_dtype",
         "TopKGate computes the gate in fp32"),
        ({"grouped_gemm": True}, {}, "model.moe.grouped_gemm", "set grouped_gemm: false"),
        ({"permute_fusion": True}, {}, "model.moe.permute_fusion", "Transformer Engine's"),
        ({}, {"etp": [2]}, "space.etp", "no expert tensor parallelism"),
        ({}, {"moe_token_dispatcher": ["allgather"]}, "space.moe_token_dispatcher",
         "one all-to-all over the EP group"),
    ],
)  # fmt: skip
def test_fields_deepspeed_moe_lacks_are_refused_by_name(
    moe: dict[str, Any], space: dict[str, Any], path: str, words: str
) -> None:
    data = deepspeed_study(**moe)
    data["space"].update(space)
    with pytest.raises(ConfigError) as info:
        study_from_mapping(data)
    assert info.value.path == path and words in str(info.value)
    assert "\n" not in str(info.value)


def test_min_capacity_is_deepspeeds_only() -> None:
    assert study_from_mapping(deepspeed_study(min_capacity=8)).model.moe is not None
    data = deepspeed_study(min_capacity=8)
    data.update(framework="megatron", launch={"template": "megatron_gpt", "megatron_path": "/m"})
    with pytest.raises(ConfigError) as info:
        study_from_mapping(data)
    assert info.value.path == "model.moe.min_capacity"


# ----------------------------------------------------------------------------- launch


def test_workload_flags_carry_the_moe_section_and_ep() -> None:
    words = [w for flag in deepspeed_moe_flags(MODEL, cfg()) for w in flag]
    assert words == [
        "--num-experts", "4", "--ep-size", "2", "--moe-router-topk", "2",
        "--moe-ffn-hidden-size", "512", "--moe-min-capacity", "4", "--moe-layer-freq", "1",
        "--moe-capacity-factor", "1.0", "--moe-aux-loss-coeff", "0.01",
    ]  # fmt: skip
    pattern = dataclasses.replace(MODEL, moe=dataclasses.replace(MOE, layer_freq="([0]*1+[1]*1)"))
    assert ("--moe-layer-freq", "[0,1]") in deepspeed_moe_flags(pattern, cfg())
    assert moe_flags(MODEL, cfg(), "deepspeed") == deepspeed_moe_flags(MODEL, cfg())
    assert deepspeed_moe_flags(dataclasses.replace(MODEL, moe=None), cfg(ep=1)) == []


def test_the_demo_moe_script_passes_the_flags_to_the_workload() -> None:
    spec = load_study(str(DEMO_MOE))
    rendered = render_launch(spec, cfg(), hosts=["local-0"], master_addr="127.0.0.1",
                             master_port=29500, trial_dir="/t")  # fmt: skip
    script = rendered.scripts[0]
    assert "  --num-experts 4\n  --ep-size 2\n" in script
    assert "--moe-aux-loss-coeff 0.01" in script
    assert '"stage": 1' in rendered.files["ds_config.json"]


# ----------------------------------------------------------------------------- models


def _workload(name: str) -> Any:
    """A module of workloads/, imported as gpt_deepspeed.py imports its siblings: by name, with
    their directory on sys.path (a script's own directory is there when it runs)."""
    workloads = str(REPO / "workloads")
    if workloads not in sys.path:
        sys.path.insert(0, workloads)
    return importlib.import_module(name)


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_expert_and_router_params_are_the_workloads(ep: int) -> None:
    pytest.importorskip("deepspeed")
    w, a = _workload("gpt_deepspeed_model"), _workload("gpt_deepspeed_args")
    args = a.parse_args(["--deepspeed_config", "unused", "--num-layers", "2", "--hidden-size",
                         "128", "--ffn-hidden-size", "512", "--num-experts", "4", "--ep-size",
                         str(ep)])  # fmt: skip
    from deepspeed.moe.utils import is_moe_param

    shape = a.model_shape(args)
    block, dense = w.MoEBlock(shape), w.Block(shape)
    experts = sum(p.numel() for p in block.parameters() if is_moe_param(p))
    others = sum(p.numel() for p in block.parameters() if not is_moe_param(p))
    c = cfg(ep=ep, dp=4, global_batch_size=4)
    assert expert_params_per_layer(MODEL, c) == experts
    assert nonexpert_delta_per_layer(MODEL, c) == others - sum(
        p.numel() for p in dense.parameters()
    )


def test_deepspeed_pads_to_capacity_with_the_min_capacity_floor() -> None:
    ds = framework_moe(MODEL, cfg(), "deepspeed").moe
    assert ds is not None and ds.pad_to_capacity and not ds.grouped_gemm
    assert ds.router_dtype == "fp32" and ds.capacity_factor == 1.0
    # 1 x 128 tokens x top-2 over 4 experts: 64 a expert; min_capacity 128 doubles it
    floor = dataclasses.replace(MODEL, moe=dataclasses.replace(MOE, min_capacity=128))
    floored = framework_moe(floor, cfg(), "deepspeed").moe
    assert floored is not None and floored.capacity_factor == 2.0
    assert framework_moe(MODEL, cfg(), "megatron") is MODEL


# Measured: make demo-moe (studies/demo-moe.yaml, DeepSpeed 0.19.8, 2 CPU ranks, ZeRO-1), the
# tuner-memory line of rank 0: (ep, micro-batch, params, grads, optimizer) bytes.
DEMO_MOE_MEASURED = [
    (2, 2, 3759104, 3759104, 8799752), (2, 1, 3759104, 3759104, 8799752),
    (1, 2, 5866496, 5866496, 8799752), (1, 1, 5866496, 5866496, 8799752),
]  # fmt: skip


@pytest.mark.parametrize("case", DEMO_MOE_MEASURED, ids=lambda c: f"ep{c[0]}-mbs{c[1]}")
def test_expert_states_shard_over_the_expert_data_parallel_group(case: tuple) -> None:
    """ep 2 holds half the experts, unsharded (expert-DP 1); ep 1 all of them, their Adam states
    split over 2 ranks: the same optimizer bytes, as the workload measured."""
    ep, mbs, params, grads, optimizer = case
    c = cfg(ep=ep, micro_batch_size=mbs)
    step = estimate_memory(MODEL, c, CPU, "deepspeed", "fp32").stages[0].phases[1]
    assert step.weights == params and step.grads == grads
    # Adam's per-tensor step counters: 4 bytes for each of ZeRO-1's two flat groups
    assert step.optimizer == optimizer - 2 * 4


def test_time_has_an_all_to_all_only_with_ep() -> None:
    train = TrainingSpec(global_batch_size=4, precision="fp32")
    ep1 = estimate_time(MODEL, train, cfg(ep=1), CPU, 2, "deepspeed")
    ep2 = estimate_time(MODEL, train, cfg(ep=2), CPU, 2, "deepspeed")
    assert ep1.ep_comm == 0.0 < ep2.ep_comm
    assert ep2.dp_comm < ep1.dp_comm  # ep 2: no expert gradients to reduce (expert-DP 1)
    zero2 = estimate_time(MODEL, train, cfg(ep=1, zero_stage=2), CPU, 2, "deepspeed")
    assert zero2.step > 0
