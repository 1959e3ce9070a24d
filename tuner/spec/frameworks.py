"""The frameworks tuner drives, and which of Megatron-LM's and DeepSpeed's parts each one uses.

One table that the validity rules, the memory and time models, the pipeline splits and the
templates read, so "uses DeepSpeed's pipeline" or "shards with Megatron's tensor parallelism"
is decided in one place:

- ``megatron``: Megatron-LM (megatron-core) end to end.
- ``deepspeed``: DeepSpeed with the repo's own GPT workload (``workloads/gpt_deepspeed.py``): its
  ``PipelineModule``, ZeRO and DeepSpeed's optimizer wrappers; no tensor parallelism.
- ``megatron-deepspeed``: microsoft/Megatron-DeepSpeed (the BLOOM-176B stack, forked from
  Megatron-LM v2-v3): Megatron's model code and tensor parallelism (``megatron/mpu`` /
  ``megatron/core/tensor_parallel``), with ``GPTModelPipe`` (``megatron/model/gpt_model.py``) a
  DeepSpeed ``PipelineModule`` run by DeepSpeed's ``PipelineEngine``, and DeepSpeed's ZeRO and
  BF16 optimizer (``pretrain_gpt.py`` -> ``deepspeed.initialize``).
- ``megatron-bridge``: NVIDIA-NeMo/Megatron-Bridge (:data:`MEGATRON_BRIDGE_RELEASE`), Megatron-Core
  underneath: the same model code, parallel-state rules, optimizer and time and memory terms as
  ``megatron``, launched as a recipe (``launch.recipe``) run by Bridge's recipe script with one
  ``section.field=value`` override per setting (``tuner.launch.bridge``).
- ``torchtitan``: pytorch/torchtitan (release :data:`TORCHTITAN_RELEASE`): FSDP2 ``fully_shard``
  over dp_shard x cp (HSDP with dp_replicate), DTensor tensor and sequence parallelism,
  ``torch.distributed.pipelining`` schedules, context parallelism; its own options
  (``tuner.spec.torchtitan``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

Framework = Literal["megatron", "deepspeed", "megatron-deepspeed", "megatron-bridge", "torchtitan"]
FRAMEWORKS: tuple[Framework, ...] = get_args(Framework)
PipelineModuleKind = Literal["workload", "gpt_model_pipe"]

MEGATRON_DEEPSPEED_FORK = "microsoft/Megatron-DeepSpeed"
"""The fork the ``megatron-deepspeed`` template and rules follow (HEAD f4157bea, 2024-12)."""

MEGATRON_BRIDGE_RELEASE = "NVIDIA-NeMo/Megatron-Bridge v0.6.0 (51885cf1)"
"""The release whose config dataclasses and recipe script the ``megatron-bridge`` overrides
follow; its Megatron-Core is the 3rdparty/Megatron-LM submodule commit cd4afffa."""


TORCHTITAN_RELEASE = "torchtitan 0.3.0"
"""The torchtitan release whose options the ``torchtitan`` framework emits and checks (PyPI
``torchtitan==0.3.0``; its option table: ``tuner.spec.torchtitan``)."""


@dataclass(frozen=True, slots=True)
class Traits:
    """What one framework takes from Megatron-LM and from DeepSpeed."""

    megatron_model: bool
    """Megatron's model code: tensor parallelism (heads / FFN divisibility), sequence
    parallelism, the vocabulary padded to 128 x TP, Megatron's iteration log lines."""
    deepspeed_pipeline: bool
    """DeepSpeed's ``PipelineModule`` / ``PipelineEngine``: ``partition_method`` splits,
    ``TrainSchedule`` buffers, whole activations sent between stages, one process group per
    adjacent stage pair; no interleaved schedule."""
    deepspeed_optimizer: bool
    """ZeRO stages and DeepSpeed's optimizer wrappers (``tuner.models.optimizer_layout``);
    otherwise Megatron's (distributed) optimizer."""
    context_parallel: bool
    """Megatron-core context parallelism (``--context-parallel-size``)."""
    pipeline_module: PipelineModuleKind | None
    """Which ``PipelineModule`` layer list is partitioned (``tuner.spec.pipeline_split``)."""
    default_partition: str | None
    """The ``partition_method`` the framework's pipeline module uses (``pipeline_split: even``)."""
    split_family: Literal["megatron", "deepspeed"]
    """Whose ``pipeline_split`` values the framework takes."""
    megatron_core: bool = False
    """Megatron-Core's training stack end to end: its optimizer and DDP buffers, global memory
    buffer, Transformer Engine workspaces, fused cross entropy, expert-parallel and FP8 rules
    (the memory and time models and the rules treat these frameworks alike)."""
    recipe_launch: bool = False
    """Launched as a recipe (``launch.recipe``) whose config fields are overridden one by one."""
    fsdp2: bool = False
    """PyTorch FSDP2 (``fully_shard``) shards parameters, gradients and optimizer states over
    dp_shard x cp with no separate master copy; DTensor TP/SP; ``torch.distributed.pipelining``
    schedules chosen by name (``pp_schedule``)."""
    length_flags: tuple[str, ...] = ("--train-iters", "--train-samples")
    """The arguments that set how long a run trains, which tune sets itself (a trial's
    ``launch.train_iters``; ``tune best --train-iters`` for the full run): the first is the
    one its launch passes (Megatron-LM's ``--train-iters``, which refuses ``--train-samples``
    beside it: "expected iteration-based training")."""


