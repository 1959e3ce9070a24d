"""Activation recomputation: the one spelling of a recompute setting, and Megatron's rules for
selective recompute's modules.

A setting is ``none``, ``selective`` (Megatron's default module, the attention core),
``selective:MOD+MOD`` (``--recompute-granularity selective --recompute-modules MOD MOD``) or
``full:METHOD:N``. Tables, keys, Optuna parameters and the leaderboard all read
:func:`recompute_text`; :func:`parse_recompute` reads it back.

The modules and rules are Megatron-LM core_v0.15's (megatron/core/transformer/
transformer_config.py ``__post_init__``, megatron/training/arguments.py ``--recompute-modules``):
core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts; default ``["core_attn"]``;
checked only with selective granularity. What each one drops from the saved activations is in
``tuner.models.memory.recompute``, what it runs again in ``tuner.models.time.recompute``.

Not checked here, with the reason: ``shared_experts recompute cannot work with
--moe-shared-expert-overlap.`` (the tuner never passes that flag, ``tuner.models.moe``); TE >=
2.6.0dev0 for moe_act / layernorm in fp8 (the tuner does not know the nodes' Transformer Engine;
the run fails with Megatron's message and is recorded as a launch error).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.spec.bounds import MAX_LAYERS
from tuner.spec.frameworks import traits
from tuner.spec.moe import MoESpec

RECOMPUTE_MODULES = (
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"
)  # fmt: skip
"""Megatron's allowed ``--recompute-modules``, in its own order (the canonical order here)."""
DEFAULT_MODULES = ("core_attn",)
"""Megatron's default (transformer_config.py: ``recompute_modules = ["core_attn"]``)."""
GRANULARITIES = ("none", "selective", "full")
_SEP = "+"


@dataclass(frozen=True, slots=True)
class RecomputeKnobs:
    """One recompute setting as ``ParallelConfig``'s four fields hold it."""

    granularity: str
    method: str | None = None
    num_layers: int | None = None
    modules: tuple[str, ...] | None = None
    """Selective only: the modules (canonical order); None: Megatron's default."""


def _order(name: str) -> tuple[int, str]:
    known = name in RECOMPUTE_MODULES
    return (RECOMPUTE_MODULES.index(name) if known else len(RECOMPUTE_MODULES), name)


def canonical_modules(modules: Iterable[str] | None) -> tuple[str, ...] | None:
    """``modules`` in Megatron's order without repeats; the default (core_attn alone) is None."""
    if modules is None:
        return None
    out = tuple(sorted(set(modules), key=_order))
    return None if out == DEFAULT_MODULES else out


def invalid_modules_message(names: Iterable[str]) -> str:
    """Megatron's assertion text for unknown modules (its sets, shown in a fixed order)."""
    bad = ", ".join(repr(n) for n in sorted(set(names)))
    allowed = ", ".join(repr(n) for n in RECOMPUTE_MODULES)
    return f"Invalid choices for recompute_modules: {{{bad}}}. Allowed modules are: {{{allowed}}}"


def parse_modules(text: str) -> tuple[str, ...] | None:
    """``core_attn+moe_act`` -> canonical modules; raises a ConfigError (no path) otherwise."""
    names = [n.strip() for n in text.split(_SEP)]
    if not all(names):
        raise ConfigError(f"{text!r}: modules are joined by '+', e.g. core_attn+moe_act")
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown:
        raise ConfigError(invalid_modules_message(unknown))
    if len(set(names)) != len(names):
        raise ConfigError(f"{text!r} lists a module twice")
    return canonical_modules(names)


def recompute_text(
    granularity: str, method: str | None, num_layers: int | None, modules: Iterable[str] | None
) -> str:
    """The spelling of a setting: ``none``, ``selective``, ``selective:core_attn+moe_act``,
    ``full:uniform:1`` (modules are shown with selective only; Megatron ignores them otherwise)."""
    if granularity == "full":
        return f"full:{method}:{num_layers}"
    mods = canonical_modules(modules)
    if granularity != "selective" or mods is None:
        return granularity
    return f"selective:{_SEP.join(mods)}"


def parse_recompute(text: str) -> RecomputeKnobs:
    """The inverse of :func:`recompute_text`; raises a ConfigError (no path) for anything else."""
    base, sep, rest = text.partition(":")
    if base not in GRANULARITIES or (sep and (base == "none" or not rest)):
        raise ConfigError(
            f"{text!r} is not one of: none, selective, selective:MODULE+MODULE, full"
        )
    if base == "selective":
        return RecomputeKnobs("selective", modules=parse_modules(rest) if rest else None)
    if base == "full" and rest:
        method, _, n = rest.partition(":")
        if method not in ("uniform", "block") or not (n.isascii() and n.isdigit()):
            raise ConfigError(f"{text!r}: expected full:uniform:N or full:block:N")
        if len(n.lstrip("0")) > len(str(MAX_LAYERS)) or int(n) > MAX_LAYERS:  # int(): 4,300 digits
            raise ConfigError(f"{text[:60]!r}: N is more layers than any model has "
                              f"({MAX_LAYERS:,})")  # fmt: skip
        return RecomputeKnobs("full", method, int(n))
    return RecomputeKnobs(base)


