"""A bounded table of per-stage terms, each kept under a key of exactly what it reads: one
mechanism for the stage's states (:mod:`~tuner.models.memory.stage_states`) and its activations
(:mod:`~tuner.models.memory.stage_activations`)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")

MAX_CACHED_STAGES = 1 << 15
"""Stages a table keeps (a space of 10^5 configs has about 10^4 distinct ones); the cap bounds a
process that walks many spaces: a full table starts over."""


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
