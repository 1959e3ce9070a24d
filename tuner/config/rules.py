"""The frameworks' own validity rules over a :class:`~tuner.config.parallel.ParallelConfig`.

The rules are Megatron-LM's ``validate_args`` / ``TransformerConfig`` checks and DeepSpeed's engine
checks, with the numbers that broke them (see shared reference ``megatron-deepspeed-interfaces.md``
section 1e and 3a). :func:`validate` lists every broken rule; :func:`check` raises on the first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tuner.config.parallel import ParallelConfig
from tuner.config.pipe_layers import pipe_layers
from tuner.config.torchtitan_rules import torchtitan_violations
from tuner.config.tp_overlap import tp_overlap_rule_violations
from tuner.errors import ConfigError, SplitError, ValidationError
from tuner.spec.deepspeed_partition import deepspeed_stages
from tuner.spec.frameworks import MEGATRON_DEEPSPEED_FORK, traits
from tuner.spec.moe import deepspeed_moe_rule_violations, moe_rule_violations
from tuner.spec.pipeline_split import EVEN, megatron_chunks, parse_split
from tuner.spec.recompute import (
    module_rule_violations,
    recompute_rule_violations,
)
from tuner.spec.study import (
    Framework,
    ModelSpec,
    TrainingSpec,
)


@dataclass(frozen=True, slots=True)
class RuleViolation:
    """One broken rule: a short stable ``rule`` id (for counts) and a message with the numbers."""

    rule: str
    message: str


def _check_sizes(c: ParallelConfig, world_size: int) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    for name in ("tp", "pp", "cp", "dp", "vp", "ep", "micro_batch_size", "global_batch_size"):
        if getattr(c, name) < 1:
            out.append(RuleViolation("positive", f"{name} must be >= 1, got {getattr(c, name)}"))
    if out:
        return out
    mp = c.model_parallel_size
    if world_size % mp:
        out.append(
            RuleViolation(
                "world_divisible",
                f"tp({c.tp}) * pp({c.pp}) * cp({c.cp}) = {mp} does not divide world size "
                f"{world_size}",
            )
        )
    elif c.dp * mp != world_size:
        out.append(
            RuleViolation(
                "dp_mismatch",
                f"dp({c.dp}) must be world size {world_size} / (tp*pp*cp = {mp}) = "
                f"{world_size // mp}",
            )
        )
    return out


def _check_model_split(
    c: ParallelConfig, m: ModelSpec, framework: Framework
) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    a, g = m.num_attention_heads, m.query_groups
    if a % c.tp:
        out.append(
            RuleViolation(
                "heads_tp",
                f"num_attention_heads ({a}) must be a multiple of tensor_model_parallel_size "
                f"({c.tp})",
            )
        )
    if g % c.tp:
        out.append(
            RuleViolation(
                "query_groups_tp",
                f"num_query_groups ({g}) must be a multiple of tensor_model_parallel_size "
                f"({c.tp})",
            )
        )
    if m.ffn_hidden_size % c.tp:
        out.append(
            RuleViolation(
                "ffn_tp", f"ffn_hidden_size {m.ffn_hidden_size} is not divisible by {c.tp}"
            )
        )
    ds_pipe = traits(framework).deepspeed_pipeline  # DeepSpeed partitions any remainder
    if c.vp == 1 and c.pipeline_split == EVEN and not ds_pipe and m.num_layers % c.pp:
        out.append(
            RuleViolation(
                "layers_pp",
                f"num_layers ({m.num_layers}) is not divisible by the pipeline-model-parallel "
                f"size ({c.pp})",
            )
        )
    return out


def _check_pipeline(c: ParallelConfig, m: ModelSpec) -> list[RuleViolation]:
    if c.vp == 1:
        return []
    if c.pp == 1:
        return [
            RuleViolation(
                "vp_needs_pp",
                f"interleaved schedule (vp={c.vp}) needs pipeline-model-parallel size > 1, "
                f"got pp={c.pp}",
            )
        ]
    if c.pipeline_split == EVEN and m.num_layers % (c.pp * c.vp):
        return [
            RuleViolation(
                "layers_pp_vp",
                f"num_layers ({m.num_layers}) is not divisible by pp({c.pp}) * vp({c.vp}) = "
                f"{c.pp * c.vp} (layers per virtual stage must be whole)",
            )
        ]
    return []


def _check_interleaved_batch(c: ParallelConfig) -> list[RuleViolation]:
    """megatron/core/pipeline_parallel/schedules.py (interleaved): micro-batches run in groups of
    ``microbatch_group_size_per_vp_stage`` (default pp), which must lie in [pp, m], and the last
    group may not be smaller than pp."""
    m, p = c.num_microbatches, c.pp
    if c.vp == 1 or p == 1:
        return []
    if p > m:
        message = (
            "The number of contiguous micro-batches in a virtual pipeline stageshould range in "
            f"[PP={p} , M={m}]"
        )
    elif m % p:
        message = (
            "The remainder of M (the total micro-batches) divided by N (number of contiguous "
            "micro-batches in a virtual pipeline stage) should be 0, or larger than or equal to "
            f"the pipeline-parallel size, but it is {m % p}. Otherwise, it introduces "
            "dependency bubbles in the pipeline and reduces throughput."
        )
    else:
        return []
    return [RuleViolation("interleaved_microbatches", message)]


def _check_split(c: ParallelConfig, m: ModelSpec, framework: Framework) -> list[RuleViolation]:
    """The ``pipeline_split`` with the framework's own rules (``tuner.spec.pipeline_split``)."""
    try:
        s = parse_split(c.pipeline_split)
    except ConfigError as e:
        return [RuleViolation("split_syntax", f"pipeline_split: {e}")]
    t = traits(framework)
    if s.framework not in (None, t.split_family):
        return [
            RuleViolation(
                "split_framework",
                f"pipeline_split {c.pipeline_split} is a {s.framework} setting, not {framework}'s",
            )
        ]
    if c.pp == 1:
        if s.kind == "even":
            return []
        return [
            RuleViolation(
                "split_needs_pp",
                f"pipeline_split {c.pipeline_split} needs pipeline-model-parallel size > 1 "
                "(at pp=1 it repeats the even config)",
            )
        ]
    try:
        if t.deepspeed_pipeline:
            method = s.method if s.kind == "deepspeed" else t.default_partition
            deepspeed_stages(str(method), pipe_layers(m, framework, c.tp), c.pp)
        elif s.kind != "even":
            megatron_chunks(m.num_layers, c.pp, c.vp, c.pipeline_split)
    except SplitError as e:
        return [RuleViolation(e.rule, e.message)]
    return []


