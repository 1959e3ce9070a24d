"""The Megatron-LM arguments a :class:`ParallelConfig` stands for: the one place they are spelt.

The ``megatron_gpt`` launch template receives them as ``megatron_flags`` and ``tune best --emit
args`` prints the same words (:func:`tuner.report.leaderboard.megatron_args`), so the script a
trial ran and the exported arguments can't drift apart.
"""

from __future__ import annotations

from tuner.config.parallel import ParallelConfig
from tuner.spec.frameworks import traits
from tuner.spec.pipeline_split import EVEN, parse_split
from tuner.spec.study import ModelSpec, TrainingSpec

Flag = tuple[str, ...]
"""One flag and its values, e.g. ``("--tensor-model-parallel-size", "8")``."""


def megatron_parallel_flags(config: ParallelConfig, num_layers: int) -> list[Flag]:
    """Parallel sizes, batch sizes, recomputation and optimizer sharding in Megatron's flag names.

    ``num_layers`` is the model's: ``vp`` is passed as layers per virtual pipeline stage. Precision
    and the model's shape are not included (the template adds them from the study).
    """
    c = config
    flags: list[Flag] = [
        ("--tensor-model-parallel-size", str(c.tp)),
        ("--pipeline-model-parallel-size", str(c.pp)),
        ("--context-parallel-size", str(c.cp)),
    ]
    flags += megatron_split_flags(c, num_layers)
    if c.sequence_parallel:
        flags.append(("--sequence-parallel",))
    if c.tp_comm_overlap:
        flags.append(("--tp-comm-overlap",))
    flags.append(("--micro-batch-size", str(c.micro_batch_size)))
    flags.append(("--global-batch-size", str(c.global_batch_size)))
    if c.recompute != "none":
        flags.append(("--recompute-granularity", c.recompute))
    if c.recompute == "selective" and c.recompute_modules is not None:
        # nargs="*" (arguments.py); left out, Megatron takes its default core_attn
        flags.append(("--recompute-modules", *c.recompute_modules))
    if c.recompute == "full":
        flags.append(("--recompute-method", str(c.recompute_method)))
        flags.append(("--recompute-num-layers", str(c.recompute_num_layers)))
    # The DP terms of the time model are Megatron-Core's overlapped reduction and gather
    # (tuner.models.time.dp); both are off unless asked (megatron/training/arguments.py), so ask.
    flags.append(("--overlap-grad-reduce",))
    if c.distributed_optimizer:
        flags.append(("--use-distributed-optimizer",))
        flags.append(("--overlap-param-gather",))
    return flags


def megatron_split_flags(config: ParallelConfig, num_layers: int) -> list[Flag]:
    """The pipeline split and the virtual pipeline size (``tuner.spec.pipeline_split``).

    Megatron's ``validate_args`` takes the virtual size from a layout, refuses
    ``--num-layers-per-virtual-pipeline-stage`` with first/last-stage counts and counts the
    embedding/loss in that flag's division, so every split but ``even`` passes
    ``--num-virtual-stages-per-pipeline-rank`` instead (megatron/training/arguments.py).
    """
    c = config
    if c.pp == 1 or c.pipeline_split == EVEN:
        if c.vp > 1:
            per_chunk = num_layers // (c.pp * c.vp)
            return [("--num-layers-per-virtual-pipeline-stage", str(per_chunk))]
        return []
    s = parse_split(c.pipeline_split)
    if s.kind == "layout":
        return [("--pipeline-model-parallel-layout", str(s.layout))]
    flags: list[Flag] = []
    if s.first is not None:
        flags.append(("--decoder-first-pipeline-num-layers", str(s.first)))
    if s.last is not None:
        flags.append(("--decoder-last-pipeline-num-layers", str(s.last)))
    if s.embedding:
        flags.append(("--account-for-embedding-in-pipeline-split",))
    if s.loss:
        flags.append(("--account-for-loss-in-pipeline-split",))
    if c.vp > 1:
        flags.append(("--num-virtual-stages-per-pipeline-rank", str(c.vp)))
    return flags


def megatron_parallel_args(config: ParallelConfig, num_layers: int) -> list[str]:
    """:func:`megatron_parallel_flags` as one list of words (an argv fragment)."""
    return [word for flag in megatron_parallel_flags(config, num_layers) for word in flag]


