"""The framework probe's saved file (``<root>/clusters/<cluster>.<study>.stack.yaml``): the raw
rows, the stack's versions, what the probe cost and a fingerprint of what it ran (model,
framework, template, precision, GPU, ranks). :mod:`tuner.profile.stack_terms` derives the terms
from its rows. A file that is missing or malformed (a hand edit, a truncated write), a probe of
another model or launch (foreign), older than the cluster profile's limit or of other software
than the local stack (stale) is a one-line :class:`ProfileError` naming the file and the command
that measures it again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tuner._loader import describe, load_yaml, yaml_problem
from tuner.errors import ConfigError
from tuner.layout import write_atomic
from tuner.profile.probe import ProbeResult, ProbeRow
from tuner.profile.run import MAX_AGE_DAYS, ProfileError
from tuner.spec.file import read_text
from tuner.spec.study import StudySpec


def fingerprint(spec: StudySpec) -> str:
    """What the probe's figures depend on: the model, framework, launch template and script,
    precision, GPU and ranks per trial (a change makes a saved probe foreign)."""
    what = {
        "model": dataclasses.asdict(spec.model), "framework": spec.framework,
        "template": spec.launch.template, "script": spec.launch.script,
        "precision": spec.training.precision, "gpu": spec.cluster.gpu_name,
        "ranks": [spec.cluster.gpus_per_node, spec.nodes_per_trial],
    }  # fmt: skip
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_probe(spec: StudySpec, result: ProbeResult, path: Path, now: dt.datetime) -> None:
    """Write the probe's rows, versions, cost and fingerprint as YAML."""
    data = {
        "study": spec.name, "fingerprint": fingerprint(spec),
        "created": now.astimezone(dt.UTC).isoformat(timespec="seconds"),
        "versions": dict(result.versions),
        "cost": {"wall_s": round(result.wall_s, 2), "nodes": result.nodes,
                 "node_hours": round(result.node_hours, 5),
                 "recheck_s": round(result.recheck_s, 2)},
        "rows": [{**dataclasses.asdict(r), "samples_s": list(r.samples_s),
                  "rounds": list(r.rounds)} for r in result.rows],
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, yaml.safe_dump(data, sort_keys=False))


def _measured(value: object) -> float:
    """A measured figure from a saved probe: a finite number, not negative."""
    number = float(value)  # type: ignore[arg-type]  # a ValueError/TypeError names a bad one
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"a measured figure must be a finite number >= 0, got {value!r}")
    return number


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {describe(value)}")
    return value


def _whole(value: object) -> int:
    """A count from a saved probe (a depth, a round): a whole number (1.5 was read as 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a whole number >= 0, got {describe(value)}")
    return value


_ROW: dict[str, Callable[[Any], Any]] = {
    "key": _text, "depth": _whole, "step_s": _measured,
    "samples_s": lambda v: tuple(_measured(x) for x in v), "peak_gib": _measured,
    "reserved_gib": lambda v: None if v is None else _measured(v),
    "rounds": lambda v: tuple(_whole(x) for x in v or ()),
    "rechecked": lambda v: "" if v is None else _text(v),
    "uncertain": lambda v: "" if v is None else _text(v),
}  # fmt: skip
"""How each field of a saved row is read (``rounds``, ``rechecked`` and ``uncertain`` may be
absent: files before them)."""
_NEWER = ("rounds", "rechecked", "uncertain")
_BAD = (KeyError, TypeError, ValueError, ArithmeticError)  # 10**400: an OverflowError


def _fields(data: object, read: Mapping[str, Callable[[Any], Any]], where: str,
            optional: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """``read``'s fields of the mapping ``data``, each read by its function; the first problem
    a ValueError naming the field (``rows[2].step_s``)."""
    if data is None and where:
        raise ValueError(f"{where} is missing")
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    out = {}
    for name, convert in read.items():
        field = f"{where}.{name}" if where else name
        if name not in data and name not in optional:
            raise ValueError(f"{field} is missing")
        try:
            out[name] = convert(data.get(name))
        except _BAD as exc:
            raise ValueError(f"{field}: {str(exc).splitlines()[0]}") from None
    return out


def _probe_data(data: object) -> dict[str, Any]:
    """The file's mapping with its rows, creation time, versions and cost checked."""
    if not isinstance(data, Mapping) or not isinstance(data.get("rows"), list):
        raise ValueError("expected a mapping with a list of rows")
    rows = tuple(ProbeRow(**_fields(r, _ROW, f"rows[{k}]", optional=_NEWER))
                 for k, r in enumerate(data["rows"]))  # fmt: skip
    top = _fields(data, {"created": _aware, "versions": _versions}, "", optional=("versions",))
    read = {**dict.fromkeys(("wall_s", "nodes", "node_hours"), _measured),
            "recheck_s": lambda v: 0.0 if v is None else _measured(v)}  # fmt: skip
    cost = _fields(data.get("cost"), read, "cost", optional=("recheck_s",))
    return {**data, "rows": rows, "versions": top["versions"],
            "cost": {**data["cost"], "recheck_s": cost["recheck_s"]}}  # fmt: skip


def _aware(value: object) -> dt.datetime:
    """A saved time: ISO 8601 with its zone."""
    if not isinstance(value, str | dt.datetime):  # str() of a list: all of it, however big
        raise ValueError(f"expected an ISO 8601 time, got {describe(value)}")
    created = dt.datetime.fromisoformat(str(value))
    if created.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return created


def _versions(value: object) -> dict[str, Any]:
    """The stack's versions, ``package: version``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping of package: version, got {describe(value)}")
    return {str(k): v for k, v in value.items()}


def load_probe(path: Path, spec: StudySpec) -> dict[str, Any]:
    """``spec``'s saved probe at ``path`` as plain data with its rows. Missing or malformed is
    one ProfileError naming the file, what is wrong and the command that measures it again."""
    again = f"{spec.profile_command} --probe"
    if not path.exists():
        raise ProfileError(f"no framework probe yet ({again} measures it)", file=str(path))
    try:
        return _probe_data(load_yaml(read_text(path, "the framework probe", limit=None)))
    except ConfigError as exc:  # not a regular file, not UTF-8
        why = exc.reason
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # [[[[...]]]], 5000 digits
        why = yaml_problem(exc)
    raise ProfileError(f"malformed framework probe: {why}; {again} measures it again",
                       file=str(path))  # fmt: skip


def check_probe(data: Mapping[str, Any], spec: StudySpec, *, now: dt.datetime,
                versions: Mapping[str, Any] | None = None, path: str = "") -> None:  # fmt: skip
    """A one-line ProfileError when the saved probe is foreign or stale for ``spec``."""
    again = f"run {spec.profile_command} --probe"
    if data.get("fingerprint") != fingerprint(spec):
        raise ProfileError(f"foreign probe: measured for another model, framework, launch or "
                           f"cluster shape than study {spec.name}'s now; {again}",
                           file=path)  # fmt: skip
    age = now - dt.datetime.fromisoformat(str(data["created"]))
    if age > dt.timedelta(days=MAX_AGE_DAYS):
        raise ProfileError(f"stale probe: measured {data['created']}, {age.days} days ago (more "
                           f"than {MAX_AGE_DAYS}); {again}", file=path)  # fmt: skip
    for key, then in data["versions"].items():
        current = (versions or {}).get(key)
        if current is not None and str(current) != str(then):
            raise ProfileError(f"stale probe: measured with {key} {then}, the stack now has "
                               f"{current}; {again}", file=path)  # fmt: skip
