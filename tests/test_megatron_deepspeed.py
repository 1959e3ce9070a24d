"""Megatron-DeepSpeed as a framework: GPTModelPipe's partition, the fork's rules with their
messages, and Megatron's TP sharding with DeepSpeed's pipeline and optimizer in the models.

Partition cases use the installed DeepSpeed's own ``partition_uniform`` / ``partition_balanced``
over GPTModelPipe's layer list, matched by class name as ``PipelineModule._find_layer_type``
matches (``re.search``, case-insensitive).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.config.pipe_layers import pipe_layers
from tuner.config.pipeline import pipe_buffers, stage_holds, stage_layers
from tuner.config.rules import validate
from tuner.models.memory.estimate import estimate_memory
from tuner.models.memory.terms import param_counts
from tuner.models.time.estimate import estimate_time
from tuner.space.enumerate import enumerate_space
from tuner.spec.file import study_from_mapping
from tuner.spec.frameworks import FRAMEWORKS, padded_vocab, traits
from tuner.spec.study import ModelSpec, TrainingSpec

MDS = "megatron-deepspeed"
H100 = get_gpu("h100-sxm-80gb")
# A 40-layer GPT: 40 layers do not divide pp=6, so every partition method is uneven.
GPT40 = ModelSpec(
    num_layers=40, hidden_size=5120, ffn_hidden_size=20480, num_attention_heads=40,
    vocab_size=50257, seq_length=2048,
)  # fmt: skip


def cfg(**kw: Any) -> ParallelConfig:
    base: dict[str, Any] = dict(tp=4, pp=6, dp=2, micro_batch_size=1, global_batch_size=96,
                                zero_stage=1)  # fmt: skip
    base.update(kw)
    return ParallelConfig(**base)


def rules(c: ParallelConfig, m: ModelSpec = GPT40, world: int = 48) -> dict[str, str]:
    return {v.rule: v.message for v in validate(c, m, world, MDS)}


def test_the_framework_table_names_megatron_deepspeed() -> None:
    assert MDS in FRAMEWORKS
    t = traits(MDS)
    assert t.megatron_model and t.deepspeed_pipeline and t.deepspeed_optimizer
    assert not t.context_parallel and t.default_partition == "type:transformer"
    assert padded_vocab(50257, 4, MDS) == 50688  # 128 x 4 multiple, as Megatron pads
    assert padded_vocab(50257, 4, "deepspeed") == 50257


# ----------------------------------------------------------------------------- partition


def test_layer_list_is_gpt_model_pipes() -> None:
    names = [layer.name for layer in pipe_layers(GPT40, MDS, 4)]
    assert names[:3] == ["_to_float16", "EmbeddingPipe", "ParallelTransformerLayerPipe"]
    assert names[-3:] == ["MixedFusedLayerNorm", "EmbeddingPipe", "float16_to_fp32"]
    assert names.count("ParallelTransformerLayerPipe") == 40
    untied = ModelSpec(**{**_shape(GPT40), "tied_embeddings": False, "normalization": "rmsnorm"})
    assert [n.name for n in pipe_layers(untied, MDS, 4)][-3:] == [
        "MixedFusedRMSNorm", "LMHeadPipe", "float16_to_fp32",
    ]  # fmt: skip


@pytest.mark.parametrize("tp", [1, 4])
@pytest.mark.parametrize("model", ["gpt40", "llama"])
def test_layer_params_equal_the_memory_models_counts(tp: int, model: str) -> None:
    """One parameter formula: the partition's block size is the memory model's layer size."""
    m = GPT40 if model == "gpt40" else _llama()
    block = next(x for x in pipe_layers(m, MDS, tp) if x.role == "block")
    counts = param_counts(m)
    assert block.params == pytest.approx(counts.layer_sharded / tp + counts.layer_replicated)
    embedding = next(x for x in pipe_layers(m, MDS, tp) if x.role == "embedding")
    vocab = padded_vocab(m.vocab_size, tp, MDS)
    assert embedding.params == vocab // tp * m.hidden_size + counts.position


@pytest.mark.parametrize("method", ["even", "parameters", "uniform", "type:transformer|embed"])
@pytest.mark.parametrize(("layers", "pp"), [(40, 6), (30, 4), (70, 12), (24, 8), (7, 3)])
def test_stage_layers_equal_deepspeeds_partition(method: str, layers: int, pp: int) -> None:
    utils = pytest.importorskip("deepspeed.runtime.utils")
    m = ModelSpec(**{**_shape(GPT40), "num_layers": layers})
    pipe = pipe_layers(m, MDS, 4)
    names = [layer.name for layer in pipe]
    if method == "uniform":
        bounds = utils.partition_uniform(num_items=len(names), num_parts=pp)
    elif method == "parameters":
        bounds = utils.partition_balanced(weights=[x.params for x in pipe], num_parts=pp)
    else:
        pattern = "transformer" if method == "even" else method.split(":")[1]
        regex = re.compile(pattern, re.IGNORECASE)
        binary = [int(bool(regex.search(n))) for n in names]
        bounds = utils.partition_balanced(weights=binary, num_parts=pp)
    block = "ParallelTransformerLayerPipe"
    expected = tuple(names[bounds[s] : bounds[s + 1]].count(block) for s in range(pp))
    c = cfg(pp=pp, dp=1, global_batch_size=8, pipeline_split=method)
    assert rules(c, m, 4 * pp) == {}
    assert stage_layers(m, c, MDS) == expected
    assert sum(expected) == layers
    holds = stage_holds(m, c, MDS)
    first = next(s for s in range(pp) if bounds[s] <= 1 < bounds[s + 1])
    last = next(s for s in range(pp) if bounds[s] <= len(names) - 2 < bounds[s + 1])
    assert [h[0] for h in holds] == [s == first for s in range(pp)]  # EmbeddingPipe
    assert [h[1] for h in holds] == [s == last for s in range(pp)]  # tied EmbeddingPipe


def test_tp4_pp6_splits_are_uneven_and_distinct() -> None:
    got = {s: stage_layers(GPT40, cfg(pipeline_split=s), MDS) for s in ("even", "parameters",
                                                                        "uniform")}  # fmt: skip
    assert got["even"] == (7, 7, 7, 7, 6, 6)  # type:transformer: 40 blocks over 6
    assert len(set(got.values())) == 3
    assert all(len(set(v)) > 1 for v in got.values())


def test_auto_split_offers_the_deepspeed_methods() -> None:
    spec = _study(space={"tp": [4], "pp": [6], "pipeline_split": "auto", "zero_stage": [1]})
    report = enumerate_space(spec)
    splits = {c.config.pipeline_split for c in report.viable + report.oom}
    assert splits == {"even", "parameters", "uniform"}


# ----------------------------------------------------------------------------- rules


def test_tensor_parallel_rules_are_megatrons() -> None:
    got = rules(cfg(tp=3, dp=2, pp=8), world=48)
    assert got["heads_tp"] == (
        "num_attention_heads (40) must be a multiple of tensor_model_parallel_size (3)"
    )
    assert got["ffn_tp"] == "ffn_hidden_size 20480 is not divisible by 3"
    assert "deepspeed_parallel" not in rules(cfg(sequence_parallel=True))


def test_zero_2_and_3_need_no_pipeline() -> None:
    assert rules(cfg(zero_stage=2))["zero_pipeline"] == (
        "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (zero_stage=2, pp=6)"
    )
    assert rules(cfg(pp=1, dp=12, zero_stage=3, global_batch_size=96)) == {}


def test_what_the_fork_lacks_is_refused_naming_it() -> None:
    got = rules(cfg(cp=2, dp=1, global_batch_size=96))
    assert "microsoft/Megatron-DeepSpeed has no context parallelism" in got["mds_context_parallel"]
    got = rules(cfg(pp=4, vp=2, dp=3, global_batch_size=96), world=48)
    assert "no interleaved schedule (vp=2)" in got["mds_interleaved"]
    full_block = cfg(recompute="full", recompute_method="block", recompute_num_layers=1)
    assert "doesn't support the block recompute method" in rules(full_block)["mds_recompute_block"]
    assert rules(cfg(recompute="full", recompute_method="uniform", recompute_num_layers=1)) == {}
    assert rules(cfg(recompute="selective")) == {}  # the fork recomputes core attention
    assert rules(cfg(distributed_optimizer=True))["distopt_deepspeed"] == (
        "distributed_optimizer is Megatron's; use zero_stage"
    )


def test_partition_errors_are_deepspeeds() -> None:
    got = rules(cfg(pipeline_split="type:nothing"))
    assert got["split_type"] == "Partitioning 'nothing' found no valid layers to partition."
    got = rules(cfg(pipeline_split="first=7,last=6"))
    assert got["split_framework"] == (
        "pipeline_split first=7,last=6 is a megatron setting, not megatron-deepspeed's"
    )


def test_study_file_takes_deepspeed_splits_only() -> None:
    from tuner.errors import ConfigError

    with pytest.raises(ConfigError, match="is a megatron pipeline split.*megatron-deepspeed"):
        _study(space={"pipeline_split": ["first=7,last=6"]})
    assert _study(space={"pipeline_split": ["parameters"]}).framework == MDS


# ----------------------------------------------------------------------------- models


def test_memory_has_megatron_tp_shards_on_deepspeed_stages() -> None:
    c = cfg()
    m = estimate_memory(GPT40, c, H100, MDS, "bf16")
    assert [s.layers for s in m.stages] == [7, 7, 7, 7, 6, 6]
    assert {s.layout for s in m.stages} == {"deepspeed BF16_Optimizer"}
    counts = param_counts(GPT40)
    layer = counts.layer_sharded / 4 + counts.layer_replicated
    embed = padded_vocab(GPT40.vocab_size, 4, MDS) * GPT40.hidden_size / 4
    first, middle, last = m.stages[0], m.stages[1], m.stages[5]
    assert middle.params == pytest.approx(7 * layer)
    assert first.params == pytest.approx(7 * layer + embed + counts.position)
    assert last.params == pytest.approx(6 * layer + embed + counts.final_norm)  # tied copy
    fp16 = estimate_memory(GPT40, c, H100, MDS, "fp16").stages[1]
    assert fp16.layout == "deepspeed ZeRO-1"
    # DeepSpeed's TrainSchedule keeps max(2, min(p - i, m)) buffers, even on the last stage
    assert pipe_buffers(c, 5, MDS) == 2 and pipe_buffers(c, 5, "megatron") == 1


def test_time_uses_deepspeeds_pipeline_and_megatrons_tp() -> None:
    training = TrainingSpec(global_batch_size=96)
    c = cfg()
    mds = estimate_time(GPT40, training, c, H100, 8, MDS)
    ds_pipe = estimate_time(GPT40, training, c, H100, 8, "deepspeed")
    megatron = estimate_time(GPT40, training, cfg(zero_stage=0), H100, 8, "megatron")
    assert mds.pp_p2p == pytest.approx(ds_pipe.pp_p2p)  # whole activations, DeepSpeed's engine
    assert mds.pp_p2p > megatron.pp_p2p  # Megatron scatter-gathers 1/tp slices
    # the same TP traffic per layer; the slowest DeepSpeed stage has 7 layers, Megatron's 40 // 6
    assert mds.tp_comm / 7 == pytest.approx(megatron.tp_comm / 6) and mds.tp_comm > 0
    sp = estimate_time(GPT40, training, cfg(sequence_parallel=True), H100, 8, MDS)
    assert sp.pp_p2p < mds.pp_p2p  # SP: each rank sends its 1/tp sequence shard


def _shape(m: ModelSpec) -> dict[str, Any]:
    return {f: getattr(m, f) for f in m.__dataclass_fields__}


def _llama() -> ModelSpec:
    return ModelSpec(
        num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
        num_query_groups=8, vocab_size=128256, seq_length=8192, swiglu=True,
        tied_embeddings=False, normalization="rmsnorm", position_embedding="rope",
        add_bias_linear=False,
    )  # fmt: skip


def _study(**extra: Any) -> Any:
    data: dict[str, Any] = {
        "name": "mds",
        "model": _shape(GPT40),
        "training": {"global_batch_size": 96},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 6,
                    "executor": "local"},
        "framework": MDS,
        "launch": {"template": "megatron_deepspeed_gpt", "megatron_path": "/opt/mds"},
    }  # fmt: skip
    data.update(extra)
    return study_from_mapping(data)
