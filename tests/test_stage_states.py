"""A stage's parameters and states, and its activations, each kept per combination of the knobs
they read, against the same terms computed afresh, on every stage of every valid config of
spaces that vary each knob (frameworks, ZeRO stages, FSDP2's own knobs, MoE grids, FP8)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import stage_layers
from tuner.models.memory import overheads, stage_activations, stage_states
from tuner.models.memory.overheads import communicators, nccl_bytes, stage_nccl_bytes
from tuner.models.memory.stage_activations import (
    RECOMPUTE_KNOBS,
    STATE_ONLY_KNOBS,
    stage_activation_terms,
    stage_activation_terms_uncached,
)
from tuner.models.memory.stage_states import (
    ACTIVATION_KNOBS,
    stage_state_terms,
    stage_state_terms_uncached,
)
from tuner.space.enumerate import iter_configs, study_gpu, study_violations
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec


def _with(name: str, training: dict[str, Any] | None = None, **space: Any) -> StudySpec:
    spec = load_study(name)
    spec = dataclasses.replace(spec, space=dataclasses.replace(spec.space, **space))
    if training:
        spec = dataclasses.replace(spec, training=dataclasses.replace(spec.training, **training))
    return spec


SPACES: dict[str, Callable[[], StudySpec]] = {
    "megatron-dense": lambda: _with(
        "llama3-8b",
        tp=(1, 2, 4),
        pp=(1, 2, 4),
        micro_batch_size=(1, 2),
        tp_comm_overlap=(False, True),
        distributed_optimizer=(True, False),
    ),  # fmt: skip
    "megatron-moe-fp8": lambda: _with(
        "mixtral-8x7b",
        {"precision": "fp8"},
        tp=(1, 2),
        pp=(1, 2, 4),
        ep=(1, 2, 8),
        etp=(1, 2),
        vp=(1, 2),
        distributed_optimizer=(True, False),
        moe_token_dispatcher=("alltoall", "allgather", "flex"),
        recompute=("none", "selective", "full"),
    ),  # fmt: skip
    "deepspeed-moe": lambda: _with(
        "demo-moe",
        zero_stage=(0, 1, 2, 3),
        micro_batch_size=(1, 2, 4),
        recompute=("none", "full"),
    ),  # fmt: skip
    "deepspeed-pipe": lambda: _with(
        "demo",
        pp=(1, 2),
        zero_stage=(0, 1, 2, 3),
        micro_batch_size=(1, 2),
        recompute=("none", "full"),
    ),  # fmt: skip
    # a micro-batch of the whole global batch: one micro-batch per step (FSDP2 under pp)
    "torchtitan": lambda: _with("demo-fsdp", micro_batch_size=(1, 2, 4, 8), dp_replicate=(1, 2)),
    # every other layer MoE: dense and MoE layers on one rank
    "megatron-moe-every-other": lambda: _every_other(
        _with("mixtral-8x7b", tp=(1, 2), pp=(2, 4), vp=(1, 2), ep=(1, 8), recompute=("full",))
    ),
    # uneven splits: stages of one config with different layer counts (pipeline_split auto)
    "megatron-uneven": lambda: _with(
        "llama3-8b",
        tp=(1,),
        pp=(4, 8),
        micro_batch_size=(1,),
        pipeline_split="auto",
        recompute=("none", "full"),
    ),  # fmt: skip
    # the first 10 of 32 layers dense: middle stages of 8 layers with 6 and 8 MoE layers
    "megatron-moe-first-dense": lambda: _moe_pattern(
        _with("mixtral-8x7b", tp=(1, 2), pp=(4,), ep=(1, 8), recompute=("full",)),
        "[0]*10+[1]*22",
    ),
}


def _every_other(spec: StudySpec) -> StudySpec:
    return _moe_pattern(spec, 2)


def _moe_pattern(spec: StudySpec, layer_freq: int | str) -> StudySpec:
    assert spec.model.moe is not None
    moe = dataclasses.replace(spec.model.moe, layer_freq=layer_freq)
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, moe=moe))


@pytest.mark.parametrize("name", sorted(SPACES))
def test_the_kept_states_and_activations_are_each_configs_own(name: str) -> None:
    spec = SPACES[name]()
    stage_states._TERMS.clear()
    stage_states._ALIKE.clear()
    stage_activations._TERMS.clear()
    stage_activations._BASE.clear()
    overheads._NCCL.clear()
    gpu = study_gpu(spec)
    calls = 0
    for config in iter_configs(spec):
        if study_violations(config, spec):
            continue
        for stage, layers in enumerate(stage_layers(spec.model, config, spec.framework)):
            args = (spec.model, config, stage, layers, spec.framework, spec.training.precision)
            # kept from an earlier config that differs only in knobs the terms do not read,
            # where there was one: a knob they read missing from the key shows here
            kept = stage_state_terms(*args, None)
            assert kept == stage_state_terms_uncached(*args, None)
            assert stage_activation_terms(*args) == stage_activation_terms_uncached(*args)
            for moe in (False, True):  # the NCCL buffers, kept per what communicators read
                tied = spec.model.tied_embeddings
                fresh = nccl_bytes(communicators(config, stage, spec.framework, tied, moe), gpu)
                assert stage_nccl_bytes(config, stage, spec.framework, tied, moe, gpu) == fresh
            calls += 1
    assert calls > len(stage_states._TERMS) > 0, "configs shared kept states"
    if name in ("megatron-dense", "megatron-moe-every-other"):  # alike middle stages at pp 4
        assert len(stage_states._TERMS) > len(stage_states._ALIKE) > 0, "stages shared states"
    assert 2 * calls > len(overheads._NCCL) > 0, "stages shared kept NCCL buffers"
    if name == "megatron-dense":  # it varies the state-only knobs
        assert calls > len(stage_activations._TERMS) > 0, "configs shared kept activations"
    if name in ("megatron-moe-fp8", "deepspeed-moe"):  # they vary the recompute knobs
        bases = len(stage_activations._BASE)
        assert len(stage_activations._TERMS) > bases > 0, "recompute variants shared a base"


def test_a_view_accounting_and_an_allocators_are_kept_apart() -> None:
    """ZeRO-2 with one micro-batch per step holds its gradient partition beside the bucket on a
    GPU, not in a CPU rank's view accounting: the same stage asked both ways, in either order,
    gets each its own figure, not the one kept from the other."""
    spec = _with("demo", zero_stage=(2,), micro_batch_size=(1, 2, 4, 8))
    config = next(c for c in iter_configs(spec)
                  if not study_violations(c, spec) and c.num_microbatches == 1)  # fmt: skip
    args = (spec.model, config, 0, spec.model.num_layers, spec.framework, spec.training.precision)
    stage_states._TERMS.clear()
    stage_states._ALIKE.clear()
    gpu, cpu = stage_state_terms(*args, None, False), stage_state_terms(*args, None, True)
    assert gpu == stage_state_terms_uncached(*args, None, False)
    assert cpu == stage_state_terms_uncached(*args, None, True)
    assert cpu.states.fwd_bwd.grads < gpu.states.fwd_bwd.grads


def test_the_knobs_left_out_of_the_keys_are_config_fields() -> None:
    spec = load_study("llama3-8b")
    config = next(iter(iter_configs(spec)))
    assert ACTIVATION_KNOBS <= set(dataclasses.asdict(config))
    assert STATE_ONLY_KNOBS <= set(dataclasses.asdict(config))
    assert not ACTIVATION_KNOBS & STATE_ONLY_KNOBS - {"tp_comm_overlap"}
    assert RECOMPUTE_KNOBS <= ACTIVATION_KNOBS


def test_a_full_table_of_kept_stages_starts_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one bound both tables share: at the cap, the next stage kept clears the rest."""
    from tuner.models.memory import kept

    monkeypatch.setattr(kept, "MAX_CACHED_STAGES", 2)
    table: kept.Kept[str] = kept.Kept()
    assert table.get("a") is None and table.put("a", "A") == "A" and table.get("a") == "A"
    table.put("b", "B")
    assert len(table) == 2
    table.put("c", "C")
    assert len(table) == 1 and table.get("a") is None and table.get("c") == "C"


def test_the_kept_nccl_buffers_tell_every_size_apart() -> None:
    """A space's world size ties tp, pp, cp and dp together, so the spaces above cannot show a
    size missing from the key; configs that differ in one size each, asked in turn with the
    table kept, can (each changes the communicators, and each gets its own figure)."""
    gpu = study_gpu(load_study("mixtral-8x7b"))
    base = ParallelConfig(tp=1, pp=4, cp=2, dp=2, ep=2, etp=1)
    changes = {"tp": 2, "pp": 1, "cp": 1, "dp": 1, "ep": 1, "etp": 4}
    overheads._NCCL.clear()
    for knob, value in changes.items():
        other = dataclasses.replace(base, **{knob: value})
        for stage in range(4):
            for c in (base, other):
                fresh = nccl_bytes(communicators(c, stage, "megatron", True, True), gpu)
                assert stage_nccl_bytes(c, stage, "megatron", True, True, gpu) == fresh
        differ = [
            communicators(c, s, "megatron", True, True) for c in (base, other) for s in (0, 3)
        ]
        assert differ[:2] != differ[2:], f"{knob} changes the communicators"