TRAITS: dict[Framework, Traits] = {
    "megatron": Traits(
        megatron_model=True, deepspeed_pipeline=False, deepspeed_optimizer=False,
        context_parallel=True, pipeline_module=None, default_partition=None,
        split_family="megatron", megatron_core=True,
    ),
    "deepspeed": Traits(
        megatron_model=False, deepspeed_pipeline=True, deepspeed_optimizer=True,
        context_parallel=False, pipeline_module="workload",
        default_partition="type:Block",  # workloads/gpt_deepspeed.py partitions by block type
        split_family="deepspeed", length_flags=("--train-iters",),
    ),
    "megatron-deepspeed": Traits(
        megatron_model=True, deepspeed_pipeline=True, deepspeed_optimizer=True,
        context_parallel=False, pipeline_module="gpt_model_pipe",
        # megatron/model/gpt_model.py GPTModelPipe: partition_method='type:transformer'
        default_partition="type:transformer",
        split_family="deepspeed",
    ),
    "megatron-bridge": Traits(
        megatron_model=True, deepspeed_pipeline=False, deepspeed_optimizer=False,
        context_parallel=True, pipeline_module=None, default_partition=None,
        split_family="megatron", megatron_core=True, recipe_launch=True,
        length_flags=("train.train_iters",),  # a recipe override, name=value
    ),
    "torchtitan": Traits(
        megatron_model=False, deepspeed_pipeline=False, deepspeed_optimizer=False,
        context_parallel=True, pipeline_module=None, default_partition=None,
        split_family="megatron", fsdp2=True, length_flags=("--training.steps",),
    ),
}  # fmt: skip


def traits(framework: str) -> Traits:
    """The traits of ``framework`` (one of :data:`FRAMEWORKS`)."""
    try:
        return TRAITS[framework]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"unknown framework {framework!r}: one of {FRAMEWORKS}") from None


LENGTH_ARGS = ("script_args", "train_args", "extra_args")
"""The ``launch`` fields whose words reach the training command beside tune's own length."""


def length_problem(framework: str, launch: Mapping[str, Sequence[str]]) -> tuple[str, str] | None:
    """(the field, why) for a word of ``launch``'s :data:`LENGTH_ARGS` that sets the run's
    length, None if none does. Megatron takes the last ``--train-iters`` it is given, so one in
    ``launch.train_args`` silently overrode the length the full run's header states (and one in
    ``extra_args`` every trial's, whose warm-up and steady state are counted from
    ``launch.train_iters``); a recipe override or torchtitan option before tune's own was
    silently dropped."""
    flags = traits(framework).length_flags
    for name in LENGTH_ARGS:
        for i, word in enumerate(launch.get(name, ())):
            bare = word.lstrip("+")  # a recipe override may be ++name=value
            flag = next((f for f in flags if bare == f or bare.startswith(f + "=")), None)
            if flag is not None:
                return (f"launch.{name}[{i}]",
                        f"{word!r}: tune sets the run's length ({flags[0]}): launch.train_iters "
                        "for a trial, tune best --train-iters N for the full run")  # fmt: skip
    return None


def padded_vocab(vocab_size: int, tp: int, framework: str, divisible_by: int = 128) -> int:
    """The vocabulary rows the framework builds: Megatron's model code pads to a multiple of
    ``--make-vocab-size-divisible-by`` (128) x TP (megatron/training/tokenizer
    ``_vocab_size_with_padding``; the same function in Megatron-DeepSpeed's
    megatron/tokenizer/tokenizer.py); DeepSpeed's workload uses the vocabulary as it is."""
    if not traits(framework).megatron_model:
        return vocab_size
    step = divisible_by * tp
    return -(-vocab_size // step) * step