def megatron_moe_flags(model: ModelSpec, config: ParallelConfig) -> list[Flag]:
    """The model's experts and the config's expert parallelism (core_v0.15 arguments.py
    ``_add_moe_args``); empty for a dense model. The dispatcher is always passed: Megatron's
    default is ``allgather``, the tuner's ``alltoall``."""
    moe = model.moe
    if moe is None:
        return []
    flags: list[Flag] = [
        ("--num-experts", str(moe.num_experts)),
        ("--moe-router-topk", str(moe.router_topk)),
        ("--moe-ffn-hidden-size", str(moe.ffn_hidden_size or model.ffn_hidden_size)),
    ]
    if moe.layer_freq != 1:
        flags.append(("--moe-layer-freq", str(moe.layer_freq)))
    if moe.shared_expert_ffn_hidden_size:
        flags.append(("--moe-shared-expert-intermediate-size", str(moe.shared)))
    if moe.capacity_factor is not None:
        flags.append(("--moe-expert-capacity-factor", str(moe.capacity_factor)))
        flags.append(("--moe-token-drop-policy", moe.token_drop_policy))
    if moe.pad_to_capacity:
        flags.append(("--moe-pad-expert-input-to-capacity",))
    if moe.router_dtype is not None:
        flags.append(("--moe-router-dtype", moe.router_dtype))
    if moe.router_pre_softmax:
        flags.append(("--moe-router-pre-softmax",))
    if moe.load_balancing != "aux_loss":  # Megatron's default
        flags.append(("--moe-router-load-balancing-type", moe.load_balancing))
    if moe.aux_loss_coeff:
        flags.append(("--moe-aux-loss-coeff", str(moe.aux_loss_coeff)))
    if moe.grouped_gemm:
        flags.append(("--moe-grouped-gemm",))
    if moe.permute_fusion:
        flags.append(("--moe-permute-fusion",))
    flags.append(("--expert-model-parallel-size", str(config.ep)))
    if config.etp is not None:
        flags.append(("--expert-tensor-parallel-size", str(config.etp)))
    flags.append(("--moe-token-dispatcher-type", config.moe_token_dispatcher))
    if config.moe_token_dispatcher == "flex":
        flags.append(("--moe-enable-deepep",))  # core_v0.15: DeepEP is flex's only backend
    return flags


def deepspeed_script_flags(
    model: ModelSpec, config: ParallelConfig, train_iters: int
) -> list[Flag]:
    """The DeepSpeed workload's arguments besides its ds_config: the model's shape, the run's
    length and the MoE flags (the ``deepspeed_gpt`` template and ``tune best --emit args``)."""
    m = model
    return [
        ("--num-layers", str(m.num_layers)), ("--hidden-size", str(m.hidden_size)),
        ("--num-attention-heads", str(m.num_attention_heads)),
        ("--ffn-hidden-size", str(m.ffn_hidden_size)), ("--seq-length", str(m.seq_length)),
        ("--vocab-size", str(m.vocab_size)), ("--train-iters", str(train_iters)),
        *deepspeed_moe_flags(m, config),
    ]  # fmt: skip


def deepspeed_moe_flags(model: ModelSpec, config: ParallelConfig) -> list[Flag]:
    """The DeepSpeed workload's MoE flags (``workloads/gpt_deepspeed.py``, which passes them to
    ``deepspeed.moe.layer.MoE``); empty for a dense model. A layer pattern is passed expanded,
    one 0/1 per layer (the workload does not parse Megatron's pattern language)."""
    moe = model.moe
    if moe is None:
        return []
    freq = moe.layer_freq
    if not isinstance(freq, int):
        freq = "[" + ",".join("1" if m else "0" for m in moe.moe_layers(model.num_layers)) + "]"
    flags: list[Flag] = [
        ("--num-experts", str(moe.num_experts)),
        ("--ep-size", str(config.ep)),
        ("--moe-router-topk", str(moe.router_topk)),
        ("--moe-ffn-hidden-size", str(moe.ffn_hidden_size or model.ffn_hidden_size)),
        ("--moe-min-capacity", str(moe.deepspeed_min_capacity)),
        ("--moe-layer-freq", str(freq)),
    ]
    if moe.capacity_factor is not None:
        flags.append(("--moe-capacity-factor", str(moe.capacity_factor)))
    if moe.aux_loss_coeff:
        flags.append(("--moe-aux-loss-coeff", str(moe.aux_loss_coeff)))
    return flags


def moe_flags(model: ModelSpec, config: ParallelConfig, framework: str) -> list[Flag]:
    """The MoE flags of ``framework``'s launch: the DeepSpeed workload's or Megatron's."""
    if framework == "deepspeed":
        return deepspeed_moe_flags(model, config)
    return megatron_moe_flags(model, config)


