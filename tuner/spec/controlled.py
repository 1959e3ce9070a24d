"""The options tune sets for the config under trial, per framework, and the refusal of a study
whose own argument lists set one.

A word of ``launch.train_args``, ``extra_args`` or ``script_args`` that sets one of these
options either loses to tune's (before it) or replaces it (after it: Megatron's argparse,
torchtitan's tyro and Hydra's overrides all keep the last value), so the trial measured the
user's value while the study recorded the config's. These are the options the flag and
override functions write (:mod:`tuner.launch.megatron_flags`, :mod:`tuner.launch.bridge`,
:mod:`tuner.launch.torchtitan_flags`, the ``deepspeed_gpt`` template's ds_config);
``tests/test_controlled_args.py`` renders those functions and checks that every option they
emit is listed here. The run's length has its own message
(:func:`tuner.spec.frameworks.length_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tuner.spec.frameworks import LENGTH_ARGS

_MEGATRON_CORE = (
    # megatron_parallel_flags / megatron_split_flags
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--sequence-parallel", "--tp-comm-overlap",
    "--micro-batch-size", "--global-batch-size", "--recompute-granularity",
    "--recompute-modules", "--recompute-method", "--recompute-num-layers",
    "--overlap-grad-reduce", "--use-distributed-optimizer", "--overlap-param-gather",
    # the parallel part of megatron_moe_flags
    "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--moe-token-dispatcher-type", "--moe-enable-deepep",
)  # fmt: skip

_MEGATRON_DEEPSPEED = (
    # megatron_deepspeed_parallel_flags and the template's ds_config
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--no-pipeline-parallel",
    "--pp-partition-method", "--sequence-parallel", "--micro-batch-size", "--global-batch-size",
    "--zero-stage", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--deepspeed-activation-checkpointing", "--deepspeed_config",
)  # fmt: skip

_DEEPSPEED = (
    # the ds_config holds parallelism, batch, ZeRO and precision; the script its expert size
    "--deepspeed_config", "--ep-size",
)  # fmt: skip

_BRIDGE = (
    # parallel_overrides (split, recompute and expert overrides included)
    "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
    "model.context_parallel_size", "model.virtual_pipeline_model_parallel_size",
    "model.num_layers_in_first_pipeline_stage", "model.num_layers_in_last_pipeline_stage",
    "model.account_for_embedding_in_pipeline_split", "model.account_for_loss_in_pipeline_split",
    "model.pipeline_model_parallel_layout", "model.sequence_parallel", "model.tp_comm_overlap",
    "train.micro_batch_size", "train.global_batch_size", "model.recompute_granularity",
    "model.recompute_method", "model.recompute_num_layers", "model.recompute_modules",
    "ddp.overlap_grad_reduce", "ddp.use_distributed_optimizer",
    "optimizer.use_distributed_optimizer", "ddp.overlap_param_gather",
    "optimizer.overlap_param_gather", "model.expert_model_parallel_size",
    "model.expert_tensor_parallel_size", "model.moe_token_dispatcher_type",
    "model.moe_flex_dispatcher_backend",
)  # fmt: skip

_TORCHTITAN = (
    # torchtitan_flags (the run's length, --training.steps, aside)
    "--training.local-batch-size", "--training.global-batch-size", "--training.seq-len",
    "--training.mixed-precision-param", "--training.gc-freq", "--training.disable-cuda-graphs",
    "--parallelism.data-parallel-replicate-degree", "--parallelism.data-parallel-shard-degree",
    "--parallelism.fsdp-reshard-after-forward", "--parallelism.tensor-parallel-degree",
    "--parallelism.enable-sequence-parallel", "--parallelism.pipeline-parallel-degree",
    "--parallelism.context-parallel-degree", "--parallelism.pipeline-parallel-schedule",
    "--parallelism.pipeline-parallel-microbatch-size", "--compile.enable",
    "--compile.enable-async-tensor-parallel", "--metrics.log-freq", "activation-checkpoint",
)  # fmt: skip

CONTROLLED: Mapping[str, tuple[str, ...]] = {
    "megatron": _MEGATRON_CORE,
    "megatron-deepspeed": _MEGATRON_DEEPSPEED,
    "deepspeed": _DEEPSPEED,
    "megatron-bridge": _BRIDGE,
    "torchtitan": _TORCHTITAN,
}
"""Per framework, the options tune sets for the config under trial, as its launch spells them."""


def option_name(word: str) -> str | None:
    """The option ``word`` sets, in one spelling, or None for a value: ``--a_b=1``,
    ``--a-b`` and ``--no-a-b`` are all ``a-b``; a Hydra override ``++x.y=1`` is ``x.y``; a
    torchtitan subcommand ``activation-checkpoint:full`` is ``activation-checkpoint``."""
    if word.startswith("--"):
        section, _, name = word[2:].split("=", 1)[0].replace("_", "-").rpartition(".")
        name = name.removeprefix("no-")
        if section.startswith("activation-checkpoint"):  # the subcommand's own options
            return "activation-checkpoint"
        return f"{section}.{name}" if section else name
    if word.startswith("activation-checkpoint"):
        return "activation-checkpoint"
    bare = word.lstrip("+~")
    if "=" in bare and "." in bare.split("=", 1)[0]:  # a recipe override, field=value
        return bare.split("=", 1)[0].replace("-", "_")
    return None


def controlled_problem(
    framework: str, launch: Mapping[str, Sequence[str]]
) -> tuple[str, str] | None:
    """(the field, why) for the first word of ``launch``'s :data:`LENGTH_ARGS` that sets an
    option of :data:`CONTROLLED` for ``framework``, None if none does."""
    ours = {option_name(flag) or flag: flag for flag in CONTROLLED[framework]}
    for name in LENGTH_ARGS:
        for i, word in enumerate(launch.get(name, ())):
            flag = ours.get(option_name(word) or "")
            if flag:
                return (f"launch.{name}[{i}]",
                        f"{word!r} sets {flag}, which tune sets for the config under trial; "
                        "the trial would measure this value, not the config's: search it "
                        "in space (or leave it to tune)")  # fmt: skip
    return None
