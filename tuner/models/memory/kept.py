"""A bounded table of per-stage terms, each kept under a key of exactly what it reads: one
mechanism for the stage's states (:mod:`~tuner.models.memory.stage_states`) and its activations
(:mod:`~tuner.models.memory.stage_activations`)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Hashable
from typing import Any, Generic, TypeVar

from tuner.config.parallel import ParallelConfig

T = TypeVar("T")

MAX_CACHED_STAGES = 1 << 15
"""Stages a table keeps (a space of 10^5 configs has about 10^4 distinct ones); the cap bounds a
process that walks many spaces: a full table starts over."""


def knobs_but(left_out: Collection[str]) -> Callable[[ParallelConfig], tuple[Any, ...]]:
    """What a key of kept terms reads from a config: the values of every one of its knobs but
    ``left_out`` (those the terms never read), as one tuple read in C. A knob added to the
    config joins every key until a term says it does not read it."""
    kept = tuple(f for f in ParallelConfig.__dataclass_fields__ if f not in left_out)
    return operator.attrgetter(*kept)


class Kept(Generic[T]):
    """Terms by key; at most :data:`MAX_CACHED_STAGES` of them."""

    def __init__(self) -> None:
        self._table: dict[Hashable, T] = {}

    def get(self, key: Hashable) -> T | None:
        """The terms kept under ``key``, or None (a dict lookup: asked per stage of every
        config, so no closure is built for the miss)."""
        return self._table.get(key)

    def put(self, key: Hashable, terms: T) -> T:
        """Keep ``terms`` under ``key`` (a full table starts over) and return them."""
        if len(self._table) >= MAX_CACHED_STAGES:
            self._table.clear()
        self._table[key] = terms
        return terms

    def clear(self) -> None:
        """Forget every kept entry."""
        self._table.clear()

    def __len__(self) -> int:
        return len(self._table)
