"""The space's configs built without the dataclass constructor's per-call overhead.

A space of 10^5 combinations builds a :class:`~tuner.config.parallel.ParallelConfig` for each
before the rules judge it, and the frozen dataclass's generated ``__init__`` (keyword
arguments, one ``object.__setattr__`` per field, ``__post_init__``) cost about 7 us a config,
most of a rejected config's cost. :func:`built` sets the same fields through the class's slot
descriptors, which is all ``__init__`` does with values whose recompute modules are already
canonical (``__post_init__``'s one change; callers pass :func:`canonical_modules`' output).
tests/test_space_configs.py holds every config of several spaces equal, field by field and in
type, to the constructor's.
"""

from __future__ import annotations

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
