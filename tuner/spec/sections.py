"""Where in a study each key belongs, for the error of a key written in the wrong section.

``search: {micro_batch_size: [1]}`` or a top-level ``global_batch_size: 512`` is refused as an
unknown key of the section it is in; the error then names the field the study does have
(``space.micro_batch_size``, ``training.global_batch_size``), which the list of the section's
own keys did not.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, get_args, get_origin

from tuner._loader import file_fields
from tuner.errors import UnknownKeyError
from tuner.spec.space import KNOB_ALIASES

MAX_HOMES = 3
"""A key that is a field in more places than this (``name``) gets no hint: the list would be no
help."""


def _dataclasses_in(tp: Any) -> list[type]:
    """The dataclasses a field's type holds: itself, or those of a union, list or mapping."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return [tp]
    origin = get_origin(tp)
    if origin in (types.UnionType, typing.Union, tuple, dict):
        return [c for arg in get_args(tp) for c in _dataclasses_in(arg)]
    return []


@functools.cache
def field_homes(cls: type) -> dict[str, tuple[str, ...]]:
    """Each key a file of ``cls`` may hold, with the YAML paths of the fields so named
    (``micro_batch_size`` -> ``("space.micro_batch_size",)``)."""
    homes: dict[str, list[str]] = {}

    def walk(owner: type, prefix: str, seen: tuple[type, ...]) -> None:
        hints = typing.get_type_hints(owner)
        for f in file_fields(owner):
            path = f"{prefix}{f.name}"
            homes.setdefault(f.name, []).append(path)
            for inner in _dataclasses_in(hints[f.name]):
                if inner not in seen:  # a type that holds itself would never end
                    walk(inner, f"{path}.", (*seen, inner))

    walk(cls, "", (cls,))
    return {key: tuple(paths) for key, paths in homes.items()}


def with_home(exc: UnknownKeyError, cls: type) -> UnknownKeyError:
    """``exc`` saying where its key belongs in a file of ``cls`` (``; did you mean
    space.micro_batch_size?``), a knob's short name (``mbs``) included, or ``exc`` itself when
    the key is a field nowhere else (a typo: the loader's own nearest-name hint stays) or in too
    many places to help."""
    known = field_homes(cls)
    homes = [h for h in known.get(exc.key, ()) if h != exc.path]
    if not homes and exc.key in KNOB_ALIASES:  # `mbs: [1, 2]`, as --set and the tables say it
        homes = [h for h in known.get(KNOB_ALIASES[exc.key], ()) if h.startswith("space.")]
    if not homes or len(homes) > MAX_HOMES:
        return exc
    hint = f"; did you mean {' or '.join(homes)}?"
    return UnknownKeyError(exc.key, exc.allowed, path=exc.path, hint=hint)
