"""Calibration that lasts: what measured trials taught the models, kept per cluster.

The model sampler (:mod:`tuner.search.sampler`) corrects the time and memory models with every
measured trial of a study. This module keeps those measurements, per cluster
(``results/clusters/<name>.calibration.yaml``, :class:`~tuner.layout.ClusterLayout`; the name is
``cluster.name`` or its default), so that ``tune space``, ``tune estimate``, ``tune run --dry-run``
and the next study on the same cluster start from the corrected models.

What is saved are the observations, not fitted weights: for each measured trial its config, the
predicted and measured step time, and the predicted and measured memory (or, for a real OOM, the
GPU's memory as a lower bound). The fit is redone wherever they are used, on the features of the
space at hand (:class:`tuner.calibrate.correction.Features`), so a calibration made on one space
applies to another with other knob values. A config measured again and again (a long study)
is saved as one row with a short entry per repeat (its trial number and what it measured that
the row did not), and read back as the observations it was.

An observation from another study (another fingerprint: other model, batch or framework) counts
as a noisier measurement: :data:`TRANSFER_SD` is added in quadrature to the run-to-run noise,
because how the machine departs from the model depends in part on the model being trained.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import math
import os
import shlex
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

from tuner._loader import NoAliasCLoader, load_dataclass, yaml_problem
from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError
from tuner.layout import ClusterLayout, beside, held, write_atomic
from tuner.outcome import Outcome, figure
from tuner.spec.bounds import MAX_BATCH, _size
from tuner.spec.file import read_text
from tuner.spec.model import model_data
from tuner.spec.pipeline_split import canonical_split

logger = logging.getLogger(__name__)

_LOADER = NoAliasCLoader
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's safe loader and dumper where PyYAML has them (the pure-Python ones otherwise): a
calibration grows by an observation per measured trial, and at 10,000 the pure-Python dumper
took about 9 s of CPU at the end of a study and its loader 20 s at the start of the next; these
take a third and a quarter. The file is the same bytes (the two emitters differ only in where
they fold a long escaped non-ASCII string, which loads back the same). The loader refuses
aliases (:class:`~tuner._loader.NoAliasCLoader`): the writer never makes one."""

