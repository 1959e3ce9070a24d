"""Per-stage layer counts as the frameworks compute them, and the schedules' in-flight counts.

DeepSpeed cases use the installed DeepSpeed's own ``partition_uniform`` / ``partition_balanced``
and the repo workload's real layer classes as the oracle.
"""

from __future__ import annotations

import copy
import importlib
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner.config import pipeline
from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import (
    chunk_layers,
    held_layer_microbatches,
    in_flight,
    in_flight_chunks,
    pipe_buffers,
    stage_holds,
    stage_layers,
)
from tuner.config.rules import validate
from tuner.errors import ConfigError
from tuner.launch.megatron_flags import megatron_split_flags
from tuner.models.time.estimate import estimate_time
from tuner.space.enumerate import config_from_settings, enumerate_space
from tuner.spec.deepspeed_partition import deepspeed_layer_params
from tuner.spec.file import study_from_mapping
from tuner.spec.pipeline_split import canonical_split, parse_split
from tuner.spec.study import ModelSpec, TrainingSpec

M30 = ModelSpec(
    num_layers=30, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
    vocab_size=32000, seq_length=1024,
)  # fmt: skip


def cfg(**kw: Any) -> ParallelConfig:
    base: dict[str, Any] = dict(pp=4, dp=1, micro_batch_size=1, global_batch_size=8)
    base.update(kw)
    return ParallelConfig(**base)


def model(layers: int, **kw: Any) -> ModelSpec:
    shape: dict[str, Any] = dict(
        num_layers=layers, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=4,
        vocab_size=5000, seq_length=128,
    )  # fmt: skip
    shape.update(kw)
    return ModelSpec(**shape)


# ----------------------------------------------------------------------------- Megatron-LM


@pytest.mark.parametrize(
    ("layers", "pp", "vp", "split", "expected"),
    [
        (30, 4, 1, "first=7,last=7", (7, 8, 8, 7)),  # the README's case
        (30, 4, 1, "first=6", (6, 8, 8, 8)),
        (30, 4, 1, "last=9", (7, 7, 7, 9)),
        (30, 4, 1, "embedding+loss", (7, 8, 8, 7)),  # (30 + 2) / 4 = 8, minus E and L
        (31, 4, 1, "embedding", (7, 8, 8, 8)),
        (10, 2, 1, "first=4,last=6", (4, 6)),
        (32, 4, 2, "first=6,last=6", (6, 10, 10, 6)),
        (7, 2, 2, "layout:Et|tt|ttt|tL", (4, 3)),  # rank 0: stages 0 and 2; rank 1: 1 and 3
        (24, 4, 1, "even", (6, 6, 6, 6)),
    ],
)
def test_megatron_stage_layers(
    layers: int, pp: int, vp: int, split: str, expected: tuple[int, ...]
) -> None:
    m = model(layers)
    c = cfg(pp=pp, vp=vp, pipeline_split=split, global_batch_size=8)
    assert validate(c, m, pp, "megatron") == []
    assert stage_layers(m, c, "megatron") == expected
    assert sum(expected) == layers


def test_megatron_chunks_interleaved_uneven() -> None:
    """32 layers, pp 4, vp 2, first = last = 6: the middle ranks get (32 - 12) / 2 = 10 layers,
    each rank splits its own count over its 2 chunks (transformer_block.py)."""
    c = cfg(vp=2, pipeline_split="first=6,last=6")
    assert chunk_layers(model(32), c, "megatron") == ((3, 3), (5, 5), (5, 5), (3, 3))
    # embedding accounted under vp: 34 / 4 is not whole -> refused; 30 + 2 = 32: 8 per rank, 4
    # per chunk, the first chunk of rank 0 and the last chunk of rank 3 give one to E / L
    c = cfg(vp=2, pipeline_split="embedding+loss")
    assert chunk_layers(model(30), c, "megatron") == ((3, 4), (4, 4), (4, 4), (4, 3))