def megatron_precision_flags(training: TrainingSpec) -> list[Flag]:
    """``--bf16`` / ``--fp16``; fp8 is bf16 plus Transformer Engine's FP8 GEMMs (core_v0.15
    arguments.py ``_add_transformer_engine_args``: ``--fp8-format``, ``--fp8-recipe``)."""
    p = training.precision
    if p == "bf16":
        return [("--bf16",)]
    if p == "fp16":
        return [("--fp16",)]
    if p == "fp8":
        return [
            ("--bf16",),
            ("--fp8-format", training.fp8_format),
            ("--fp8-recipe", training.fp8_recipe),
        ]
    return []


def megatron_loss_flags(training: TrainingSpec) -> list[Flag]:
    """``--cross-entropy-loss-fusion`` when the study asks for it (core_v0.15 arguments.py; its
    default implementation, ``native``, is what ``tuner.models.time.estimate`` prices)."""
    return [("--cross-entropy-loss-fusion",)] if training.cross_entropy_fusion else []


# --- Megatron-DeepSpeed -------------------------------------------------------------------------
# microsoft/Megatron-DeepSpeed @f4157bea megatron/arguments.py (line numbers of that commit):
# --tensor-model-parallel-size (1149), --pipeline-model-parallel-size (1154),
# --no-pipeline-parallel (954: GPTModel with DeepSpeed's plain engine instead of GPTModelPipe),
# --sequence-parallel (972), --micro-batch-size (801), --global-batch-size (808),
# --recompute-granularity / --recompute-method / --recompute-num-layers (830-851; GPTModelPipe
# turns full + uniform into its activation_checkpoint_interval, megatron/model/gpt_model.py),
# --zero-stage (1487), --deepspeed-activation-checkpointing (1524; Megatron's checkpoint calls
# go through deepspeed.checkpointing, configured by the ds_config). The same flags as the fork's
# examples_deepspeed/pretrain_llama2_distributed.sh. The partition method has no flag there
# (GPTModelPipe hardcodes type:transformer); bigscience-workshop/Megatron-DeepSpeed @8387ae1
# (the BLOOM-176B fork) spells it --pp-partition-method (megatron/arguments.py:578,
# megatron/model/gpt_model.py:310), so only a non-default split passes it.
MEGATRON_DEEPSPEED_PARTITION_FLAG = "--pp-partition-method"


def megatron_deepspeed_parallel_flags(
    config: ParallelConfig, default_partition: str
) -> list[Flag]:
    """Parallel sizes, batch sizes, recomputation, ZeRO stage and the pipeline partition in
    Megatron-DeepSpeed's flag names (``--deepspeed --deepspeed_config`` and precision are the
    template's). ``default_partition``: the fork's own (``tuner.spec.frameworks``)."""
    c = config
    flags: list[Flag] = [("--tensor-model-parallel-size", str(c.tp))]
    flags.append(("--pipeline-model-parallel-size", str(c.pp)))
    if c.pp == 1:
        flags.append(("--no-pipeline-parallel",))
    else:
        split = parse_split(c.pipeline_split)
        if split.kind == "deepspeed" and split.method != default_partition:
            flags.append((MEGATRON_DEEPSPEED_PARTITION_FLAG, str(split.method)))
    if c.sequence_parallel:
        flags.append(("--sequence-parallel",))
    flags.append(("--micro-batch-size", str(c.micro_batch_size)))
    flags.append(("--global-batch-size", str(c.global_batch_size)))
    flags.append(("--zero-stage", str(c.zero_stage)))
    if c.recompute != "none":
        flags.append(("--recompute-granularity", c.recompute))
    if c.recompute == "full":
        flags.append(("--recompute-method", str(c.recompute_method)))
        flags.append(("--recompute-num-layers", str(c.recompute_num_layers)))
        flags.append(("--deepspeed-activation-checkpointing",))
    return flags


def parallel_args(config: ParallelConfig, num_layers: int, framework: str) -> list[str]:
    """The parallelism words of ``config`` for ``framework`` (``tune best --emit args``)."""
    t = traits(framework)
    if t.megatron_model and t.deepspeed_pipeline:
        flags = megatron_deepspeed_parallel_flags(config, str(t.default_partition))
        return [word for flag in flags for word in flag]
    return megatron_parallel_args(config, num_layers)
