"""The rule table (one verdict per block and distinct projection) against ``validate``, config by
config, and each knob of each block's key shown to matter."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import pytest

from tuner.config.build import FIELDS, built, replaced
from tuner.config.parallel import ParallelConfig
from tuner.config.rule_table import RuleTable
from tuner.config.rules import RULE_BLOCKS, RuleArgs, validate
from tuner.space.enumerate import iter_configs, iter_values, study_violations
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec

STUDIES = ("gpt-70b", "llama3-8b", "mixtral-8x7b", "demo", "demo-moe", "demo-fsdp")


def _moe_space() -> StudySpec:
    """mixtral-8x7b over EP, ETP, dispatchers, recompute modules and userbuffers."""
    spec = load_study("mixtral-8x7b")
    knobs: dict[str, Any] = dict(
        tp=(1, 2, 4), pp=(1, 2, 4), vp=(1, 2), micro_batch_size=(1, 2),
        sequence_parallel=(True, False), ep=(1, 2, 8), etp=(1, 2),
        recompute=("none", "selective:core_attn+moe_act", "full"),
        recompute_method=("uniform", "block"), recompute_num_layers=(1, 3),
        distributed_optimizer=(True, False), tp_comm_overlap=(False, True),
        moe_token_dispatcher=("alltoall", "allgather", "flex"),
    )  # fmt: skip
    return dataclasses.replace(spec, space=dataclasses.replace(spec.space, **knobs))


def _spaces() -> list[StudySpec]:
    return [load_study(name) for name in STUDIES] + [_moe_space()]


def _first(spec: StudySpec, config: ParallelConfig) -> str | None:
    errors = study_violations(config, spec)
    return errors[0].rule if errors else None


@pytest.mark.parametrize("spec", _spaces(), ids=lambda s: s.name)
def test_table_gives_validates_first_rule_on_every_config(spec: StudySpec) -> None:
    table = RuleTable(
        spec.model, spec.world_size, spec.framework, spec.training, spec.cluster.gpus_per_node
    )
    values = list(iter_values(spec))
    got = [table.first(v) for v in values]
    assert got == [_first(spec, built(v)) for v in values]
    assert None in got


def test_the_spaces_break_many_rules() -> None:
    """The spaces above hold invalid configs of many rules, so the agreement is not vacuous."""
    rules = {_first(spec, c) for spec in _spaces() for c in iter_configs(spec)}
    assert len(rules - {None}) >= 8


def test_iter_configs_builds_iter_values() -> None:
    spec = _moe_space()
    configs = list(iter_configs(spec))
    assert [tuple(getattr(c, f) for f in FIELDS) for c in configs] == list(iter_values(spec))


def test_validate_is_its_blocks_in_order() -> None:
    spec = _moe_space()
    args: RuleArgs = (spec.model, spec.world_size, spec.framework, spec.training, 8)
    for config in itertools.islice(iter_configs(spec), 0, None, 7):
        want = [e for _, check in RULE_BLOCKS for e in check(config, args)]
        assert validate(config, *args) == want


# Values each knob takes in the search below for a pair of configs that differ only in it.
_VALUES: dict[str, tuple[Any, ...]] = {
    "tp": (1, 2, 3, 8), "pp": (1, 3, 2, 8), "cp": (1, 2, 3), "dp": (1, 2, 3, 64),
    "vp": (1, 2, 3), "ep": (1, 3, 16), "micro_batch_size": (1, 3, 64),
    "global_batch_size": (1, 3, 1024), "sequence_parallel": (True, False),
    "recompute": ("full", "none", "selective"), "recompute_method": (None, "uniform", "block"),
    "recompute_num_layers": (None, 1, 3, 100), "recompute_modules": (None, ("moe",), ("mlp",)),
    "distributed_optimizer": (True, False), "zero_stage": (0, 2, 1, 3),
    "pipeline_split": ("even", "first=5", "first=4,last=4", "bogus"),
    "etp": (None, 1, 2, 3), "moe_token_dispatcher": ("alltoall", "allgather", "flex"),
    "tp_comm_overlap": (True, False),
}  # fmt: skip
_BASES: tuple[dict[str, Any], ...] = (
    {},
    {"tp": 2, "dp": 32, "sequence_parallel": True},
    {"pp": 2, "dp": 32, "vp": 2, "recompute": "full", "recompute_method": "block",
     "recompute_num_layers": 1},
    {"pp": 2, "dp": 32, "ep": 8, "etp": 2, "micro_batch_size": 2},
)  # fmt: skip


_SIZES = RULE_BLOCKS[0][0]


def _matters(
    knob: str, knobs: tuple[str, ...], check: Any, specs: list[StudySpec], most: int = 3
) -> bool:
    """Whether two configs that differ only in ``knob`` get different verdicts of ``check``."""
    for spec, base in itertools.product(specs, _BASES):
        args: RuleArgs = (spec.model, 64, spec.framework, spec.training, 8)
        start = replaced(ParallelConfig(tp=1, pp=1, dp=64), **base)
        width = most if len(knobs) <= 6 else 2  # values of each other knob: a bounded search
        for others in itertools.product(*(_VALUES[k][:width] for k in knobs if k != knob)):
            fixed = dict(zip((k for k in knobs if k != knob), others, strict=True))
            seen = set()
            # a size of 0 only where the sizes' block guards the others (rule positive)
            zero = (0,) if check is RULE_BLOCKS[0][1] and knob in _SIZES else ()
            for value in _VALUES[knob] + zero:
                changes = {**fixed, knob: value}
                modules = changes.pop("recompute_modules", None)
                config = dataclasses.replace(start, recompute_modules=modules, **changes)
                errors = check(config, args)
                seen.add(errors[0].rule if errors else None)
            if len(seen) > 1:
                return True
    return False


@functools.cache
def _specs() -> list[StudySpec]:
    """Megatron-LM, DeepSpeed-MoE (also top-1 routed) and Megatron-DeepSpeed studies."""
    llama = dataclasses.replace(load_study("llama3-8b"), framework="megatron-deepspeed")
    demo = load_study("demo-moe")
    assert demo.model.moe is not None
    # top-1 routing with a minimum capacity over one sequence: the micro-batch's tokens count
    top1 = dataclasses.replace(
        demo.model.moe, router_topk=1, router_pre_softmax=True, min_capacity=2 * 128
    )
    specs = [load_study("mixtral-8x7b"), demo, llama]
    return specs + [dataclasses.replace(demo, model=dataclasses.replace(demo.model, moe=top1))]


@pytest.mark.parametrize("block", range(len(RULE_BLOCKS)))
def test_every_knob_of_a_blocks_key_matters(block: int) -> None:
    """Dropping any knob from a block's key would merge two configs the block tells apart."""
    knobs, check = RULE_BLOCKS[block]
    specs = _specs()
    for knob in knobs:
        if (block, knob) in _READ_NOT_SHOWN:
            continue
        assert _matters(knob, knobs, check, specs), knob


@pytest.mark.parametrize("block", range(len(RULE_BLOCKS)))
def test_a_knob_out_of_a_blocks_key_never_changes_its_verdict(block: int) -> None:
    """Dropping a knob the block reads from its key would fail here: varied alone, over the
    key's other knobs, it changes the block's verdict somewhere."""
    knobs, check = RULE_BLOCKS[block]
    for knob in _VALUES.keys() - set(knobs):
        assert not _matters(knob, (*knobs, knob), check, _specs(), most=2), knob


_READ_NOT_SHOWN = {(3, "tp")}
"""(block, knob) read but not shown apart by the bounded search: DeepSpeed's pipeline
partition reads tp (``pipe_layers``: the padded vocabulary's rows per rank), and no split of
these models breaks on it alone; the agreement test above covers it on whole spaces."""