@pytest.mark.parametrize(
    ("layers", "pp", "vp", "split", "rule", "message"),
    [
        (30, 4, 1, "first=7,last=8", "split_first_last",
         "number of layers at middle stage: 15 must be divisible bythe middle pipeline model "
         "parallel size 2"),
        (10, 2, 1, "first=4,last=5", "split_first_last",
         "Mismatch: 1 middle layers remaining but 0 middle PP stages available."),
        (32, 4, 2, "first=7,last=7", "split_vp",
         "number of layers at first stage: 7must be divisible by virtual pipelineparallel "
         "degree 2"),
        (30, 4, 1, "embedding", "split_account",
         "Number of layers should be divisible by the pipeline-model-parallel size"),
        (8, 2, 2, "layout:Et|tt|ttt|tL", "layout_layers",
         "Number of decoder layers 7must match num_layers 8"),
        (7, 2, 1, "layout:Et|tt|ttt|tL", "layout_vp", "but vp is 1"),
        (7, 4, 1, "layout:Et|ttt|tttL", "layout_pp",
         "The length of pipeline_model_parallel_layout must be divisible by "
         "pipeline_model_parallel_size (num_stages=3, args.pipeline_model_parallel_size=4)"),
        (30, 1, 1, "first=7", "split_needs_pp", "needs pipeline-model-parallel size > 1"),
        (30, 4, 1, "parameters", "split_framework", "is a deepspeed setting"),
        (30, 4, 1, "even", "layers_pp", "num_layers (30) is not divisible"),
    ],
)  # fmt: skip
def test_megatron_refuses_what_it_would_not_build(
    layers: int, pp: int, vp: int, split: str, rule: str, message: str
) -> None:
    c = cfg(pp=pp, vp=vp, pipeline_split=split)
    errors = validate(c, model(layers), pp, "megatron")
    assert [e.rule for e in errors] == [rule], errors
    assert message in errors[0].message


def test_megatron_flags_for_each_split() -> None:
    c = cfg(pipeline_split="first=7,last=7")
    assert megatron_split_flags(c, 30) == [
        ("--decoder-first-pipeline-num-layers", "7"),
        ("--decoder-last-pipeline-num-layers", "7"),
    ]
    # arguments.py refuses --num-layers-per-virtual-pipeline-stage with first/last counts
    c = cfg(vp=2, pipeline_split="first=6,last=6")
    assert ("--num-virtual-stages-per-pipeline-rank", "2") in megatron_split_flags(c, 32)
    assert megatron_split_flags(cfg(pipeline_split="embedding+loss"), 30) == [
        ("--account-for-embedding-in-pipeline-split",),
        ("--account-for-loss-in-pipeline-split",),
    ]
    # the layout carries the virtual size itself: no other pipeline flag
    c = cfg(pp=2, vp=2, pipeline_split="layout:Et|tt|ttt|tL")
    assert megatron_split_flags(c, 7) == [("--pipeline-model-parallel-layout", "Et|tt|ttt|tL")]
    assert megatron_split_flags(cfg(vp=2), 32) == [
        ("--num-layers-per-virtual-pipeline-stage", "4")
    ]


# ----------------------------------------------------------------------------- DeepSpeed


def _workload(name: str) -> Any:
    """A module of workloads/, imported as gpt_deepspeed.py imports its siblings: by name, with
    their directory on sys.path (a script's own directory is there when it runs)."""
    workloads = str(Path(__file__).resolve().parent.parent / "workloads")
    if workloads not in sys.path:
        sys.path.insert(0, workloads)
    return importlib.import_module(name)


def test_deepspeed_layer_params_are_the_workloads() -> None:
    pytest.importorskip("torch")
    w = _workload("gpt_deepspeed_model")
    m = model(3, hidden_size=64, ffn_hidden_size=192, vocab_size=500, seq_length=32)
    shape = _workload("gpt_deepspeed_args").ModelShape(
        num_layers=3, hidden_size=64, num_attention_heads=4, ffn_hidden_size=192,
        seq_length=32, vocab_size=500,
    )  # fmt: skip
    real = [sum(p.numel() for p in cls(shape).parameters()) for cls in (w.Embedding, w.Block)]
    real += [real[1]] * 2 + [sum(p.numel() for p in w.Head(shape).parameters())]
    ours = deepspeed_layer_params(3, 64, 192, 500, 32)
    assert list(ours) == real
    assert m.num_layers == 3


