"""The Megatron-Bridge config overrides a :class:`ParallelConfig` stands for, and its exports.

Megatron-Bridge (``tuner.spec.frameworks.MEGATRON_BRIDGE_RELEASE``) runs a recipe, a function
returning one ``ConfigContainer``, through its recipe script ``scripts/training/run_recipe.py``,
which takes trailing ``section.field=value`` overrides (Hydra/OmegaConf syntax). A recipe sets
every field, so an override that is left out keeps the *recipe's* value, not Megatron-LM's
default: each searched knob is therefore always rendered, its "off" value included, where
Megatron-LM's flags can leave a flag out. The field names and types are those of Bridge's config
dataclasses at the pinned release (``tools/bridge_fields.py`` writes the table the tests check
every override against).

The ``megatron_bridge`` template receives :func:`trial_overrides` as ``bridge_overrides``;
``tune best --emit bridge-overrides`` prints :func:`parallel_overrides` (the searched knobs, the
same set ``--emit args`` prints in Megatron-LM's flag names) and ``--emit bridge-recipe`` the same
as a Python function that sets them on a recipe's ``ConfigContainer``.

Two things a recipe may hold are outside the overrides: a ``comm_overlap`` section
(``CommOverlapConfig.setup`` re-derives ``model.tp_comm_overlap`` and the DDP overlaps from it)
and the fusions, CUDA graphs and ``env_vars``; without Bridge importable here the recipe's
``ConfigContainer`` is not resolved, so those stay the recipe's and are not modelled.
"""

from __future__ import annotations

import re
import shlex

from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError
from tuner.spec.frameworks import traits
from tuner.spec.pipeline_split import EVEN, parse_split
from tuner.spec.study import ModelSpec, StudySpec, TrainingSpec

Value = bool | int | float | str | None | tuple[str, ...]
Override = tuple[str, Value]
"""One field and its value, e.g. ``("model.tensor_model_parallel_size", 8)``."""


# bridge/training/mixed_precision.py (v0.6.0) registers these recipe names
_MIXED_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp32": None}
_BARE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def parallel_overrides(config: ParallelConfig, model: ModelSpec) -> list[Override]:
    """Parallel sizes, pipeline split, batch sizes, recomputation, optimizer sharding and (for
    a MoE ``model``) expert parallelism as Bridge fields: the knobs of
    :func:`tuner.launch.megatron_flags.megatron_parallel_flags` and the parallel part of
    ``megatron_moe_flags``, one field per flag, every one explicit. Bridge takes ``vp`` as the
    chunk count where Megatron-LM's even split passes layers per chunk."""
    c = config
    out: list[Override] = [
        ("model.tensor_model_parallel_size", c.tp),
        ("model.pipeline_model_parallel_size", c.pp),
        ("model.context_parallel_size", c.cp),
        *split_overrides(c),
        ("model.sequence_parallel", c.sequence_parallel),
        ("model.tp_comm_overlap", c.tp_comm_overlap),
        ("train.micro_batch_size", c.micro_batch_size),
        ("train.global_batch_size", c.global_batch_size),
        *recompute_overrides(c),
        ("ddp.overlap_grad_reduce", True),  # as the Megatron-LM flags always ask
        # Bridge turns the distributed optimizer (and the param gather overlap) on for both the
        # DDP and the optimizer config when either asks (training/config.py
        # _validate_and_sync_distributed_optimizer_settings): "off" must be said in both.
        ("ddp.use_distributed_optimizer", c.distributed_optimizer),
        ("optimizer.use_distributed_optimizer", c.distributed_optimizer),
        ("ddp.overlap_param_gather", c.distributed_optimizer),
        ("optimizer.overlap_param_gather", c.distributed_optimizer),
    ]
    return out + (expert_parallel_overrides(c) if model.moe is not None else [])


