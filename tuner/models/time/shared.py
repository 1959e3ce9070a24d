"""One step-time estimate for the configs the time model reads alike.

:func:`~tuner.models.time.estimate.estimate_time` reads full recompute's method and layer
count only through :func:`~tuner.models.time.breakdown.recompute_fraction` (the share of a
stage's layers run again: 1 for the uniform method whatever its chunk, and for the block
method once it covers every layer of a chunk). So configs that differ only in those two knobs
and recompute the same share have one :class:`TimeBreakdown`: a MoE space that lists full
recompute in chunks of 1 and 2 layers (``moe-1e5``: seven recompute settings, two of them
alike) times each such pair once. :class:`SharedTimes` keeps the recent estimates on
:func:`time_key`; tests/test_time_shared.py holds every shared estimate equal to a fresh one
on every config of MoE and dense spaces, and shows the fraction must be in the key.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable

from tuner.config.parallel import ParallelConfig
from tuner.models.time.breakdown import TimeBreakdown, recompute_fraction
from tuner.spec.study import ModelSpec

FRACTION_ONLY = frozenset({"recompute_method", "recompute_num_layers"})
"""The knobs the time model reads only through ``recompute_fraction``."""
_rest = operator.attrgetter(
    *(f for f in ParallelConfig.__dataclass_fields__ if f not in FRACTION_ONLY)
)

MAX_SHARED_TIMES = 1 << 12
"""Estimates :class:`SharedTimes` keeps: alike configs are a few dozen apart in the walk (the
recompute axis is outside the optimizer, ZeRO, split and MoE axes), so a full table starts
over."""


def time_key(config: ParallelConfig, model: ModelSpec) -> Hashable:
    """What the time model reads of ``config``: every knob but :data:`FRACTION_ONLY`, and
    the share of layers full recompute runs again."""
    return _rest(config), recompute_fraction(config, model)


class SharedTimes:
    """``estimate(config)``, once per :func:`time_key` among the recent configs."""

    __slots__ = ("_estimate", "_model", "_seen")

    def __init__(
        self, model: ModelSpec, estimate: Callable[[ParallelConfig], TimeBreakdown]
    ) -> None:
        self._model, self._estimate = model, estimate
        self._seen: dict[Hashable, TimeBreakdown] = {}

    def __call__(self, config: ParallelConfig) -> TimeBreakdown:
        key = time_key(config, self._model)
        time = self._seen.get(key)
        if time is None:
            if len(self._seen) >= MAX_SHARED_TIMES:
                self._seen.clear()
            time = self._seen[key] = self._estimate(config)
        return time