TRANSFER_SD = 0.1
"""Extra spread, on the log of a ratio, of a correction measured in another study: a prior choice
(a tenth of the step time), wide enough that the new study's own runs outweigh it after a few
measurements, narrow enough that a correction of tens of percent still carries over."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """One measured trial, as the calibration keeps it."""

    study: str
    """The study it came from."""
    fingerprint: str
    """That study's :func:`setup_fingerprint` (model, batch, framework, launch, ...)."""
    trial: int
    config: Mapping[str, Any]
    """The :class:`ParallelConfig` fields."""
    outcome: str
    """``ok`` (measured) or ``oom`` (ran out of memory: only a lower bound on memory)."""
    predicted_step_s: float | None = None
    measured_step_s: float | None = None
    predicted_gib: float | None = None
    """Predicted allocated memory (``ok``) or predicted peak (``oom``), GiB."""
    measured_gib: float | None = None
    """Measured peak (``ok``) or the GPU's memory (``oom``: it needed at least that), GiB."""
    memory_setup: str = ""
    """:func:`memory_fingerprint` of its study: the same config under the same one needs the
    same memory, so one that ran is known to fit."""
    activation_share: float | None = None
    """The share of the predicted allocated memory (peak, for an OOM) that is activations
    (:attr:`tuner.models.memory.estimate.MemoryBreakdown.activation_share`); None in calibrations
    saved before it was kept (its memory error then counts as spread over the whole peak)."""
    startup_s: float | None = None
    """What the launch cost besides its iterations, seconds (:func:`launch_overhead_s`); None
    when its log cannot tell (or in calibrations saved before it was kept)."""

    def parallel_config(self) -> ParallelConfig:
        """The config as a :class:`ParallelConfig`."""
        return ParallelConfig(**dict(self.config))

    @property
    def time_ratio(self) -> float | None:
        """log(measured / predicted step time), or None."""
        measured, predicted = figure(self.measured_step_s), figure(self.predicted_step_s)
        if self.outcome != "ok" or measured is None or predicted is None:
            return None  # a saved non-figure (an older calibration file) says nothing
        return math.log(measured / predicted)

    @property
    def memory_ratio(self) -> float | None:
        """log(measured / predicted memory) (a lower bound for an OOM), or None."""
        measured, predicted = figure(self.measured_gib), figure(self.predicted_gib)
        if measured is None or predicted is None:
            return None
        return math.log(measured / predicted)

    def transfer_sd(self, fingerprint: str) -> float:
        """Extra spread of this observation when used for a study of ``fingerprint``."""
        return 0.0 if fingerprint == self.fingerprint else TRANSFER_SD


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Every observation kept for one cluster."""

    cluster: str
    updated: str = ""
    """UTC time of the last change, ISO 8601."""
    observations: tuple[Observation, ...] = ()

    def merged(self, new: Iterable[Observation], now: dt.datetime) -> Calibration:
        """This calibration with ``new`` added; a trial already kept is replaced."""
        kept = {(o.study, o.trial): o for o in self.observations}
        for o in new:
            kept[(o.study, o.trial)] = o
        return Calibration(
            cluster=self.cluster, updated=now.astimezone(dt.UTC).isoformat(timespec="seconds"),
            observations=tuple(sorted(kept.values(), key=lambda o: (o.study, o.trial))),
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """Plain data for YAML: ``dataclasses.asdict`` of it (every list and mapping a copy of
        its own, so the dumper sees no shared object to write as an anchor), the config a plain
        dict, built field by field (``asdict``'s generic walk was a tenth of the save at
        10,000 observations); but repeats of an observation (:func:`_grouped`) are one row
        with a ``repeats`` list of what each repeat does not share with it."""
        rows = []
        for o, repeats in _grouped(self.observations):
            row = {name: dict(_plain(o.config)) if name == "config" else _plain(getattr(o, name))
                   for name in _OBSERVATION_FIELDS}  # fmt: skip
            if repeats:
                row["repeats"] = repeats
            rows.append(row)
        return {"cluster": self.cluster, "updated": self.updated, "observations": tuple(rows)}


_OBSERVATION_FIELDS = tuple(f.name for f in dataclasses.fields(Observation))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Repeat:
    """One entry of a saved row's ``repeats`` (:func:`_grouped`), as the file may hold it."""

    trial: int
    measured_step_s: float | None = None
    measured_gib: float | None = None
    startup_s: float | None = None


_PER_REPEAT = tuple(f.name for f in dataclasses.fields(_Repeat))
"""What a repeated measurement of one config may change: its trial number and what it
measured. The rest (the study and its setup, the config, the outcome, what the models predicted
for it) is what makes two observations repeats of one another."""
_SHARED = tuple(name for name in _OBSERVATION_FIELDS if name not in _PER_REPEAT)


def _grouped(observations: Sequence[Observation]) -> list[tuple[Observation, list[Any]]]:
    """``observations`` as saved rows: each with the repeats that follow it (the later ones
    with the same :data:`_SHARED` fields, by their ``repr``: an int is not a float, -0.0 not
    0.0), each repeat a mapping of its trial and of each measured figure whose ``repr``
    differs from the row's. A long study measures one config many times (10,000 trials of a
    few hundred configs); a repeat is then a few numbers instead of some thirty fields to
    write and read. Only for observations in the order :meth:`Calibration.merged` keeps,
    strictly by (study, trial), the order a reader restores (:func:`load_calibration`); any
    other tuple is written row by row, as it is."""
    ordered = all((a.study, a.trial) < (b.study, b.trial) for a, b in pairwise(observations))
    if not ordered:
        return [(o, []) for o in observations]
    first: dict[str, tuple[Observation, list[Any]]] = {}
    out: list[tuple[Observation, list[Any]]] = []
    for o in observations:
        same = repr(tuple(getattr(o, name) for name in _SHARED))
        kept = first.get(same)
        if kept is None:
            first[same] = kept = (o, [])
            out.append(kept)
            continue
        repeat: dict[str, Any] = {"trial": o.trial}
        for name in _PER_REPEAT[1:]:
            value = getattr(o, name)
            if repr(value) != repr(getattr(kept[0], name)):
                repeat[name] = value
        kept[1].append(repeat)
    return out


def _plain(value: Any) -> Any:
    """``value`` as ``dataclasses.asdict`` copies a field: lists, tuples and dicts anew, each
    item likewise; anything else (the scalars an observation holds) as it is."""
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _plain(v)) for k, v in value.items())
    return value


