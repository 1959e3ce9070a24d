"""A frozen dataclass's hash computed once per object.

The enumeration keys its kept terms and caches on the model, the GPU and the config
(``tuner.models.memory.kept`` and the ``lru_cache`` tables), so it hashes the same few
``ModelSpec`` and ``GPUSpec`` objects tens of thousands of times per space (43,649 model hashes
on gpt-70b's first enumeration, about a microsecond each: a tuple of some 20 fields, the MoE
part's nested). A frozen object's hash cannot change, so :class:`KeptHash` keeps it in a slot
that is no dataclass field: ``fields``, ``asdict`` (a model's YAML and probe file), equality,
``repr`` and pickling see only the fields, as before. The value is the generated hash's, the
hash of the tuple of the fields that take part in it, so sets and dicts of these objects hold
and order them as before.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

_VALUES: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def hashed_fields(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    """The values a dataclass's generated ``__hash__`` reads, as one tuple, in field order (a
    field with ``hash=None`` takes part when it compares)."""
    reader = _VALUES.get(cls)
    if reader is None:
        names = [f.name for f in dataclasses.fields(cls)
                 if (f.compare if f.hash is None else f.hash)]  # fmt: skip
        getter = operator.attrgetter(*names)
        reader = getter if len(names) > 1 else (lambda obj: (getter(obj),))
        _VALUES[cls] = reader
    return reader


class KeptHash:
    """Base of a frozen dataclass whose hash is computed on first use and kept.

    The class names ``__hash__ = KeptHash.__hash__`` in its own body (a dataclass keeps an
    explicit ``__hash__``; an inherited one it would replace by its generated one)."""

    __slots__ = ("_kept_hash",)
    _kept_hash: int

    def __hash__(self) -> int:
        try:
            return self._kept_hash
        except AttributeError:
            value = hash(hashed_fields(type(self))(self))
            object.__setattr__(self, "_kept_hash", value)
            return value
