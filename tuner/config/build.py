"""The space's configs built without the dataclass constructor's per-call overhead.

A space of 10^5 combinations builds a :class:`~tuner.config.parallel.ParallelConfig` for each
before the rules judge it, and the frozen dataclass's generated ``__init__`` (keyword
arguments, one ``object.__setattr__`` per field, ``__post_init__``) cost about 7 us a config,
most of a rejected config's cost. :func:`built` sets the same fields through the class's slot
descriptors, which is all ``__init__`` does with values whose recompute modules are already
canonical (``__post_init__``'s one change; callers pass :func:`canonical_modules`' output).
tests/test_config_build.py holds every config of several spaces equal, field by field and in
type, to the constructor's.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from tuner.config.parallel import ParallelConfig

FIELDS: tuple[str, ...] = tuple(ParallelConfig.__dataclass_fields__)
"""ParallelConfig's fields in their declared order: the order :func:`built` takes values in."""
_SETTERS: tuple[Callable[[ParallelConfig, Any], None], ...] = tuple(
    getattr(ParallelConfig, name).__set__ for name in FIELDS
)
_new = object.__new__


def built(values: tuple[Any, ...]) -> ParallelConfig:
    """``ParallelConfig(**dict(zip(FIELDS, values)))``, for ``values`` of every field in
    :data:`FIELDS` order with ``recompute_modules`` canonical (``canonical_modules``)."""
    config: ParallelConfig = _new(ParallelConfig)
    for put, value in zip(_SETTERS, values, strict=True):
        put(config, value)
    return config


_INDEX = {name: i for i, name in enumerate(FIELDS)}
_values = operator.attrgetter(*FIELDS)  # every field's value as one tuple, read in C


def replaced(config: ParallelConfig, **changes: Any) -> ParallelConfig:
    """``dataclasses.replace(config, **changes)`` for changes that leave ``recompute_modules``
    alone (it is canonical already), without ``replace``'s field inspection (~8 us a call)."""
    values = list(_values(config))
    for name, value in changes.items():
        if name == "recompute_modules":
            raise ValueError(
                "replaced() keeps recompute_modules (canonical only through __init__)"
            )
        values[_INDEX[name]] = value
    return built(tuple(values))