def recompute_rule_violations(
    granularity: str, method: str | None, num_layers: int | None, per_rank: int
) -> list[tuple[str, str]]:
    """transformer_config.py's granularity / method / layer-count checks (``per_rank``: layers
    per pipeline rank and virtual stage), with its messages."""
    if granularity != "full":
        if method is not None or num_layers is not None:
            return [("recompute_method", "recompute method is only used with full "
                     f"recomputation, got {granularity} with method {method}")]  # fmt: skip
        return []
    if method not in ("uniform", "block"):
        return [("recompute_method", 'Using recompute_granularity: full so recompute_method '
                 'must be "block" or "uniform"')]  # fmt: skip
    if num_layers is None or not 1 <= num_layers <= per_rank:
        return [("recompute_num_layers", "When using recompute_granularity: full "
                 "recompute_num_layers must be between 1 and num_layers_per_pipeline_rank: "
                 f"{per_rank}, got {num_layers}")]  # fmt: skip
    return []


def module_rule_violations(
    granularity: str,
    modules: tuple[str, ...] | None,
    moe: MoESpec | None,
    num_layers: int,
    framework: str,
    precision: str = "bf16",
    fp8_recipe: str = "delayed",
) -> list[tuple[str, str]]:
    """(rule id, message) for every rule the modules break: Megatron's own (its messages), and
    the tuner's for a module that does nothing on the model (``moe``: its experts, None for a
    dense one; ``num_layers``: its layers), whose config would repeat another."""
    if modules is None:
        return []
    if granularity != "selective":
        shown = _SEP.join(modules)
        return [("recompute_modules_granularity", "recompute modules are only used with "
                 f"selective recomputation, got {granularity} with {shown}")]  # fmt: skip
    t = traits(framework)
    if not t.megatron_model or t.deepspeed_pipeline:  # Megatron-LM core has the flag
        return [("recompute_modules_framework", "--recompute-modules is Megatron-LM core's; "
                 "this framework recomputes the attention core only (use selective)")]  # fmt: skip
    if not modules:
        return [("recompute_modules_empty", "selective recompute with no modules recomputes "
                 "nothing (repeats recompute none)")]  # fmt: skip
    unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
    if unknown:  # transformer_config.py asserts it
        return [("recompute_modules_invalid", invalid_modules_message(unknown))]
    out: list[tuple[str, str]] = []
    mods = set(modules)
    if "moe_act" in mods and (moe is None or not moe.grouped_gemm):
        text = "moe_act in recompute_modules is only supported with moe_grouped_gemm."
        out.append(("moe_act_grouped_gemm", text))
    if "mla_up_proj" in mods:  # the tuner's models have no multi-latent attention
        out.append(("mla_up_proj_mla", "mla_up_proj in recompute_modules is only supported with "
                    "multi_latent_attention."))  # fmt: skip
    if precision == "fp8" and fp8_recipe == "delayed" and mods & {"moe_act", "layernorm"}:
        text = "Delayed scaling does not support moe_act and layernorm recompute for fp8."
        out.append(("fp8_delayed_recompute", text))
    all_moe = moe is not None and all(moe.moe_layers(num_layers))
    return out + _noop_modules(mods, moe, all_moe)


def _noop_modules(
    mods: set[str], moe: MoESpec | None, all_layers_moe: bool
) -> list[tuple[str, str]]:
    """Modules with nothing to recompute on this model (megatron/core/transformer/
    transformer_layer.py, moe/moe_layer.py; norms under Transformer Engine, the templates'
    ``--transformer-impl`` default: gpt_layer_specs.py fuses the input norm into linear_qkv and
    a dense layer's pre-MLP norm into linear_fc1, leaving IdentityOp, which layernorm skips)."""
    idle: list[str] = []
    if moe is None:
        idle += [m for m in ("moe", "shared_experts", "layernorm") if m in mods]
    elif not moe.shared and "shared_experts" in mods:
        idle.append("shared_experts")
    if all_layers_moe and "mlp" in mods:
        idle.append("mlp")  # transformer_layer.py: recompute_mlp only when not an MoELayer
    if "moe" in mods:  # the MoE layer's checkpoint already holds its experts and shared experts
        idle += [m for m in ("moe_act", "shared_experts") if m in mods and m not in idle]
    if not idle:
        return []
    names = ", ".join(sorted(set(idle), key=_order))
    return [("recompute_module_idle", f"recompute module {names} has nothing of its own to "
             "recompute on this model (the config repeats the one without it)")]  # fmt: skip