def observations_from_trials(
    study: str, fingerprint: str, trials: Iterable[Any], gpu_gib: float, memory_setup: str = ""
) -> list[Observation]:
    """The observations of a study's finished trials (Optuna ``FrozenTrial``): every measured
    step time and peak, and every real OOM, with what the models predicted for them."""
    from tuner.space.trials import is_duplicate, measured_value, trial_outcome

    out = []
    for t in trials:
        a = t.user_attrs
        if not a.get("config") or not t.state.is_finished() or is_duplicate(t):
            continue  # a duplicate was answered from an earlier trial: not a measurement
        outcome = trial_outcome(t)
        share = _num(a.get("predicted_activation_share"))
        common: dict[str, Any] = {
            "study": study, "fingerprint": fingerprint, "trial": int(t.number),
            "memory_setup": memory_setup, "config": dict(a["config"]), "activation_share": share,
        }  # fmt: skip
        step = measured_value(t)  # None: no figure (a storage from before the rule)
        if outcome == Outcome.OK and step is not None:
            predicted, measured = _memory_pair(a)
            out.append(Observation(
                **common, outcome="ok", predicted_step_s=_num(a.get("predicted_step_s")),
                measured_step_s=step, predicted_gib=predicted, measured_gib=measured,
                startup_s=launch_overhead_s(a),
            ))  # fmt: skip
        elif outcome == Outcome.OOM and a.get("predicted_peak_gib"):
            out.append(Observation(**common, outcome="oom",
                                   predicted_gib=_num(a.get("predicted_peak_gib")),
                                   measured_gib=gpu_gib))  # fmt: skip
    return out


def launch_overhead_s(attrs: Mapping[str, Any]) -> float | None:
    """A measured trial's start-up as the cost model counts it, seconds: its wall time
    (``duration_s``) less its iterations at its measured step time (``iterations``, the log's
    per-step records, one per iteration in the shipped templates; the proxy's own step for a
    proxy). That is every second of the launch that does not scale with the step time:
    processes, rendezvous, model build, data loaders, the first iterations' compile and
    allocator growth above a steady step, and the shutdown: what
    :func:`tuner.space.cost.trial_cost` charges once per launch (``search.startup_min``)
    beside ``iterations x step``. None when a figure is missing, or when the iterations alone
    would outlast the wall time (a log whose step times are not wall-clock time: a paced
    stand-in, a replay)."""
    step = attrs.get("proxy_step_s") or attrs.get("step_time_s")
    duration, iterations = attrs.get("duration_s"), attrs.get("iterations")
    if not step or not duration or not iterations:
        return None
    overhead = float(duration) - int(iterations) * float(step)
    return overhead if overhead > 0 else None


def measured_startup_s(
    observations: Iterable[Observation], fingerprint: str, own: Iterable[float | None] = ()
) -> float | None:
    """The start-up of a launch of the setup ``fingerprint`` on this cluster, seconds: the
    median of the saved observations' :attr:`Observation.startup_s` and of ``own`` (a running
    study's, :func:`launch_overhead_s` of its trials): a typical launch, which one delayed by a
    slow node or a cold file cache moves little; None when none was measured. Only the same
    setup's observations: the model build, the checkpoint and the data loaders a start-up
    times depend on the model and framework, not only on the cluster."""
    found = [o.startup_s for o in observations if o.fingerprint == fingerprint and o.startup_s]
    found += [s for s in own if s]
    return float(statistics.median(found)) if found else None


def _memory_pair(a: dict[str, Any]) -> tuple[float | None, float | None]:
    """(predicted, measured) memory of a measured trial, GiB: the allocated peaks where the log
    gives one; else the reserved ones (torchtitan logs only the printing rank's
    ``max_memory_reserved``, ``tuner.logs.torchtitan``), against the predicted reserved peak."""
    if a.get("peak_memory_gib") is not None:
        return _num(a.get("predicted_allocated_gib")), _num(a.get("peak_memory_gib"))
    if a.get("peak_reserved_gib") is not None and a.get("predicted_reserved_gib") is not None:
        return _num(a.get("predicted_reserved_gib")), _num(a.get("peak_reserved_gib"))
    return _num(a.get("predicted_allocated_gib")), None


