"""The rules judged on grids of each block's inner axes (``tuner.space.grid``) against the walk
config by config: the same valid configs in the same order, the same counts, the same first
rules in the same order; and the enumeration and the stream on grids against the exact path on
the spaces whose fit limit cuts through their middle."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_space_fast import SPACES, _exact, _same
from tuner.config.rule_table import RuleTable
from tuner.space import grid
from tuner.space.candidates import SpaceReport
from tuner.space.enumerate import enumerate_space, iter_blocks, iter_values
from tuner.space.stream import stream_space
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec

STUDIES = ("gpt-70b", "llama3-8b", "mixtral-8x7b", "demo", "demo-moe")


def _moe_space() -> StudySpec:
    """mixtral-8x7b over EP, ETP, dispatchers, recompute modules, userbuffers and splits."""
    spec = load_study("mixtral-8x7b")
    knobs: dict[str, Any] = dict(
        tp=(1, 2, 4), pp=(1, 2, 4), vp=(1, 2), micro_batch_size=(1, 2, 8),
        sequence_parallel=(True, False), ep=(1, 2, 8), etp=(1, 2),
        recompute=("none", "selective:core_attn+moe_act", "full"),
        recompute_method=("uniform", "block"), recompute_num_layers=(1, 3),
        distributed_optimizer=(True, False), tp_comm_overlap=(False, True),
        moe_token_dispatcher=("alltoall", "allgather", "flex"), pipeline_split="auto",
    )  # fmt: skip
    return dataclasses.replace(spec, space=dataclasses.replace(spec.space, **knobs))


def _spaces() -> list[StudySpec]:
    return [load_study(name) for name in STUDIES] + [_moe_space()]


def _table(spec: StudySpec) -> RuleTable:
    return RuleTable(
        spec.model, spec.world_size, spec.framework, spec.training, spec.cluster.gpus_per_node
    )


def _walked(spec: StudySpec) -> tuple[list[tuple[Any, ...]], SpaceReport]:
    """The valid values and counts of the walk config by config (``RuleTable.first``)."""
    report, table, valid = SpaceReport(), _table(spec), []
    for values in iter_values(spec):
        report.total += 1
        rule = table.first(values)
        if rule is None:
            valid.append(values)
            continue
        report.invalid += 1
        report.invalid_by_rule[rule] += 1
    return valid, report


@pytest.mark.parametrize("spec", _spaces(), ids=lambda s: s.name)
def test_the_grid_gives_the_walks_valid_configs_counts_and_rule_order(spec: StudySpec) -> None:
    valid, walked = _walked(spec)
    report = SpaceReport()
    got = list(grid.judged_values(iter_blocks(spec), _table(spec), report))
    assert got == valid
    assert [list(map(type, v)) for v in got] == [list(map(type, v)) for v in valid]
    assert (report.total, report.invalid) == (walked.total, walked.invalid)
    # in the order the walk meets them: what `tune space --json` prints on a tie of counts
    assert list(report.invalid_by_rule.items()) == list(walked.invalid_by_rule.items())
    assert valid


def test_the_spaces_break_many_rules() -> None:
    """The spaces above hold invalid configs of many rules, so the agreement is not vacuous."""
    rules = {rule for spec in _spaces() for rule in _walked(spec)[1].invalid_by_rule}
    assert len(rules) >= 6


def test_the_block_values_are_the_walk() -> None:
    spec = _moe_space()
    blocks = list(iter_blocks(spec))
    assert [v for b in blocks for v in b.values()] == list(iter_values(spec))
    assert sum(b.size for b in blocks) == len(list(iter_values(spec)))
    for b in blocks:
        assert [b.assemble(p) for p in itertools.product(*b.axes)] == list(b.values())


@pytest.fixture
def on_grids(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every space judged on grids; the list counts the grids' walks (so a test that means
    the grid path can tell it was taken)."""
    calls: list[int] = []
    real = grid.judged_values

    def counted(*args: Any) -> Iterator[tuple[Any, ...]]:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(grid, "GRID_MIN_CONFIGS", 0)
    monkeypatch.setattr(grid, "judged_values", counted)
    yield calls


@pytest.mark.parametrize("name", sorted(SPACES))
def test_the_fast_path_on_grids_agrees_with_the_exact_path(name: str, on_grids: list[int]) -> None:
    """The viable, out-of-memory and probe sets, the ranking and every printed figure."""
    fast = enumerate_space(SPACES[name](), keep_oom=True)
    assert on_grids
    _same(fast, _exact(name))


@pytest.mark.parametrize("name", ["dense-16", "moe-48", "moe-ties-64"])
def test_the_stream_on_grids_keeps_the_top_of_the_exact_ranking(
    name: str, on_grids: list[int]
) -> None:
    streamed, exact = stream_space(SPACES[name](), top=5), _exact(name)
    assert on_grids
    assert streamed.counts() | {"viable": 0} == exact.counts() | {"viable": 0}
    ranked = exact.ranked()
    assert [c.config for c in streamed.viable[:5]] == [c.config for c in ranked[:5]]
    assert [c.config for c in streamed.probes] == [c.config for c in exact.probes]


def test_torchtitan_rules_are_judged_config_by_config(on_grids: list[int]) -> None:
    """torchtitan's rules are one block of their own (no knobs to project on): no grid."""
    spec = load_study("demo-fsdp")
    assert not _table(spec).knobs
    report = enumerate_space(spec)
    assert report.total and not on_grids
