"""The space in blocks, and each block's rules judged as arrays before any config is built.

The enumeration walks the space as nested products (``enumerate.iter_values``): an outer
combination of tp, pp, cp, vp (and torchtitan's own knobs) fixes the data-parallel size and
the splits, and an inner product of nine axes (micro-batch, SP with userbuffers, the recompute
knobs, the distributed optimizer, the ZeRO stage, the split, EP, ETP, the dispatcher) runs
under it. A :class:`Block` is one outer combination with its inner axes; :meth:`Block.values`
is its configs' field values in the walk's order.

:func:`judged_values` judges a block's rules on the grid of its inner axes instead of config by
config: each block of rules (``rules.RULE_BLOCKS``) reads a few knobs, so its verdict is a
small array over the inner axes it reads, one verdict per distinct projection (the
:class:`~tuner.config.rule_table.RuleTable`'s own, kept in the same table); the first failing
block per config is a few array operations over the broadcast grid, the counts per rule come
from the grid in the order their first configs are walked (the order a ``Counter`` filled
config by config has), and only the valid configs' values are assembled, in the walk's order.
A 10^5-config space is mostly invalid (two thirds of ``moe-1e5``), so that skips most of the
per-config work of the walk; numpy's import (about 0.1 s of CPU) is paid only for spaces of at
least :data:`GRID_MIN_CONFIGS`. tests/test_space_grid.py holds the valid values, counts and
rule order equal to the per-config walk on several spaces.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.config.rule_table import RuleTable
from tuner.space.candidates import SpaceReport

if TYPE_CHECKING:
    import numpy as np

GRID_MIN_CONFIGS = 50_000
"""Spaces of at least this many combinations judge their rules on grids (:func:`judged_values`);
under it numpy's import costs more than the grid saves (about 4 us a config)."""

Recompute = tuple[str, str | None, int | None, tuple[str, ...] | None]
"""(granularity, method, layers or 0 for a chunk's, canonical modules): one recompute setting."""


@dataclass(frozen=True, slots=True)
class Block:
    """One outer combination of the walk and the inner axes under it."""

    head: tuple[int, int, int, int, int, int]
    """tp, pp, cp, dp, vp and the global batch size."""
    per_rank: int
    """Layers per pipeline rank and chunk: what a recompute setting of 0 layers takes."""
    titan: tuple[Any, ...]
    """torchtitan's own fields (the defaults for the other frameworks)."""
    axes: tuple[tuple[Any, ...], ...]
    """The inner axes in the walk's order: micro-batch sizes, (SP, userbuffers) pairs, recompute
    settings, distributed optimizer, ZeRO stages, splits, EP, ETP, dispatchers."""

    @property
    def size(self) -> int:
        """Configs in the block."""
        n = 1
        for axis in self.axes:
            n *= len(axis)
        return n

    def values(self) -> Iterator[tuple[Any, ...]]:
        """Every config of the block as its field values (``build.FIELDS`` order), walked as
        ``itertools.product`` over :attr:`axes`."""
        tp, pp, cp, dp, vp, gbs = self.head
        per_rank, titan = self.per_rank, self.titan
        # assemble()'s tuple inline: the per-config walk of every space below GRID_MIN_CONFIGS
        for picks in itertools.product(*self.axes):
            mbs, (sp, tpo), (rc, method, n, mods), dopt, zero, split, ep, etp, disp = picks
            yield (
                tp, pp, cp, dp, vp, sp, mbs, gbs, rc, method, per_rank if n == 0 else n, mods,
                dopt, zero, split, ep, etp, disp, tpo, *titan,
            )  # fmt: skip

    def assemble(self, picks: tuple[Any, ...]) -> tuple[Any, ...]:
        """The field values of the config picking ``picks`` (one value per inner axis)."""
        tp, pp, cp, dp, vp, gbs = self.head
        mbs, (sp, tpo), (rc, method, n, mods), dopt, zero, split, ep, etp, disp = picks
        layers = self.per_rank if n == 0 else n
        return (
            tp, pp, cp, dp, vp, sp, mbs, gbs, rc, method, layers, mods, dopt, zero, split, ep,
            etp, disp, tpo, *self.titan,
        )  # fmt: skip


