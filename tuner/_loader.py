"""A strict loader from parsed YAML into frozen dataclasses.

Every problem becomes a :class:`~tuner.errors.ConfigError` whose message names the YAML path of the
field (``space.tp[2]``) and what is wrong with it: unknown keys, wrong types, missing fields.
Supported field types: ``int``, ``float``, ``str``, ``bool``, ``Literal[...]``, ``X | None``,
``tuple[X, ...]``, ``dict[str, str]`` and nested dataclasses. Floats must be finite (``.nan`` and
``.inf`` are refused). Values a type cannot describe (ranges, divisibility) are checked by each
dataclass's ``__post_init__``.

:func:`load_yaml` parses the text first, refusing what a study never needs and an attacker would
use: aliases (``*name``: a "billion laughs" file expands exponentially once walked) and duplicate
keys (YAML keeps the last one silently).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import operator
import reprlib
import sys
import types
import typing
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Literal, TypeVar, cast, get_args, get_origin

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

from tuner.errors import ConfigError, UnknownKeyError

T = TypeVar("T")

NOT_IN_FILE = "not_in_file"
"""The metadata key (``field(metadata={NOT_IN_FILE: True})``) of a field the reader fills in,
never a key of the file: a study's ``found_by``."""


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases and without duplicate keys."""

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise ComposerError(None, None, "aliases (*name) are not allowed", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the constructor below reports it
                continue
            if duplicate:
                raise ConstructorError(
                    None, None, f"duplicate key {describe(key)}", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> object:
    """Parse one YAML document with :class:`StrictLoader` (raises ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass


def yaml_problem(exc: BaseException) -> str:
    """What is wrong with a YAML text, in one line: PyYAML's problem and its line (its first
    line of text is the context alone, "while parsing a flow node", which says neither), with
    the context first where the problem is half a sentence ("but found another document");
    a ValueError's words (an int of 5000 digits); "nested too deeply" for a RecursionError."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if not isinstance(exc, yaml.MarkedYAMLError):
        said = (str(exc).splitlines() or ["invalid YAML"])[0]
        if "integer string conversion" in said:  # Python's words, with its advice to change it
            return f"a number of more than {sys.get_int_max_str_digits()} digits"
        return said
    problem = exc.problem or "invalid YAML"
    if problem.startswith("but ") and exc.context:
        problem = f"{exc.context}, {problem}"
    mark = exc.problem_mark
    where = f" at line {mark.line + 1}" if mark is not None else ""
    if "'\\t'" in problem:  # PyYAML's words for a tab where an indent or a token starts
        where += " (a tab: write spaces there)"
    return problem + where


class NoAliasCLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's safe loader (PyYAML's own where it has no libyaml) without aliases, for the
    large files tuner writes itself and never with an anchor (a cluster's calibration): libyaml
    composes the document, so the alias is refused where a node is constructed a second time.
    A file edited to hold an alias bomb loads as shared lists, cheaply, but every walk of them
    (``str()``, a JSON dump) builds all of their 43 million leaves."""

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        if node in self.constructed_objects:
            raise ConstructorError(None, None, "aliases (*name) are not allowed", node.start_mark)
        return super().construct_object(node, deep=deep)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


_CONTAINER = reprlib.Repr()
_CONTAINER.maxlevel, _CONTAINER.maxlist, _CONTAINER.maxdict = 2, 4, 4


def describe(value: object) -> str:
    """``value`` as a message shows it: its repr, at most 40 characters. A list or mapping is
    shown through :mod:`reprlib`, which stops at what is shown: the full repr of an alias bomb
    (nine levels of nine references to one list, 43 million leaves) took seconds and a GB."""
    containers = (list, tuple, dict, set, frozenset)
    text = _CONTAINER.repr(value) if isinstance(value, containers) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def file_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields of the dataclass ``cls`` that a file may set (not the reader's own:
    :data:`NOT_IN_FILE`)."""
    return [f for f in dataclasses.fields(cls) if not f.metadata.get(NOT_IN_FILE)]


def load_dataclass(
    cls: type[T], data: object, path: str = "", given: Mapping[str, Any] | None = None
) -> T:
    """Build ``cls`` from a mapping, strictly: unknown keys and missing required fields raise.
    ``given``: the fields the reader fills in (:data:`NOT_IN_FILE`), which the file may not."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping, got {describe(data)}", path=path or "<top>")
    fields = {f.name: f for f in file_fields(cls)}
    hints = _hints(cast(Any, cls))
    unknown = [str(k) for k in data if k not in fields]
    if unknown:
        raise _unknown_key(unknown[0], sorted(fields), _join(path, unknown[0]))
    kwargs: dict[str, Any] = dict(given or {})
    for name, field in fields.items():
        if not field.init:
            continue
        if name in data:
            kwargs[name] = convert(hints[name], data[name], _join(path, name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError("required field is missing", path=_join(path, name))
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if exc.path and path and not exc.path.startswith(path):
            raise ConfigError(exc.reason, path=_join(path, exc.path)) from None
        raise


def _unknown_key(key: str, allowed: list[str], path: str) -> UnknownKeyError:
    """The error of a key the section has no field for, with the field it is nearest to
    (``micro_batch`` for ``micro_batch_size``) where one is near."""
    return UnknownKeyError(key, tuple(allowed), path=path, hint=did_you_mean(key, allowed))


def closest(given: str, known: list[str]) -> str | None:
    """The word of ``known`` a mistyped ``given`` is near, ignoring case (``megatron-lm``,
    ``Megatron``, ``slrum``), else None."""
    folded = {k.casefold(): k for k in known}
    close = difflib.get_close_matches(given.casefold(), list(folded), n=1, cutoff=0.75)
    return folded[close[0]] if close else None


def did_you_mean(given: object, known: list[str]) -> str:
    """``; did you mean 'megatron'?`` for the word of ``known`` a mistyped ``given`` is near
    (:func:`closest`), else ""."""
    close = closest(given, known) if isinstance(given, str) else None
    return f"; did you mean {close!r}?" if close else ""


def convert(tp: Any, value: object, path: str) -> Any:
    """Convert one YAML value to the type ``tp``, or raise a ConfigError naming ``path``."""
    origin = get_origin(tp)
    if origin is types.UnionType or origin is typing.Union:
        return _convert_union(tp, value, path)
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
            shown = ", ".join(str(c) for c in choices)
            hint = did_you_mean(value, [str(c) for c in choices])
            raise ConfigError(f"{describe(value)} is not one of: {shown}{hint}", path=path)
        return value
    if origin is tuple:
        return _convert_tuple(tp, value, path)
    if origin in (dict, Mapping):
        return _convert_mapping(tp, value, path)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):  # built already by a reader that knows more (a GPU's preset)
            return value
        return load_dataclass(tp, value, path)
    return _convert_scalar(tp, value, path)


def _convert_union(tp: Any, value: object, path: str) -> Any:
    args = get_args(tp)
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError("must not be empty", path=path)
    errors: list[ConfigError] = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return convert(arg, value, path)
        except ConfigError as exc:
            if isinstance(value, list | tuple) and get_origin(arg) is tuple:
                raise  # a list was meant for the list alternative: its error is the one to show
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    _one_for_a_list(args, value, path)
    choices = _choices(args)
    if choices is not None:  # a switch (proxy: on, off or auto): one list, not two errors
        raise ConfigError(f"{describe(value)} is not one of: {', '.join(choices)}", path=path)
    reasons = " or ".join(e.reason for e in errors)
    raise ConfigError(reasons, path=path)


def _one_for_a_list(args: tuple[Any, ...], value: object, path: str) -> None:
    """A union with a list alternative given one such value (``tp: 4`` where ``[4]`` or
    ``auto`` goes): one line saying what to write, not "expected a list, got 4 or 4 is not
    one of: auto"."""
    listed = next((a for a in args if get_origin(a) is tuple), None)
    if listed is None or value is None or isinstance(value, list | tuple | Mapping):
        return
    words = [str(c) for a in args if get_origin(a) is Literal for c in get_args(a)]
    hint = _as_list_hint(listed, value, path)
    if hint:
        also = f" (or {' or '.join(words)})" if words else ""
        raise ConfigError(f"expected a list, got {describe(value)}{hint}{also}", path=path)
    if all(a is tuple or get_origin(a) in (tuple, Literal) for a in args):
        # ``tp: foo``: neither a list nor a word the field takes; one line naming both
        what = " or ".join(["a list", *words])
        raise ConfigError(f"expected {what}, got {describe(value)}", path=path)


def _as_list_hint(tp: Any, value: object, path: str) -> str:
    """``": write [4]"`` where a list type ``tp`` takes a list of the one ``value`` given (the
    commonest slip in a space: ``tp: 4``, ``recompute: selective``); empty otherwise."""
    if value is None or isinstance(value, list | tuple | Mapping):
        return ""
    try:
        convert(tp, [value], path)
    except ConfigError:
        return ""
    return f": write [{str(value).lower() if isinstance(value, bool) else value}]"


def _choices(args: tuple[Any, ...]) -> list[str] | None:
    """The spellings a union of ``bool`` and literals accepts (YAML reads on/off as true/false),
    or None when any alternative is another type."""
    shown: list[str] = []
    for arg in args:
        if arg is bool:
            shown += ["true (on)", "false (off)"]
        elif get_origin(arg) is Literal:
            shown += [str(c) for c in get_args(arg)]
        elif arg is not type(None):
            return None
    return shown


def _convert_tuple(tp: Any, value: object, path: str) -> tuple[Any, ...]:
    args = get_args(tp)
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        hint = _as_list_hint(tp, value, path)
        raise ConfigError(f"expected a list, got {describe(value)}{hint}", path=path)
    item_type = args[0]
    return tuple(convert(item_type, item, _join(path, i)) for i, item in enumerate(value))


def _convert_mapping(tp: Any, value: object, path: str) -> dict[str, Any]:
    args = get_args(tp)
    if not isinstance(value, Mapping):
        raise ConfigError(f"expected a mapping, got {describe(value)}", path=path)
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise ConfigError(f"keys must be strings, got {describe(key)}", path=path)
        if args[1] is str and isinstance(item, int | float) and not isinstance(item, bool):
            item = str(item)  # env values such as NCCL_IB_TIMEOUT: 19
        out[key] = convert(args[1], item, _join(path, key))
    return out


def _convert_scalar(tp: Any, value: object, path: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"expected true or false, got {describe(value)}", path=path)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"expected an integer, got {describe(value)}", path=path)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer too large for a float
                number = math.inf
            if not math.isfinite(number):
                raise ConfigError(f"must be a finite number, got {describe(value)}", path=path)
            return number
        raise ConfigError(f"expected a number, got {describe(value)}", path=path)
    if tp is str:
        if isinstance(value, str) and "\0" in value:
            raise ConfigError("must not contain a NUL character", path=path)
        if isinstance(value, str) and value:
            return value
        raise ConfigError(f"expected a non-empty string, got {describe(value)}", path=path)
    if tp is Any or tp is object:
        return value
    raise TypeError(f"unsupported field type {tp!r} at {path}")  # a bug in tuner, not in input


# A frozen dataclass's hash computed once per object.
#
# A frozen dataclass's hash computed once per object.
#
# The enumeration keys its kept terms and caches on the model, the GPU and the config
# (``tuner.models.memory.kept`` and the ``lru_cache`` tables), so it hashes the same few
# ``ModelSpec`` and ``GPUSpec`` objects tens of thousands of times per space (43,649 model hashes
# on gpt-70b's first enumeration, about a microsecond each: a tuple of some 20 fields, the MoE
# part's nested). A frozen object's hash cannot change, so :class:`KeptHash` keeps it in a slot
# that is no dataclass field: ``fields``, ``asdict`` (a model's YAML and probe file), equality,
# ``repr`` and pickling see only the fields, as before. The value is the generated hash's, the
# hash of the tuple of the fields that take part in it, so sets and dicts of these objects hold
# and order them as before.

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