@pytest.mark.parametrize("method", ["uniform", "parameters", "type:Block", "type:block|head"])
@pytest.mark.parametrize(("layers", "pp"), [(30, 4), (24, 4), (7, 3), (13, 5), (32, 8)])
def test_deepspeed_partition_equals_deepspeeds(method: str, layers: int, pp: int) -> None:
    utils = pytest.importorskip("deepspeed.runtime.utils")
    m = model(layers)
    params = list(
        deepspeed_layer_params(layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size, 128)
    )
    names = ["Embedding"] + ["Block"] * layers + ["Head"]
    if method == "uniform":
        bounds = utils.partition_uniform(num_items=len(names), num_parts=pp)
    elif method == "parameters":
        bounds = utils.partition_balanced(weights=params, num_parts=pp)
    else:
        pattern = method.split(":")[1].lower().split("|")
        binary = [int(n.lower() in pattern) for n in names]
        bounds = utils.partition_balanced(weights=binary, num_parts=pp)
    expected = tuple(names[bounds[s] : bounds[s + 1]].count("Block") for s in range(pp))
    c = cfg(pp=pp, pipeline_split=method)
    assert validate(c, m, pp, "deepspeed") == []
    assert stage_layers(m, c, "deepspeed") == expected
    holds = stage_holds(m, c, "deepspeed")
    assert holds[0][0] and holds[-1][1]


def test_deepspeed_default_is_the_workloads_type_block() -> None:
    """type:Block over 30 blocks on 4 stages: DeepSpeed gives 8, 8, 7, 7 (checked above)."""
    m = model(30)
    assert stage_layers(m, cfg(), "deepspeed") == stage_layers(
        m, cfg(pipeline_split="type:Block"), "deepspeed"
    )
    assert validate(cfg(), m, 4, "deepspeed") == []  # uneven is fine for DeepSpeed


def test_deepspeed_refusals() -> None:
    m = model(4)
    errors = validate(cfg(pipeline_split="type:Mlp"), m, 4, "deepspeed")
    assert [e.rule for e in errors] == ["split_type"]
    # DeepSpeed lower-cases the method before it reports it
    assert "Partitioning 'mlp' found no valid layers to partition." == errors[0].message
    errors = validate(cfg(pipeline_split="first=1"), m, 4, "deepspeed")
    assert [e.rule for e in errors] == ["split_framework"]


# ----------------------------------------------------------------------------- schedules


def test_1f1b_in_flight_by_hand() -> None:
    """1F1B, p = 4. m = 8: stage i runs 3 - i warm-up forwards, then one more forward before
    each backward: 4, 3, 2, 1 micro-batches alive. m = 2: stage 0 can only ever hold 2."""
    assert [in_flight(cfg(), s) for s in range(4)] == [4.0, 3.0, 2.0, 1.0]
    assert [in_flight(cfg(global_batch_size=2), s) for s in range(4)] == [2.0, 2.0, 2.0, 1.0]
    assert in_flight(cfg(pp=1, dp=1), 0) == 1.0


def test_interleaved_in_flight_by_hand() -> None:
    """p = 4, v = 2, m = 8 (m v = 16 chunk micro-batches).
    Rank 0: W = (4 - 0 - 1) * 2 + (2 - 1) * 4 = 10 warm-up chunk forwards, + 1 in steady state =
    11 chunks of L / 8 layers = 5.5 micro-batches of the rank's layers.
    Rank 3: W = 0 + 4 = 4 -> 5 chunks -> 2.5. The old average, 4 x (1 + 3/8) = 5.5 on rank 0,
    gave rank 3 1 x 1.375: 1.8x too few.
    m = 4 (m v = 8): rank 0's W = 10 is capped at 8, all in warm-up -> 8 chunks -> 4.0."""
    c = cfg(vp=2)
    assert [in_flight(c, r) for r in range(4)] == [5.5, 4.5, 3.5, 2.5]
    assert in_flight(cfg(vp=2, global_batch_size=4), 0) == 4.0