def _num(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


_LOADED: dict[str, tuple[tuple[int, int, int, int], Calibration]] = {}
"""The calibration this process last read or wrote at each path, by the file's device, inode,
size and modification time: a study loads its cluster's calibration when it starts and again
when it saves at its end (seconds at 10,000 observations); the second read is this one unless
the file changed (a save replaces the file, so another worker's save is a new inode)."""


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells one written calibration file from another (the file's identity, size and
    modification time)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def load_calibration(path: Path, cluster: str) -> Calibration:
    """The saved calibration at ``path``; an empty one when there is none."""
    try:
        stamp = _stamp(path.stat())
        kept = _LOADED.get(str(path))
        if kept is not None and kept[0] == stamp:
            return kept[1]
        text = read_text(path, "the calibration file", limit=None)  # not a FIFO, UTF-8
        data = yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except FileNotFoundError:
        return Calibration(cluster=cluster)
    except NotADirectoryError:  # `--results FILE`: exit 1 and "Not a directory" before
        file = next(p for p in path.parents if p.exists() and not p.is_dir())
        raise ConfigError(f"cannot read the calibration: {file} is a file, not a folder "
                          "(--results must be a folder)", file=str(path)) from None  # fmt: skip
    except ConfigError as exc:
        raise ConfigError(exc.reason, file=str(path)) from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # [[[[...]]]], 5000 digits
        raise ConfigError(f"not YAML: {yaml_problem(exc)}", file=str(path)) from None
    try:
        if not isinstance(data, Mapping) or not isinstance(data.get("observations") or [], list):
            raise ConfigError("expected a mapping with a list of observations")
        obs = _observations(data.get("observations") or ())
        loaded = Calibration(cluster=str(data["cluster"]), updated=str(data.get("updated", "")),
                             observations=obs)  # fmt: skip
    except (ConfigError, KeyError) as exc:
        why = str(exc) if isinstance(exc, ConfigError) else f"{exc} is missing"
        # `tune calibrate --reset` alone is refused: it needs the cluster (or a study)
        again = f"tune calibrate --cluster {shlex.quote(cluster)} --reset"
        raise ConfigError(f"not a calibration file ({why}); {again} clears it",
                          file=str(path)) from None  # fmt: skip
    _keep(path, stamp, loaded)
    return loaded


_EMPTY_BY_DEFAULT = frozenset(
    f.name for f in dataclasses.fields(Observation) if f.default == ""
)  # written empty when unknown (memory_setup in calibrations saved before it was kept)
_SIZES = frozenset({"tp", "pp", "cp", "dp", "vp", "micro_batch_size", "global_batch_size", "ep",
                    "etp", "dp_replicate"})  # fmt: skip


def _observations(rows: Sequence[object]) -> tuple[Observation, ...]:
    """The saved rows as observations: a row with ``repeats`` (:func:`_grouped`) is itself and
    each repeat (its fields with the repeat's trial and figures), all of them in (study,
    trial) order, the order the writer kept; a file without repeats (written before them)
    reads as it is, each row one observation."""
    out: list[Observation] = []
    repeated = False
    for k, row in enumerate(rows):
        where = f"observations[{k}]"
        if not isinstance(row, Mapping) or "repeats" not in row:
            out.append(_observation(row, where))
            continue
        repeats = row["repeats"]
        if not isinstance(repeats, list):
            raise ConfigError("expected a list of repeats", path=f"{where}.repeats")
        obs = _observation({n: v for n, v in row.items() if n != "repeats"}, where)
        out.append(obs)
        for j, entry in enumerate(repeats):
            at = f"{where}.repeats[{j}]"
            loaded = load_dataclass(_Repeat, entry, at)
            changed = {name: getattr(loaded, name) for name in _PER_REPEAT if name in entry}
            for name, value in changed.items():
                if value is not None and value < 0:
                    raise ConfigError(f"must be >= 0, got {value}", path=f"{at}.{name}")
            out.append(dataclasses.replace(obs, **changed))
        repeated = True
    if repeated:
        out.sort(key=lambda o: (o.study, o.trial))
    return tuple(out)


def _observation(row: object, where: str) -> Observation:
    """One saved observation, strictly (tuner._loader: each field of its type, numbers
    finite), its figures not negative and its config one the models can read: a NaN or a
    zero tp in the file would reach every corrected estimate as a log of zero."""
    if isinstance(row, Mapping):
        row = {k: v for k, v in row.items() if not (k in _EMPTY_BY_DEFAULT and v == "")}
    obs = load_dataclass(Observation, row, where)
    for name in _OBSERVATION_FIELDS:
        value = getattr(obs, name)
        if isinstance(value, float | int) and value < 0:
            raise ConfigError(f"must be >= 0, got {value}", path=f"{where}.{name}")
    config = load_dataclass(ParallelConfig, obs.config, f"{where}.config")
    for name in _SIZES:
        _size(
            getattr(config, name),
            MAX_BATCH,
            f"{where}.config.{name}",
            "larger than any world or batch",
        )
    if not 0 <= config.zero_stage <= 3:
        raise ConfigError(f"ZeRO stage must be 0 to 3, got {config.zero_stage}",
                          path=f"{where}.config.zero_stage")  # fmt: skip
    try:
        canonical_split(config.pipeline_split)
    except ConfigError as exc:
        raise ConfigError(exc.reason, path=f"{where}.config.pipeline_split") from None
    return obs


def _keep(path: Path, stamp: tuple[int, int, int, int], calibration: Calibration) -> None:
    """Remember ``calibration`` as the file at ``path`` read or written under ``stamp``, if the
    file still has that stamp (a writer that replaced it meanwhile: not remembered)."""
    try:
        if _stamp(path.stat()) == stamp:
            _LOADED[str(path)] = (stamp, calibration)
    except FileNotFoundError:
        pass


def save_calibration(calibration: Calibration, path: Path) -> None:
    """Write ``calibration`` (atomically: a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.dump(calibration.to_dict(), Dumper=_DUMPER, sort_keys=False)
    _keep(path, _stamp(write_atomic(path, text)), calibration)


def memory_fingerprint(spec: Any) -> str:
    """What a config's memory depends on: the model, batch and precision, the framework and the
    GPU (not the launch environment or the study's name)."""
    c = spec.cluster
    data = {"model": model_data(spec.model), "training": dataclasses.asdict(spec.training),
            "framework": spec.framework, "gpu": [c.gpu, c.gpu_memory_gib]}  # fmt: skip
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def setup_fingerprint(spec: Any) -> str:
    """What makes two studies measure the same thing: the study fingerprint without the name
    (a study run again under another name is the same measurement)."""
    return str(dataclasses.replace(spec, name="x").fingerprint())


def cluster_layout(spec: Any, results: str | Path) -> ClusterLayout:
    """Where the study's cluster keeps its profile and calibration."""
    return ClusterLayout(Path(results).resolve(), spec.cluster_name)


def history(spec: Any, results: str | Path) -> tuple[Observation, ...]:
    """The saved observations of ``spec``'s cluster (empty when none)."""
    layout = cluster_layout(spec, results)
    return load_calibration(layout.calibration_yaml, layout.name).observations


def record_study(
    spec: Any, trials: Sequence[Any], gpu_gib: float, results: str | Path,
    now: dt.datetime | None = None,
) -> Calibration:  # fmt: skip
    """Add a study's measured trials to its cluster's calibration and save it."""
    layout = cluster_layout(spec, results)
    new = observations_from_trials(
        spec.name, setup_fingerprint(spec), trials, gpu_gib, memory_fingerprint(spec)
    )
    path = layout.calibration_yaml
    if not new:
        return load_calibration(path, layout.name)
    # Read, merge and write under one lock: the workers of a study end together, and one's
    # write dropped what another had written after it read (their .tmp was one name, too).
    path.parent.mkdir(parents=True, exist_ok=True)
    with beside(path, ".lock").open("a") as lock, held(lock):
        merged = load_calibration(path, layout.name).merged(new, now or dt.datetime.now(dt.UTC))
        save_calibration(merged, path)
    return merged


def keep(spec: Any, trials: Sequence[Any], gpu_gib: float, results: str | Path) -> None:
    """:func:`record_study` at the end of a study: a calibration that cannot be read or written
    is logged, never a failure of the study that measured it."""
    try:
        record_study(spec, trials, gpu_gib, results)
    except (ConfigError, OSError) as exc:
        logger.warning("calibration of cluster %s not saved: %s", spec.cluster_name, exc)
