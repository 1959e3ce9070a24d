"""The first rule each config of a space breaks, judged once per distinct projection of a block.

A space of 10^5 configs is mostly invalid, and :func:`~tuner.config.rules.validate` on each cost
about 15 us (plus building the config first). Each block of rules
(``rules.RULE_BLOCKS``) reads a few knobs, and a space has few distinct values of those: a
:class:`RuleTable` keeps each block's verdict per distinct tuple of the knobs it reads, so a
config costs a dict lookup per block on the field values alone, and only the valid ones are
built. The first failing block's first rule is ``validate``'s first (the blocks run in its order),
which is all the enumeration counts; tests/test_rule_table.py holds the two equal on every config
of several spaces, and shows each knob of each key matters.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from tuner.config.build import FIELDS, built
from tuner.config.rules import RULE_BLOCKS, RuleArgs, RuleCheck, validate
from tuner.spec.frameworks import traits
from tuner.spec.study import Framework, ModelSpec, TrainingSpec

_MISS = object()


def _getter(knobs: tuple[str, ...]) -> Callable[[tuple[Any, ...]], Any]:
    """The values of ``knobs`` from a tuple in :data:`FIELDS` order (a tuple, even for one)."""
    index = [FIELDS.index(k) for k in knobs]
    if len(index) == 1:
        (i,) = index
        return lambda v: (v[i],)
    return operator.itemgetter(*index)


class RuleTable:
    """``validate(built(values), ...)``'s first rule (None: valid), for one study's rules."""

    __slots__ = ("_args", "_blocks", "knobs")

    def __init__(
        self, model: ModelSpec, world_size: int, framework: Framework,
        training: TrainingSpec | None = None, gpus_per_node: int | None = None,
    ) -> None:  # fmt: skip
        self._args: RuleArgs = (model, world_size, framework, training, gpus_per_node)
        blocks: list[tuple[Callable[[tuple[Any, ...]], Any], RuleCheck, dict[Any, Any]]] = []
        if not traits(framework).fsdp2:  # torchtitan's rules are one block of their own
            blocks = [(_getter(knobs), check, {}) for knobs, check in RULE_BLOCKS]
        self._blocks = blocks
        self.knobs: tuple[tuple[str, ...], ...] = (
            tuple(knobs for knobs, _ in RULE_BLOCKS) if blocks else ()
        )
        """The knobs each block of rules reads, in ``validate``'s order (empty: torchtitan's
        rules, judged whole by :meth:`first`)."""

    def first(self, values: tuple[Any, ...]) -> str | None:
        """The id of the first rule the config of ``values`` (:data:`FIELDS` order, as
        ``build.built`` takes them) breaks, or None when it breaks none."""
        if not self._blocks:
            errors = validate(built(values), *self._args)
            return errors[0].rule if errors else None
        for get, check, seen in self._blocks:  # block_rule's lookup inline: per config
            key = get(values)
            rule = seen.get(key, _MISS)
            if rule is _MISS:
                # the block reads only the knobs of key: any config with them says the same
                errors = check(built(values), self._args)
                rule = seen[key] = errors[0].rule if errors else None
            if rule is not None:
                return rule  # type: ignore[no-any-return]
        return None

    def block_rule(self, block: int, values: tuple[Any, ...]) -> str | None:
        """The first rule of block ``block`` (an index into :attr:`knobs`) that the config of
        ``values`` breaks, or None: judged once per distinct value of the block's knobs."""
        get, check, seen = self._blocks[block]
        key = get(values)
        rule = seen.get(key, _MISS)
        if rule is _MISS:
            # the block reads only the knobs of key: any config with them says the same
            errors = check(built(values), self._args)
            rule = seen[key] = errors[0].rule if errors else None
        return rule  # type: ignore[no-any-return]