def split_overrides(c: ParallelConfig) -> list[Override]:
    """The virtual pipeline size and the uneven split (``tuner.spec.pipeline_split``)."""
    vp = c.vp if c.vp > 1 else None
    first: int | None = None
    last: int | None = None
    layout: str | None = None
    embedding = loss = False
    if c.pp > 1 and c.pipeline_split != EVEN:
        s = parse_split(c.pipeline_split)
        if s.kind == "layout":
            layout, vp = str(s.layout), None  # the layout gives the virtual size
        else:
            first, last, embedding, loss = s.first, s.last, bool(s.embedding), bool(s.loss)
    return [
        ("model.virtual_pipeline_model_parallel_size", vp),
        ("model.num_layers_in_first_pipeline_stage", first),
        ("model.num_layers_in_last_pipeline_stage", last),
        ("model.account_for_embedding_in_pipeline_split", embedding),
        ("model.account_for_loss_in_pipeline_split", loss),
        ("model.pipeline_model_parallel_layout", layout),
    ]


def recompute_overrides(c: ParallelConfig) -> list[Override]:
    """Granularity, modules (selective), method and layers (full); None where unused, as
    TransformerConfig requires (recompute_num_layers must be None with selective)."""
    full = c.recompute == "full"
    out: list[Override] = [
        ("model.recompute_granularity", None if c.recompute == "none" else c.recompute),
        ("model.recompute_method", c.recompute_method if full else None),
        ("model.recompute_num_layers", c.recompute_num_layers if full else None),
    ]
    if c.recompute == "selective":  # None: TransformerConfig's default, core_attn
        modules = None if c.recompute_modules is None else tuple(c.recompute_modules)
        out.append(("model.recompute_modules", modules))
    return out


def expert_parallel_overrides(c: ParallelConfig) -> list[Override]:
    """Expert parallelism and the dispatcher. ``flex`` runs DeepEP, its only backend in
    core_v0.15 (``--moe-enable-deepep``; Bridge: moe_flex_dispatcher_backend)."""
    out: list[Override] = [
        ("model.expert_model_parallel_size", c.ep),
        ("model.expert_tensor_parallel_size", c.etp),
        ("model.moe_token_dispatcher_type", c.moe_token_dispatcher),
    ]
    if c.moe_token_dispatcher == "flex":
        out.append(("model.moe_flex_dispatcher_backend", "deepep"))
    return out


def model_overrides(model: ModelSpec) -> list[Override]:
    """The study's model shape and experts, so a trial runs the model the tuner modelled (the
    recipe's other model settings stay). The sequence length is the dataset's: the recipe
    script copies it to the model (recipe_runner.sync_model_dataset_sequence_length)."""
    out: list[Override] = [
        ("model.num_layers", model.num_layers),
        ("model.hidden_size", model.hidden_size),
        ("model.ffn_hidden_size", model.ffn_hidden_size),
        ("model.num_attention_heads", model.num_attention_heads),
        ("model.num_query_groups", model.query_groups),
        ("dataset.seq_length", model.seq_length),
    ]
    if model.add_qkv_bias:  # Qwen-style: a bias on Q, K and V only (TransformerConfig's field)
        out.append(("model.add_qkv_bias", True))
    moe = model.moe
    if moe is None:
        return out
    out += [
        ("model.num_moe_experts", moe.num_experts),
        ("model.moe_router_topk", moe.router_topk),
        ("model.moe_ffn_hidden_size", moe.ffn_hidden_size or model.ffn_hidden_size),
        ("model.moe_grouped_gemm", moe.grouped_gemm),
        ("model.moe_permute_fusion", moe.permute_fusion),
        ("model.moe_router_load_balancing_type", moe.load_balancing),
        ("model.moe_aux_loss_coeff", float(moe.aux_loss_coeff or 0.0)),
    ]
    if isinstance(moe.layer_freq, int):
        out.append(("model.moe_layer_freq", moe.layer_freq))
    if moe.capacity_factor is not None:
        out.append(("model.moe_expert_capacity_factor", float(moe.capacity_factor)))
    return out


def training_overrides(training: TrainingSpec) -> list[Override]:
    """Precision (one of Bridge's mixed-precision recipe names) and the loss fusion."""
    if training.precision not in _MIXED_PRECISION:
        raise ConfigError(
            f"{training.precision} has no Megatron-Bridge mixed_precision recipe here",
            path="training.precision",
        )
    out: list[Override] = [("mixed_precision", _MIXED_PRECISION[training.precision])]
    if training.precision == "fp32":
        out += [("model.bf16", False), ("model.fp16", False)]
    out.append(("model.cross_entropy_loss_fusion", training.cross_entropy_fusion))
    return out