def test_interleaved_chunks_by_hand() -> None:
    """p = 2, v = 2, m = 2; schedule table (groups of p = 2): (0,c0) (1,c0) (0,c1) (1,c1).
    Rank 1: W = 0 * 2 + 1 * 2 = 2. k=0 F c0 -> [1,0]; k=1 F c0 -> [2,0]; k=2 F c1 -> [2,1]
    (peak, 3 = W + 1), then B of table[0] on chunk 2-1-0 = 1 -> [2,0];
    k=3 F c1 -> [2,1], B -> [2,0].
    Rank 0: W = 1 * 2 + 2 = 4 = m v: everything in warm-up -> [2, 2]."""
    c = cfg(pp=2, vp=2, global_batch_size=2)
    assert in_flight_chunks(c, 1, (1, 1)) == [2, 1]
    assert in_flight_chunks(c, 0, (1, 1)) == [2, 2]
    # unequal chunks (layout Et|tt|ttt|tL, 7 layers): rank 1 holds chunks of 2 and 1 layers
    c = cfg(pp=2, vp=2, global_batch_size=2, pipeline_split="layout:Et|tt|ttt|tL")
    assert held_layer_microbatches(model(7), c, "megatron", 1) == 2 * 2 + 1 * 1
    assert held_layer_microbatches(model(7), c, "megatron", 0) == 2 * 1 + 2 * 3


def _held_walked(m: int, v: int, pp: int, warm: int, weights: tuple[int, ...]) -> tuple[int, ...]:
    """The schedule walk of ``pipeline._held_chunks`` with the load summed afresh at each step
    (the reference for the running sum it keeps)."""
    table = pipeline._schedule_table(m, v, pp) if v > 1 else tuple((mb, 0) for mb in range(m))
    held, best, best_load = [0] * v, [0] * v, -1
    for k in range(len(table)):
        held[table[k][1]] += 1
        if k < warm:
            continue
        load = sum(h * w for h, w in zip(held, weights, strict=True))
        if load > best_load:
            best, best_load = list(held), load
        held[v - 1 - table[k - warm][1]] -= 1
    return tuple(best if best_load >= 0 else held)


def test_the_held_chunks_running_load_is_the_walks_sum() -> None:
    rng = random.Random(7)
    cases = 0
    for _ in range(3000):
        v, pp = rng.choice((1, 2, 3, 4)), rng.choice((2, 4, 8, 16))
        m = rng.randint(1, 40) * (pp if v > 1 else 1)
        warm = rng.randint(0, m * v)
        weights = tuple(rng.randint(0, 9) for _ in range(v))
        assert pipeline._held_chunks(m, v, pp, warm, weights) == _held_walked(
            m, v, pp, warm, weights
        ), (m, v, pp, warm, weights)
        cases += 1
    assert cases == 3000


def test_pipe_buffers() -> None:
    """DeepSpeed TrainSchedule.num_pipe_buffers = max(2, min(p - i, m)): the last of 4 stages
    keeps 2 buffers for its 1 in-flight micro-batch; Megatron keeps one per in-flight one."""
    assert [pipe_buffers(cfg(), s, "deepspeed") for s in range(4)] == [4, 3, 2, 2]
    assert [pipe_buffers(cfg(), s, "megatron") for s in range(4)] == [4, 3, 2, 1]


# ----------------------------------------------------------------------------- the knob


BASE: dict[str, Any] = {
    "name": "split",
    "model": {"num_layers": 30, "hidden_size": 1024, "ffn_hidden_size": 4096,
              "num_attention_heads": 16, "vocab_size": 32000, "seq_length": 1024},
    "training": {"global_batch_size": 16},
    "cluster": {"gpu": "a100-80gb", "gpus_per_node": 4, "nodes": ["n1"]},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt"},
    "space": {"pp": [1, 4], "pipeline_split": ["even", "last=7,first=7"]},
}  # fmt: skip


def study(**space: Any) -> Any:
    data = copy.deepcopy(BASE)
    data["space"].update(space)
    return study_from_mapping(data)


def test_the_study_searches_the_split() -> None:
    report = enumerate_space(study())
    keys = {c.config.key() for c in report.viable}
    # pp=1: one config (no split); pp=4: even refused (30 % 4), first=7,last=7 runs
    assert any(k.endswith("split=first=7,last=7") for k in keys)
    assert all("pp=4" in k for k in keys if "split=" in k)
    assert report.invalid_by_rule["layers_pp"] >= 1
    c = config_from_settings(study(), ["pp=4", "split=first=7,last=7"])
    assert c.pipeline_split == "first=7,last=7"
    assert canonical_split("last=7,first=7") == "first=7,last=7"