_AXIS_OF = {
    "micro_batch_size": 0, "sequence_parallel": 1, "tp_comm_overlap": 1, "recompute": 2,
    "recompute_method": 2, "recompute_num_layers": 2, "recompute_modules": 2,
    "distributed_optimizer": 3, "zero_stage": 4, "pipeline_split": 5, "ep": 6, "etp": 7,
    "moe_token_dispatcher": 8,
}  # fmt: skip
"""The inner axis each config field is read from (the others are the block's own)."""


def valid_values(
    blocks: Iterable[Block], size: int, rules: RuleTable, report: SpaceReport
) -> Iterator[tuple[Any, ...]]:
    """The valid configs' field values of a space of ``size`` configs walked as ``blocks``, in
    the walk's order, each config counted into ``report`` (total, invalid under its first
    rule): on grids (:func:`judged_values`) for a large space, config by config otherwise."""
    if rules.knobs and size >= GRID_MIN_CONFIGS:
        yield from judged_values(blocks, rules, report)
        return
    first, by_rule = rules.first, report.invalid_by_rule
    for block in blocks:
        for values in block.values():
            report.total += 1
            rule = first(values)  # study_violations(config, spec)[0].rule, or None
            if rule is None:
                yield values
                continue
            report.invalid += 1
            by_rule[rule] += 1


def judged_values(
    blocks: Iterable[Block], rules: RuleTable, report: SpaceReport
) -> Iterator[tuple[Any, ...]]:
    """The valid configs' values of ``blocks`` in the walk's order, each block's configs
    counted into ``report`` before its first is given (total, invalid, and each invalid one
    under its first rule, :meth:`RuleTable.first`'s, into ``invalid_by_rule`` in the order a
    config-by-config walk meets them). ``rules`` must judge by blocks (:attr:`RuleTable.knobs`
    not empty)."""
    import numpy as np

    codes: dict[str | None, int] = {None: 0}
    names: list[str | None] = [None]
    for block in blocks:
        first = np.broadcast_to(_first_codes(block, rules, codes, names), _shape(block))
        flat = first.ravel()
        invalid = int(np.count_nonzero(flat))
        report.total += flat.size
        report.invalid += invalid
        if invalid:
            found, where, counts = np.unique(flat, return_index=True, return_counts=True)
            order = sorted(zip(where.tolist(), found.tolist(), counts.tolist(), strict=True))
            for _, code, count in order:  # by each rule's first config in the block
                if code:
                    report.invalid_by_rule[names[code]] += count
        if invalid == flat.size:
            continue
        index = np.unravel_index(np.flatnonzero(flat == 0), first.shape)
        axes, assemble = block.axes, block.assemble
        for picks in zip(*(i.tolist() for i in index), strict=True):
            yield assemble(tuple(axis[i] for axis, i in zip(axes, picks, strict=True)))


def _shape(block: Block) -> tuple[int, ...]:
    return tuple(len(axis) for axis in block.axes)


def _first_codes(
    block: Block, rules: RuleTable, codes: dict[str | None, int], names: list[str | None]
) -> np.ndarray[Any, Any]:
    """Per config of ``block`` (an array broadcastable to its inner axes' shape), the code of
    its first failing rule block's first rule (0: valid): each rule block judged once per
    distinct value of the inner axes it reads, the earlier block's failure kept."""
    import numpy as np

    shape = _shape(block)
    first: np.ndarray[Any, Any] | None = None
    for i, knobs in enumerate(rules.knobs):
        dims = sorted({_AXIS_OF[k] for k in knobs if k in _AXIS_OF})
        sub = tuple(shape[d] if d in dims else 1 for d in range(len(shape)))
        found: list[int] = []
        picks = [axis[0] for axis in block.axes]
        for at in itertools.product(*(block.axes[d] for d in dims)):
            for d, value in zip(dims, at, strict=True):
                picks[d] = value
            rule = rules.block_rule(i, block.assemble(tuple(picks)))
            if rule not in codes:
                codes[rule] = len(names)
                names.append(rule)
            found.append(codes[rule])
        # product order over the axes read, ascending: the C order of ``sub``
        verdict = np.array(found, dtype=np.int32).reshape(sub)
        first = verdict if first is None else np.where(first == 0, verdict, first)
        if first.all():
            break  # every config failed an earlier block: later ones are not its first
    assert first is not None  # a table that judges by blocks has some
    return first