def _check_batch(c: ParallelConfig) -> list[RuleViolation]:
    per_step = c.micro_batch_size * c.dp
    if c.global_batch_size % per_step:
        return [
            RuleViolation(
                "global_batch",
                f"global batch size ({c.global_batch_size}) is not divisible by micro batch size "
                f"({c.micro_batch_size}) times data parallel size ({c.dp})",
            )
        ]
    return []


def _check_sequence(c: ParallelConfig, m: ModelSpec) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    s = m.seq_length
    if c.sequence_parallel and c.tp == 1:
        out.append(
            RuleViolation(
                "sp_needs_tp",
                "sequence parallel needs tp > 1 (Megatron silently disables it at tp=1, so this "
                "config repeats sp=false)",
            )
        )
    if c.sequence_parallel and (s // c.cp) % c.tp:
        out.append(
            RuleViolation(
                "sp_seq_tp",
                f"sequence parallel needs seq_length/cp ({s // c.cp}) divisible by tp ({c.tp})",
            )
        )
    if c.cp > 1 and s % (2 * c.cp):
        out.append(
            RuleViolation(
                "cp_seq",
                f"seq_length ({s}) should be a multiple of 2 * context-parallel-size "
                f"({2 * c.cp}) if context-parallel-size > 1",
            )
        )
    return out


def _check_framework(c: ParallelConfig, framework: Framework) -> list[RuleViolation]:
    t = traits(framework)
    out: list[RuleViolation] = []
    if not t.deepspeed_optimizer:
        if c.zero_stage:
            out.append(
                RuleViolation(
                    "zero_megatron",
                    f"ZeRO stage {c.zero_stage} is a DeepSpeed setting; Megatron shards the "
                    "optimizer with distributed_optimizer",
                )
            )
        return out
    if c.distributed_optimizer:
        out.append(
            RuleViolation(
                "distopt_deepspeed", "distributed_optimizer is Megatron's; use zero_stage"
            )
        )
    if not t.megatron_model and (c.tp > 1 or c.cp > 1 or c.vp > 1 or c.sequence_parallel):
        out.append(
            RuleViolation(
                "deepspeed_parallel",
                f"the DeepSpeed workload has no tensor/context/virtual-pipeline parallelism "
                f"(tp={c.tp}, cp={c.cp}, vp={c.vp}, sp={c.sequence_parallel})",
            )
        )
    if c.pp > 1 and c.zero_stage >= 2:
        # deepspeed/runtime/pipe/engine.py PipelineEngine.__init__ asserts it
        out.append(
            RuleViolation(
                "zero_pipeline",
                f"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism "
                f"(zero_stage={c.zero_stage}, pp={c.pp})",
            )
        )
    if not t.megatron_model and c.recompute == "selective":
        out.append(
            RuleViolation(
                "deepspeed_selective",
                "DeepSpeed checkpoints whole blocks: recompute must be none or full",
            )
        )
    if t.megatron_model:
        out += _check_megatron_deepspeed(c)
    return out


def _check_megatron_deepspeed(c: ParallelConfig) -> list[RuleViolation]:
    """What microsoft/Megatron-DeepSpeed's arguments.py and GPTModelPipe lack or refuse."""
    out: list[RuleViolation] = []
    if c.cp > 1:
        out.append(
            RuleViolation(
                "mds_context_parallel",
                f"{MEGATRON_DEEPSPEED_FORK} has no context parallelism (no "
                f"--context-parallel-size; its --ds-sequence-parallel-size is DeepSpeed-Ulysses), "
                f"got cp={c.cp}",
            )
        )
    if c.vp > 1:
        out.append(
            RuleViolation(
                "mds_interleaved",
                f"DeepSpeed's PipelineEngine, which runs {MEGATRON_DEEPSPEED_FORK}'s "
                f"GPTModelPipe, has no interleaved schedule (vp={c.vp})",
            )
        )
    if c.pp > 1 and c.recompute == "full" and c.recompute_method == "block":
        # megatron/model/gpt_model.py: interval = recompute_num_layers for uniform only
        out.append(
            RuleViolation(
                "mds_recompute_block",
                "deepspeed's pipeline doesn't support the block recompute method "
                f"({MEGATRON_DEEPSPEED_FORK} GPTModelPipe checkpoints every "
                "recompute_num_layers layers: use recompute_method uniform with pp > 1)",
            )
        )
    return out


RuleArgs = tuple[ModelSpec, int, Framework, TrainingSpec | None, int | None]
"""What the rules read besides the config: (model, world size, framework, training, GPUs per
node), as :func:`validate` takes them."""


def _violations(pairs: Iterable[tuple[str, str]]) -> list[RuleViolation]:
    """The (rule, message) pairs of the rule modules that return plain pairs, as violations."""
    return [RuleViolation(rule, message) for rule, message in pairs]


def _recompute_rules(c: ParallelConfig, a: RuleArgs) -> list[RuleViolation]:
    model = a[0]
    per_rank = model.num_layers // (c.pp * c.vp) if c.pp * c.vp else model.num_layers
    rules = recompute_rule_violations(
        c.recompute, c.recompute_method, c.recompute_num_layers, per_rank
    )
    return _violations(rules)


def _module_rules(c: ParallelConfig, a: RuleArgs) -> list[RuleViolation]:
    model, _, framework, t, _ = a
    rules = module_rule_violations(
        c.recompute, c.recompute_modules, model.moe, model.num_layers, framework,
        *((t.precision, t.fp8_recipe) if t else ()),
    )  # fmt: skip
    return _violations(rules)


def _overlap_rules(c: ParallelConfig, a: RuleArgs) -> list[RuleViolation]:
    model, _, framework, _, gpn = a
    rules = tp_overlap_rule_violations(
        c.tp_comm_overlap, c.tp, c.sequence_parallel, framework, model.moe, gpn
    )
    return _violations(rules)


RuleCheck = Callable[[ParallelConfig, RuleArgs], list[RuleViolation]]
"""One block of rules over a config."""

RULE_BLOCKS: tuple[tuple[tuple[str, ...], RuleCheck], ...] = (
    (("tp", "pp", "cp", "dp", "vp", "ep", "micro_batch_size", "global_batch_size"),
     lambda c, a: _check_sizes(c, a[1])),
    (("tp", "pp", "vp", "pipeline_split"), lambda c, a: _check_model_split(c, a[0], a[2])),
    (("pp", "vp", "pipeline_split"), lambda c, a: _check_pipeline(c, a[0])),
    (("tp", "pp", "vp", "pipeline_split"), lambda c, a: _check_split(c, a[0], a[2])),
    (("dp", "micro_batch_size", "global_batch_size"), lambda c, a: _check_batch(c)),
    (("pp", "dp", "vp", "micro_batch_size", "global_batch_size"),
     lambda c, a: _check_interleaved_batch(c)),
    (("tp", "cp", "sequence_parallel"), lambda c, a: _check_sequence(c, a[0])),
    (("pp", "vp", "recompute", "recompute_method", "recompute_num_layers"), _recompute_rules),
    (("tp", "pp", "cp", "vp", "sequence_parallel", "recompute", "recompute_method",
      "distributed_optimizer", "zero_stage"), lambda c, a: _check_framework(c, a[2])),
    (("recompute", "recompute_modules"), _module_rules),
    (("tp", "sequence_parallel", "tp_comm_overlap"), _overlap_rules),
    (("tp", "pp", "ep", "etp", "micro_batch_size", "sequence_parallel", "zero_stage",
      "moe_token_dispatcher"),
     lambda c, a: _violations(_moe_rules(c, a[0], a[1], a[2]))),
)  # fmt: skip
"""The Megatron-family rules in :func:`validate`'s order, each block with every config knob it
reads (a block's verdict is a function of those values, with the :data:`RuleArgs` of one study:
``tuner.config.rule_table`` keeps one verdict per distinct projection; torchtitan's rules are
``torchtitan_rules``' own)."""


def validate(
    config: ParallelConfig,
    model: ModelSpec,
    world_size: int,
    framework: Framework,
    training: TrainingSpec | None = None,
    gpus_per_node: int | None = None,
) -> list[RuleViolation]:
    """Every rule ``config`` breaks for ``model`` on ``world_size`` ranks (empty: valid);
    ``training``: the study's precision and FP8 recipe, which some recompute modules need;
    ``gpus_per_node``: the cluster's, for the rules that need a group inside a node. A size
    under 1 (rule ``positive``) is the only thing listed when there is one."""
    if traits(framework).fsdp2:  # torchtitan checks its own way (tuner.config.torchtitan_rules)
        return _violations(torchtitan_violations(config, model, world_size))
    args: RuleArgs = (model, world_size, framework, training, gpus_per_node)
    (_, sizes), *rest = RULE_BLOCKS
    out = sizes(config, args)
    if out and out[0].rule == "positive":
        return out
    for _, check in rest:
        out += check(config, args)
    return out


def _moe_rules(
    c: ParallelConfig, model: ModelSpec, world: int, framework: Framework
) -> list[tuple[str, str]]:
    """Megatron's expert-parallel rules, or DeepSpeed-MoE's for framework deepspeed."""
    if framework == "deepspeed":
        return deepspeed_moe_rule_violations(
            model.moe, ep=c.ep, etp=c.etp, dispatcher=c.moe_token_dispatcher, dp=world // c.pp,
            pp=c.pp, zero_stage=c.zero_stage, tokens=c.micro_batch_size * model.seq_length,
        )  # fmt: skip
    return moe_rule_violations(
        model.moe, model.ffn_hidden_size, tp=c.tp, pp=c.pp, ep=c.ep, etp=c.expert_tp,
        sp=c.sequence_parallel, dispatcher=c.moe_token_dispatcher, world=world,
    )  # fmt: skip


def check(config: ParallelConfig, model: ModelSpec, world_size: int, framework: Framework) -> None:
    """Raise :class:`ValidationError` with every broken rule (``; ``-joined) if any."""
    errors = validate(config, model, world_size, framework)
    if errors:
        raise ValidationError("; ".join(e.message for e in errors))