@pytest.mark.parametrize(
    ("values", "framework", "text"),
    [
        (["even", "first=7,middle=8"], "megatron", "space.pipeline_split[1]"),
        (["layout:Etx|tL"], "megatron", "Invalid layer character: x"),
        (["first=7,last=7", "last=7,first=7"], "megatron", "listed twice"),
        (["parameters"], "megatron", "is a deepspeed pipeline split"),
        (["first=7"], "deepspeed", "is a megatron pipeline split"),
    ],
)
def test_bad_split_values_name_the_field(values: list[str], framework: str, text: str) -> None:
    data = copy.deepcopy(BASE)
    data["space"]["pipeline_split"] = values
    data["framework"] = framework
    if framework == "deepspeed":
        data["launch"]["template"] = "deepspeed_gpt"
    with pytest.raises(ConfigError, match="pipeline_split") as info:
        study_from_mapping(data)
    assert text in str(info.value)
    assert "\n" not in str(info.value)


def test_parse_split_spellings() -> None:
    assert parse_split("first=7,last=7").text == "first=7,last=7"
    assert parse_split("loss+embedding").text == "embedding+loss"
    assert parse_split("type:Block").framework == "deepspeed"
    with pytest.raises(ConfigError):
        parse_split("first=x")


def test_time_model_paces_on_the_slowest_stage() -> None:
    """32 layers on 4 stages. last=5 -> 9, 9, 9, 5: the pace is 9 layers (9/8 of even's
    compute) and the last stage's 4 spare layers absorb part of its LM head; first=11 ->
    11, 7, 7, 7: the pace is 11 layers."""
    from tuner.catalog import get_gpu

    m = model(32, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16)
    t = TrainingSpec(global_batch_size=32)
    gpu = get_gpu("a100-80gb")
    even = estimate_time(m, t, cfg(global_batch_size=32), gpu, 4)
    light = estimate_time(m, t, cfg(global_batch_size=32, pipeline_split="last=5"), gpu, 4)
    heavy = estimate_time(m, t, cfg(global_batch_size=32, pipeline_split="first=11"), gpu, 4)
    assert light.stage_imbalance < even.stage_imbalance
    assert light.compute == pytest.approx(even.compute * 9 / 8)  # pace: 9 layers, not 8
    assert heavy.compute == pytest.approx(even.compute * 11 / 8)


def test_auto_split_tries_the_accepted_first_last_counts() -> None:
    """30 layers, pp = 4: ceil(30 / 4) = 8, so first and last range over 6..9; Megatron needs
    (30 - f - l) to split over the 2 middle stages, and auto keeps the ends no heavier than the
    middle: (6, 6) -> 9, 9 in the middle; (6, 8) and (8, 6) -> 8; (7, 7) -> 8. (8, 8) would leave
    7 in the middle. embedding+loss builds 7, 8, 8, 7 again, so it is left out. even is refused.
    pp = 2: f + l = 30: even (15, 15), then (14, 16) and (16, 14)."""
    s = study(pipeline_split="auto", pp="auto")
    report = enumerate_space(s)
    by_pp: dict[int, set[str]] = {}
    for c in report.viable:
        by_pp.setdefault(c.config.pp, set()).add(c.config.pipeline_split)
    assert by_pp[4] == {"first=6,last=6", "first=6,last=8", "first=7,last=7", "first=8,last=6"}
    assert by_pp[2] == {"even", "first=14,last=16", "first=16,last=14"}
    assert by_pp[1] == {"even"}
    assert report.invalid == 0


def test_auto_split_on_deepspeed_keeps_distinct_partitions() -> None:
    """30 blocks on 4 stages (32 layers with the embedding and the head): type:Block 8, 8, 7, 7;
    uniform: 32 / 4 = 8 layers per stage -> 7, 8, 8, 7 blocks; parameters: the 32000 x 1024
    embedding and head weigh about 2.7 blocks each -> 6, 9, 9, 6 (oracle test above)."""
    data = copy.deepcopy(BASE)
    data.update(framework="deepspeed", launch={"template": "deepspeed_gpt"})
    data["space"] = {"pp": [4], "pipeline_split": "auto"}
    spec = study_from_mapping(data)
    report = enumerate_space(spec)
    got = {c.config.pipeline_split: stage_layers(spec.model, c.config, "deepspeed")
           for c in report.viable}  # fmt: skip
    assert got == {"even": (8, 8, 7, 7), "parameters": (6, 9, 9, 6), "uniform": (7, 8, 8, 7)}
