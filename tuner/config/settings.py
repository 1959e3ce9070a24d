"""The ``--set KEY=VALUE`` vocabulary of ``tune estimate``: every knob's name, its short aliases,
and one value parsed and bounded as the study file's space bounds it. Kept apart from the
enumeration so that the command line can name the keys in its help without loading a model."""

from __future__ import annotations

from collections.abc import Iterable

from tuner._loader import did_you_mean
from tuner.errors import ConfigError
from tuner.spec import torchtitan as titan_spec
from tuner.spec.bounds import MAX_BATCH, _size, read_integer
from tuner.spec.frameworks import Framework, traits
from tuner.spec.moe import dense_knob_problem
from tuner.spec.pipeline_split import EVEN, canonical_split
from tuner.spec.recompute import parse_recompute
from tuner.spec.space import KNOB_ALIASES

_INT_KEYS = {
    "tp", "pp", "cp", "vp", "ep", "etp", "micro_batch_size", "recompute_num_layers", "zero_stage",
    "dp_shard", "dp_replicate",
}  # fmt: skip
_BOOL_KEYS = {"sequence_parallel", "distributed_optimizer", "tp_comm_overlap", "compile"}
_CHOICES: dict[str, tuple[str, ...]] = {
    "recompute_method": ("uniform", "block"),
    "moe_token_dispatcher": ("alltoall", "allgather", "flex"),
    "pp_schedule": titan_spec.PP_SCHEDULES,
    "reshard_after_forward": titan_spec.RESHARD_POLICIES,
}


def parse_setting(item: str) -> tuple[str, object]:
    """One ``key=value`` as (the knob's name, its value), or a one-line error naming the key."""
    if "=" not in item:
        raise ConfigError(f"expected key=value, got {item!r}", path="--set")
    raw_key, raw = (p.strip() for p in item.split("=", 1))
    key = KNOB_ALIASES.get(raw_key, raw_key)
    where = f"--set {raw_key}"
    if key in _INT_KEYS:
        if (value := read_integer(raw)) is None:
            raise ConfigError(f"expected an integer, got {raw!r}", path=where)
        if key == "zero_stage" and not 0 <= value <= 3:
            raise ConfigError(f"ZeRO stage must be 0, 1, 2 or 3, got {value}", path=where)
        if key == "dp_shard" and value == -1:  # torchtitan: the ranks left over
            return key, value
        if key != "zero_stage":  # the space file's bound on every axis value
            _size(value, MAX_BATCH, where, "larger than any world or batch")
        return key, value
    if key in _BOOL_KEYS:
        if raw.lower() in ("1", "true", "yes", "on"):
            return key, True
        if raw.lower() in ("0", "false", "no", "off"):
            return key, False
        raise ConfigError(f"expected true or false, got {raw!r}", path=where)
    if key == "pipeline_split":
        try:
            return key, canonical_split(raw)
        except ConfigError as e:
            raise ConfigError(e.reason, path=where) from None
    if key == "recompute":  # none, selective[:MOD+MOD], full[:METHOD:N] (tuner.spec.recompute)
        try:
            knobs = parse_recompute(raw)
        except ConfigError as e:
            raise ConfigError(e.reason, path=where) from None
        if knobs.num_layers == 0:  # taken as unset: full:block:0 became full:block:1
            raise ConfigError(f"{raw!r}: N must be > 0, got 0", path=where)
        return key, raw
    if key in _CHOICES:
        if raw not in _CHOICES[key]:
            raise ConfigError(f"{raw!r} is not one of: {', '.join(_CHOICES[key])}", path=where)
        return key, raw
    known = settable_keys()
    hint = did_you_mean(raw_key, known)
    raise ConfigError(f"unknown key{hint} (known: {', '.join(known)})", path=where)


def parse_settings(
    items: Iterable[str], framework: Framework | None = None, dense: bool = False
) -> dict[str, object]:
    """Every ``--set`` as {knob: value}; a knob given twice (under any of its names), or one the
    study's ``framework`` (or its ``dense`` model: no experts) has no use for, is a one-line error
    rather than silently dropped or shown in a config no launch would run (the study file's space
    refuses the same knobs)."""
    given: dict[str, object] = {}
    spelled: dict[str, str] = {}
    for item in items:
        key, value = parse_setting(item)
        name = item.split("=", 1)[0].strip()
        if key in given:
            raise ConfigError(f"given twice (first as --set {spelled[key]})", path=f"--set {name}")
        if framework is not None:
            _check_framework_knob(key, value, framework, f"--set {name}")
        if dense and (problem := dense_knob_problem(key, value)) is not None:
            raise ConfigError(problem, path=f"--set {name}")
        given[key], spelled[key] = value, name
    return given


def _check_framework_knob(key: str, value: object, framework: Framework, where: str) -> None:
    """torchtitan's knobs only for torchtitan; there, no virtual pipeline or split of its own
    (its stages per rank follow ``pp_schedule``, its split is torchtitan's rule)."""
    fsdp2 = traits(framework).fsdp2
    if not fsdp2 and key in titan_spec.KNOBS:
        raise ConfigError(titan_spec.not_torchtitan(framework), path=where)
    if fsdp2 and key == "vp" and value != 1:
        raise ConfigError(
            "torchtitan's stages per rank follow pp_schedule; vp must be 1", path=where
        )
    if fsdp2 and key == "pipeline_split" and value != EVEN:
        raise ConfigError(
            "torchtitan splits stages by its own rule; split must be even", path=where
        )


def settable_keys() -> list[str]:
    """Every key ``--set KEY=VALUE`` takes: the knobs' names and their short aliases."""
    named = _INT_KEYS | _BOOL_KEYS | set(_CHOICES) | {"pipeline_split", "recompute"}
    return sorted(named | set(KNOB_ALIASES))
