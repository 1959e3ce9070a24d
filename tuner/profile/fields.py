"""Reading a saved cluster profile's fields (:func:`tuner.profile.run.load_profile`): each
converted by its declared type, and a missing or wrong one a :class:`Malformed` naming its path
(``gemm[0].tflops is missing``). A measured figure must be finite and not negative: a NaN, an
infinity or a negative time in the file would reach every estimate the profile feeds; a
sample's median or rate must be above zero (:func:`_measured`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tuner._loader import describe

S = TypeVar("S")
T = TypeVar("T")


def present(value: Any) -> Any:
    """``value`` as it is (a field whose parts are converted one by one)."""
    return value


def text(value: Any) -> str:
    """A saved name or version as text: a number is written out, a list or mapping refused
    (``str()`` of an alias bomb builds all of its 43 million leaves)."""
    if isinstance(value, list | tuple | dict | set):
        raise TypeError(value)
    return str(value)


def utc_time(value: Any) -> str:
    """An ISO 8601 time with its zone, as saved (the age check subtracts it from now)."""
    if dt.datetime.fromisoformat(text(value)).tzinfo is None:  # the age check needs the zone
        raise ValueError(value)
    return str(value)


text.__name__ = "str"  # what a message says it is not
utc_time.__name__ = "an ISO 8601 time with its zone"


def _figure(value: Any) -> float:
    """A measured time or rate: finite, not negative (a NaN or a negative time would reach
    every estimate the profile feeds); ``true`` is no number."""
    if isinstance(value, bool) or not math.isfinite(number := float(value)) or number < 0:
        raise ValueError(value)
    return number


def _measured(value: Any) -> float:
    """A sample's figure (a median time, a rate): above zero, as every one the probe writes is
    (it divides by the median, or by the time). A zero one was read as no figure: a GEMM's,
    the stream's, the launch's or a link's rate left out without a word (the catalog's figure
    used instead of the one the profile claims), and a collective's median time of 0 put a
    point at the origin of the alpha-beta fit, which pulled the link's latency to 0."""
    if (number := _figure(value)) <= 0:
        raise ValueError(value)
    return number


def _count(value: Any) -> int:
    """A rank's number: a whole number, not negative."""
    if isinstance(value, bool) or (number := int(value)) < 0:  # int(inf): OverflowError
        raise ValueError(value)
    return number


def _size(value: Any) -> int:
    """A sample's shape or size (a GEMM's m, k, n, a message's bytes, a group's ranks): at
    least 1. A GEMM of m = 0 was a traceback ("math domain error") in every estimate: the
    time model finds the nearest measured shape by the log of each size."""
    if (number := _count(value)) < 1:
        raise ValueError(value)
    return number


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "int": _size,  # every int field of a sample is a size; ranks are a tuple of ints
    "float": _measured,  # the raw samples (tuples below) may read 0 on a coarse timer
    "str": text,
    "tuple[float, ...]": lambda v: tuple(_figure(x) for x in v),
    "tuple[int, ...]": lambda v: tuple(_count(x) for x in v),
}

_SAID = {"float": "a number above zero"}
"""How a refused field's kind is said where its type's name would mislead (a float of 0)."""


class Malformed(ValueError):
    """A saved profile's field that is missing or of the wrong kind, named by its path."""


def sample(cls: type[S], row: Any, where: str) -> S:
    """One sample from its saved mapping, every field converted by its declared type."""
    if not isinstance(row, Mapping):
        raise Malformed(f"{where} is not a mapping")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in row:
            raise Malformed(f"{where}.{f.name} is missing")
        try:
            values[f.name] = _CONVERT[str(f.type)](row[f.name])
        except (TypeError, ValueError, OverflowError):
            shown = describe(row[f.name])
            kind = _SAID.get(str(f.type), f.type)
            raise Malformed(f"{where}.{f.name} is not {kind}: {shown}") from None
    return cls(**values)


def samples(cls: type[S], rows: Any, where: str) -> tuple[S, ...]:
    if rows is not None and not isinstance(rows, list):
        raise Malformed(f"{where} is not a list")
    return tuple(sample(cls, row, f"{where}[{k}]") for k, row in enumerate(rows or ()))


def optional(cls: type[S], row: Any, where: str) -> S | None:
    return None if row is None else sample(cls, row, where)


def field_of(data: Mapping[str, Any], key: str, convert: Callable[[Any], T]) -> T:
    """``data[key]`` converted, or a :class:`Malformed` naming the key."""
    if key not in data:
        raise Malformed(f"{key} is missing")
    try:
        return convert(data[key])
    except (TypeError, ValueError, OverflowError):
        raise Malformed(f"{key} is not {getattr(convert, '__name__', 'valid')}: "
                         f"{describe(data[key])}") from None  # fmt: skip