def run_overrides(spec: StudySpec) -> list[Override]:
    """A trial's and a full run's: the run's iterations, a log line each iteration with
    throughput, the study's process-group timeout (Megatron-LM's template keeps the same
    flags in both)."""
    return [
        ("train.train_iters", spec.launch.train_iters),
        ("logger.log_interval", 1),
        ("logger.log_throughput", True),
        ("dist.distributed_timeout_minutes", spec.launch.distributed_timeout_minutes),
    ]


def short_run_overrides(spec: StudySpec) -> list[Override]:
    """A trial's short run (:func:`run_overrides`), with no validation and no checkpoint saved
    or loaded; a full run (``tune best``) keeps the recipe's, as it keeps its evaluation and
    checkpoints in Megatron-LM's template."""
    return run_overrides(spec) + [
        ("validation.eval_iters", 0),
        ("validation.eval_interval", None),
        ("checkpoint.save", None),
        ("checkpoint.load", None),
        ("checkpoint.save_interval", None),
    ]


def trial_overrides(
    spec: StudySpec, config: ParallelConfig, *, full_run: bool = False
) -> list[Override]:
    """Everything a trial's recipe run overrides: the searched knobs (always the global batch:
    the recipe script rescales it on benchmark recipes when the world size differs), the model,
    precision and the short-run settings; ``full_run``: the same but the short run's (``tune
    best``'s launch script: the recipe's evaluation and checkpoints stay)."""
    return (
        parallel_overrides(config, spec.model)
        + model_overrides(spec.model)
        + training_overrides(spec.training)
        + (run_overrides(spec) if full_run else short_run_overrides(spec))
    )


def hydra_value(value: Value) -> str:
    """``value`` in the override grammar: true/false, null, numbers, bare or quoted strings,
    ``[a,b]`` lists."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if _BARE.match(value) and value not in ("true", "false", "null"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def override_words(overrides: list[Override]) -> list[str]:
    """``field=value`` words, one per override (an argv fragment)."""
    return [f"{name}={hydra_value(value)}" for name, value in overrides]


def python_value(value: Value) -> str:
    """``value`` as a Python literal."""
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def recipe_function(overrides: list[Override], *, recipe: str | None, note: str) -> str:
    """A Python function that sets ``overrides`` on a recipe's ``ConfigContainer``."""
    lines = [
        "from megatron.bridge.training.config import ConfigContainer",
        "",
        "",
        "def apply_tuned(cfg: ConfigContainer) -> ConfigContainer:",
        f'    """{note}"""',
    ]
    for name, value in overrides:
        if "." not in name:
            lines.append(f"    cfg.{name} = {python_value(value)}")
            continue
        section, field = name.split(".", 1)
        lines.append(f"    cfg.{section}.{field} = {python_value(value)}")
    lines.append("    return cfg")
    if recipe:  # a comment: a line break in the study's value must not end it
        shown = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode()
                        for ch in recipe)  # fmt: skip
        lines += ["", "", f"# usage: cfg = apply_tuned({shown}())"]
    return "\n".join(lines) + "\n"


def emit(spec: StudySpec, config: ParallelConfig, what: str, *, trial: int | None = None) -> str:
    """``tune best --emit bridge-overrides|bridge-recipe`` for any study whose framework runs on
    Megatron-Core (a Megatron-LM study's answer carries to Bridge); ``trial``: the config is
    that trial's (``--trial``), not the fastest."""
    if not traits(spec.framework).megatron_core:
        raise ConfigError(
            f"--emit {what} needs a config Megatron-Core can express; framework "
            f"{spec.framework} is not built on it",
            path="framework",
        )
    overrides = parallel_overrides(config, spec.model)
    if what == "bridge-overrides":  # shell words, as the template passes them to a trial
        return shlex.join(override_words(overrides)) + "\n"
    which = "The fastest config" if trial is None else f"Trial {trial}'s config (--trial)"
    note = f"{which} of study {spec.name}, from tuner:\n    {config.key()}\n    "
    return recipe_function(overrides, recipe=spec.launch.recipe, note=note)
