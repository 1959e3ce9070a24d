"""Study results: the leaderboard (its rows, and as a DataFrame), the best trial (its exports:
:mod:`.export`)."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config.parallel import ParallelConfig
from tuner.errors import StudyError
from tuner.launch.megatron_flags import moe_flags, parallel_args
from tuner.layout import ResultsLayout
from tuner.outcome import Outcome, figure, rankable
from tuner.space.collection import paused_collection
from tuner.space.columns import config_columns
from tuner.space.trials import StoredTrial, trial_outcome
from tuner.spec.file import load_study, nearest_name
from tuner.spec.frameworks import traits
from tuner.spec.study import StudySpec
from tuner.study.attrs_read import TrialAttrs, completed_trials, read_attrs
from tuner.study.reader import TrialReader
from tuner.study.schema import schema_checked
from tuner.study.storage import open_storage
from tuner.study.url import check_arguments, resolve_url

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = [
    "trial", "outcome", "tp", "pp", "dp", "cp", "vp", "sp", "micro_batch", "grad_accum",
    "recompute", "distributed_optimizer", "zero_stage", "nodes", "predicted_step_s",
    "measured_step_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
    "predicted_mfu", "predicted_peak_gib", "measured_peak_gib", "duration_s", "reason",
    "measured_peak_metric", "measured_reserved_gib", "predicted_allocated_gib",
    "predicted_reserved_gib", "predicted_peak_stage", "predicted_peak_phase",
    "ep", "etp", "dispatcher", "precision", "tp_comm_overlap",
    "dp_shard", "dp_replicate", "pp_schedule", "reshard", "compile", "scale", "proxy_dp",
    "proxy_nodes", "proxy_step_s", "measured_microbatches", "step_measure", "key",
]  # fmt: skip
PROXY_COLUMNS = ["scale", "proxy_dp", "proxy_nodes", "proxy_step_s"]
"""How a figure was measured (``scale``: ``full`` or ``proxy``, ``tuner.study.proxy``): empty in a
study without proxy trials. ``proxy_step_s`` is also the step a trial measured at fewer
micro-batches per step ran (``measured_microbatches``, ``tuner.space.shorten``)."""
# "key" is the config's full machine key (ParallelConfig.key) for CSV and JSON; the table spells
# the config compactly (tuner.config.spelling).
TORCHTITAN_COLUMNS = ["dp_shard", "dp_replicate", "pp_schedule", "reshard", "compile"]
"""torchtitan's knobs (``tuner.space.trials.FSDP_PARAMS``): empty for the other frameworks."""
# Which of the memory model's three figures (allocated / reserved / device) a log's peak is:
# both parsers report torch.cuda.max_memory_allocated as the peak (tuner.logs), and its
# max_memory_reserved beside it; the predicted peak is the device figure (nvidia-smi).
MEASURED_PEAK_METRIC = "allocated"
BOARD_ATTRS = (
    "config", "outcome", "launched", "duplicate_of", "hosts", "predicted_step_s", "step_time_s",
    "objective", "tokens_per_s", "tflops_per_gpu", "mfu", "predicted_mfu", "predicted_peak_gib",
    "peak_memory_gib", "duration_s", "reason", "peak_reserved_gib", "predicted_allocated_gib",
    "predicted_reserved_gib", "predicted_peak_stage", "predicted_peak_phase", "proxy",
    "proxy_dp", "proxy_nodes", "proxy_step_s", "measured_microbatches",
)  # fmt: skip
"""The user attributes the leaderboard reads of a trial (:func:`leaderboard_row`, its
:func:`step_measure` and :func:`~tuner.space.trials.trial_outcome`, and :func:`board_rows`'
filters): all that :func:`board_trials` reads."""


_OPENED: dict[tuple[str, str, int, int], tuple[optuna.Study, TrialReader]] = {}
"""The studies this process opened, by storage, name and the database file's device and inode;
a database made anew on the same inode is told by its trials (:meth:`TrialReader.unchanged`)."""


def _opened(
    spec: StudySpec, storage: str | None, results: str
) -> tuple[optuna.Study, TrialReader]:
    layout = ResultsLayout(Path(results), spec.name)
    if storage is None and not layout.storage_path.exists():
        raise StudyError(
            f"no results for study {spec.name!r} in {layout.storage_path.parent} yet: tune run "
            f"--study {spec.study_arg} writes them there, under the folder it was started from "
            "(elsewhere: --results DIR)"
        )
    where = resolve_url(storage, layout)
    local = where.local_file
    # --storage FILE: not made by a read (sqlite:///x.db?timeout=5 was, then said the study was
    # not in it); arguments the driver would refuse are said first (sqlite:///x.db?mode=ro)
    if local is not None and not local.exists():
        if where.journal is None:
            check_arguments(where)
        raise StudyError(f"no results for study {spec.name!r}: {str(local)!r} does not exist "
                         "(tune run with that --storage makes it)")  # fmt: skip
    stat = local.stat() if local and local.exists() else None
    if stat is not None and stat.st_size == 0 and where.journal is None:  # `touch x.db`
        raise StudyError(
            f"no results for study {spec.name!r}: {str(local)!r} is empty (tune "
            "run with that --storage makes it)"
        )  # a read wrote the schema into it
    key = (where.url, spec.name, stat.st_dev if stat else 0, stat.st_ino if stat else 0)
    if key not in _OPENED or not _OPENED[key][1].unchanged():
        with schema_checked():  # no alembic import for a storage at Optuna's head schema
            raw = open_storage(storage, layout, create=False)  # found above
        try:
            study = optuna.load_study(study_name=spec.name, storage=raw)
        except KeyError:
            there = [s.study_name for s in raw.get_all_studies()]
            raise StudyError(f"study {spec.name!r} is not in the storage"
                             f"{stored_hint(spec.name, there)}") from None  # fmt: skip
        _OPENED[key] = (study, TrialReader(raw, raw.get_study_id_from_name(spec.name)))
    return _OPENED[key]


SHOWN_NAMES = 10
"""The stored studies a message names at most (a shared storage may hold hundreds)."""


def stored_hint(name: str, there: Sequence[str]) -> str:
    """What a storage without study ``name`` holds, in words: the stored name nearest it (a
    typo, another case) and the names there (:data:`SHOWN_NAMES` of them at most)."""
    if not there:
        return " (it holds no study)"
    close = nearest_name(name, there)
    shown = ", ".join(repr(n) for n in sorted(there)[:SHOWN_NAMES])
    more = f" and {len(there) - SHOWN_NAMES} more" if len(there) > SHOWN_NAMES else ""
    guess = f"; did you mean {close!r}?" if close is not None else ""
    return f"{guess} (it holds {shown}{more})"


def load_optuna_study(spec: StudySpec, storage: str | None, results: str) -> optuna.Study:
    """The stored study of ``spec`` (no new study is created), opened once per process."""
    return _opened(spec, storage, results)[0]


def stored_trials(spec: StudySpec, storage: str | None, results: str) -> list[FrozenTrial]:
    """Every trial of ``spec``'s stored study, as ``get_trials(deepcopy=False)`` gives them.

    Read by :class:`tuner.study.reader.TrialReader` (plain queries, not Optuna's ORM: 10,000
    trials in a second or two instead of ten), which keeps the finished trials and reads again
    only the unfinished ones and those added since: the best trial and its export read the
    storage once, and a long-lived caller still sees what other workers add or finish. The
    leaderboard and the report read less (:func:`board_trials`)."""
    return _opened(spec, storage, results)[1].trials()


SHOWN_ATTRS = ("outcome", "duplicate_of")
"""The user attributes that say whether a trial is on the leaderboard (:func:`on_board`)."""


def board_trials(
    spec: StudySpec, storage: str | None, results: str, keys: Sequence[str] = BOARD_ATTRS,
    *, times: bool = False,
) -> list[TrialAttrs]:  # fmt: skip
    """Every trial of ``spec``'s stored study with the attributes ``keys`` (those the
    leaderboard reads) and, with ``times``, its start and end: a read of those alone
    (:mod:`tuner.study.attrs_read`; a config and the hosts shared between the trials that
    stored the same), not of :func:`stored_trials`' whole trials; the finished trials of an
    earlier call are not read again (:data:`_LIGHT`)."""
    reader = _opened(spec, storage, results)[1]
    asked = (tuple(keys), times)
    below, done = _LIGHT.setdefault(reader, {}).get(asked, (0, []))
    fresh = read_attrs(reader.storage, reader.study_id, keys, shared=("config", "hosts"),
                       times=times, since=below)  # fmt: skip
    cut = next((i for i, t in enumerate(fresh) if not t.state.is_finished()), len(fresh))
    # below the first unfinished trial every trial is finished, and never changes; a new
    # trial's id is above every id there is (TrialReader.settled): read from there next time
    if cut < len(fresh):
        below = fresh[cut].trial_id
    elif fresh:
        below = fresh[-1].trial_id + 1
    _LIGHT[reader][asked] = (below, done + fresh[:cut])
    return done + fresh


_LIGHT: weakref.WeakKeyDictionary[TrialReader, dict[Any, tuple[int, list[TrialAttrs]]]] = (
    weakref.WeakKeyDictionary()
)
"""By reader (one per study opened, :data:`_OPENED`) and question (attributes, times): the
lowest trial id :func:`board_trials` reads next, and the finished trials below it as read (a
long-lived caller, ``leaderboard()`` called again, reads only the trials in flight and new)."""


def optuna_trials(
    spec: StudySpec, storage: str | None, results: str, trials: Sequence[TrialAttrs],
    kind: type[FrozenTrial] = FrozenTrial,
) -> list[FrozenTrial]:  # fmt: skip
    """The completed ones of ``trials`` (:func:`board_trials` with their times) as Optuna's
    trials (of class ``kind``), with their values and parameters and no attributes (Optuna's
    views of them)."""
    reader = _opened(spec, storage, results)[1]
    return completed_trials(reader.storage, reader.study_id, trials, kind)


def on_board(t: StoredTrial, include_all: bool = False) -> bool:
    """Whether trial ``t`` is a row of the leaderboard: measured (``include_all``: ended or
    running too), not queued, not answered from another trial (reads :data:`SHOWN_ATTRS`)."""
    if "duplicate_of" in t.user_attrs or t.state == TrialState.WAITING:
        return False  # answered from another trial, or queued and never started
    if include_all:
        return True
    return t.user_attrs.get("outcome") == Outcome.OK and t.state == TrialState.COMPLETE


def step_measure(attrs: Mapping[str, Any]) -> str | None:
    """Which figure a trial's measured step is (``tuner.study.record.objective_metrics``):
    ``steady`` (the steady-state mean) or ``median`` (a trial recorded before the objective
    was the steady-state mean, or one whose log gave no steady estimate); None: no step."""
    if attrs.get("step_time_s") is None:
        return None
    return str(attrs.get("objective") or "median")


def config_row(c: ParallelConfig | None) -> dict[str, Any]:
    """The leaderboard's columns that config ``c`` fills (all None without a config)."""
    return {
        **config_columns(c),
        "dp_shard": c.dp_shard if c else None, "dp_replicate": c.dp_replicate if c else None,
        "pp_schedule": c.pp_schedule if c else None,
        "reshard": c.reshard_after_forward if c else None, "compile": c.compile if c else None,
        "key": c.key() if c else None,
    }  # fmt: skip


def leaderboard_row(
    t: StoredTrial, world: int, config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Trial ``t`` as a row of the leaderboard (:data:`COLUMNS`; ``world``: GPUs; ``config``:
    :func:`config_row` of its config, when made already)."""
    a = t.user_attrs
    if config is None:
        config = config_row(ParallelConfig(**a["config"]) if a.get("config") else None)
    tokens = a.get("tokens_per_s")
    return {
        "trial": t.number, "outcome": str(trial_outcome(t) or t.state.name.lower()),
        **config, "nodes": len(a.get("hosts", [])) or None,
        "predicted_step_s": a.get("predicted_step_s"), "measured_step_s": a.get("step_time_s"),
        "tokens_per_s": tokens, "tokens_per_s_per_gpu": tokens / world if tokens else None,
        "tflops_per_gpu": a.get("tflops_per_gpu"), "mfu": a.get("mfu"),
        "predicted_mfu": a.get("predicted_mfu"),
        "predicted_peak_gib": a.get("predicted_peak_gib"),
        "measured_peak_gib": a.get("peak_memory_gib"), "duration_s": a.get("duration_s"),
        "reason": a.get("reason"),
        "measured_peak_metric": MEASURED_PEAK_METRIC if a.get("peak_memory_gib") else None,
        "measured_reserved_gib": a.get("peak_reserved_gib"),
        "predicted_allocated_gib": a.get("predicted_allocated_gib"),
        "predicted_reserved_gib": a.get("predicted_reserved_gib"),
        "predicted_peak_stage": a.get("predicted_peak_stage"),
        "predicted_peak_phase": a.get("predicted_peak_phase"),
        "scale": "proxy" if a.get("proxy") else "full", "proxy_dp": a.get("proxy_dp"),
        "proxy_nodes": a.get("proxy_nodes"), "proxy_step_s": a.get("proxy_step_s"),
        "measured_microbatches": a.get("measured_microbatches"),
        "step_measure": step_measure(a),
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Board:
    """The leaderboard: its rows (by :data:`COLUMNS`), fastest first, and each row's config."""

    rows: list[dict[str, Any]]
    """One per trial shown, each with every column of :data:`COLUMNS`."""
    configs: list[ParallelConfig | None]
    """Each row's config (None: the trial recorded none)."""

    def frame(self) -> pd.DataFrame:
        """The rows as a pandas DataFrame (:data:`COLUMNS`, in order)."""
        import pandas as pd  # here: the table, the report and the best trial do without it

        return pd.DataFrame(self.rows, columns=COLUMNS)


def board_rows(spec: StudySpec, trials: Sequence[StoredTrial], include_all: bool = False) -> Board:
    """The leaderboard of ``trials`` (every trial of ``spec``'s study): every measured config,
    fastest first (``include_all``: running, pruned and failed ones too, after the measured
    ones). Duplicates (a config asked again and answered from an earlier run) and queued
    trials are never shown."""
    shown = []
    # A config's object and columns made once per stored config object: a long study measures
    # a few hundred configs again and again, and the board's read shares each config's object
    # between the trials that stored the same (board_trials).
    made: dict[int, tuple[ParallelConfig | None, dict[str, Any]]] = {}
    with paused_collection():  # a row of some 50 objects a trial, none of them garbage
        for t in trials:
            if not on_board(t, include_all):
                continue
            stored = t.user_attrs.get("config")
            if id(stored) not in made:
                c = ParallelConfig(**stored) if stored else None
                made[id(stored)] = (c, config_row(c))
            c, columns = made[id(stored)]
            row = leaderboard_row(t, spec.world_size, columns)
            shown.append((_order(row), row, c))
    shown.sort(key=lambda entry: entry[0])
    rows = [row for _, row, _ in shown]
    empty = ["precision"]  # set below; the columns a study's kind leaves empty:
    if spec.model.moe is None:  # a dense model has no expert knobs: empty columns, not ep=1
        empty += ["ep", "etp", "dispatcher"]
    if not traits(spec.framework).fsdp2:  # torchtitan's knobs: empty for the others
        empty += TORCHTITAN_COLUMNS
    if not any(row["scale"] == "proxy" for row in rows):
        shortened = any(row["measured_microbatches"] for row in rows)
        empty += PROXY_COLUMNS[:-1] if shortened else PROXY_COLUMNS
    blank = dict.fromkeys(empty) | {"precision": spec.training.precision}
    for row in rows:
        row |= blank
    return Board(rows=rows, configs=[c for _, _, c in shown])


def ranked(row: Mapping[str, Any]) -> bool:
    """Whether a leaderboard row may rank among the measured ones and be called the best: its
    step time is a figure (:func:`tuner.outcome.figure`) and so is its tokens/s where it has
    one. A NaN, infinite, zero or negative one is shown as stored, after every ranked row."""
    return rankable(row["measured_step_s"], row["tokens_per_s"])


def _order(row: Mapping[str, Any]) -> tuple[bool, bool, float, int]:
    """A row's place: measured (``ok``) first, then the ranked rows (:func:`ranked`) by the
    most tokens/s (none last), then the trial number."""
    rank = ranked(row)
    tokens = figure(row["tokens_per_s"]) if rank else None
    return (row["outcome"] != str(Outcome.OK), not rank, -(tokens or 0.0),
            row["trial"])  # fmt: skip


def leaderboard(
    study: StudySpec | str, *, include_all: bool = False, storage: str | None = None,
    results: str = "results",
) -> pd.DataFrame:  # fmt: skip
    """Every measured config, fastest first (``include_all``: running, pruned and failed ones
    too, after the measured ones), as a pandas DataFrame (:func:`board_rows`).

    Duplicates (a config asked again and answered from an earlier run) are never shown twice.
    """
    spec = load_study(study) if isinstance(study, str) else study
    return board_rows(spec, board_trials(spec, storage, results), include_all).frame()


def why_empty(
    spec: StudySpec, trials: Sequence[StoredTrial], include_all: bool = False,
    results: str = "results",
) -> str:  # fmt: skip
    """Why a leaderboard has no row, and what to do: no trial yet (``tune run``), trials still
    running (come back), or trials that ended without a step time (``--all`` shows how); the
    commands name ``results`` where it is not the default."""
    seen = [t for t in trials if "duplicate_of" not in t.user_attrs
            and t.state != TrialState.WAITING]  # fmt: skip
    running = sum(t.state == TrialState.RUNNING for t in seen)
    ended = len(seen) - running
    study = spec.command_args(results)
    if not seen:
        return f"no trial has run yet: tune run {study} runs them"
    words = []
    if running:
        words.append(f"{running} still running (each counts once it ends)")
    if ended and not include_all:
        words.append(f"{ended} ended without a step time (tune leaderboard {study} --all says "
                     "how each ended)")  # fmt: skip
    return f"no trial has measured a step yet: {'; '.join(words) or 'none ended'}"


def best_trial(spec: StudySpec, storage: str | None, results: str) -> FrozenTrial:
    """The fastest measured trial, whole (its export reads its attributes): found on the
    leaderboard's light read (:func:`board_trials`), then that one trial read whole
    (:func:`whole_trial`), not every trial whole."""
    trials = board_trials(spec, storage, results)
    rows = board_rows(spec, trials).rows
    if not rows:
        why = why_empty(spec, trials, results=results)
        raise StudyError(f"study {spec.name!r} has nothing to export: {why}")
    rows = [row for row in rows if ranked(row)]
    if not rows:
        raise StudyError(f"study {spec.name!r} has nothing to export: no measured trial has a "
                         "finite step time and tokens/s above zero (tune leaderboard shows "
                         "what each recorded)")  # fmt: skip
    full = [row for row in rows if row["scale"] != "proxy"]  # a proxy's figure is never
    number = (full or rows)[0]["trial"]  # called best over a full-scale one
    return whole_trial(spec, storage, results, next(t for t in trials if t.number == number))


def whole_trial(spec: StudySpec, storage: str | None, results: str, t: TrialAttrs) -> FrozenTrial:
    """Trial ``t`` of ``spec``'s stored study (read by :func:`board_trials`) whole: its values,
    parameters and every attribute, as Optuna's storage gives it."""
    reader = _opened(spec, storage, results)[1]
    with paused_collection():
        return reader.storage.get_trial(t.trial_id)


def best_config(
    spec: StudySpec, storage: str | None = None, results: str = "results"
) -> ParallelConfig:
    """The winning ParallelConfig."""
    return ParallelConfig(**best_trial(spec, storage, results).user_attrs["config"])


def megatron_args(spec: StudySpec, config: ParallelConfig) -> list[str]:
    """The parallelism, batch and recompute arguments of ``config`` in Megatron's flag names.

    The same words the ``megatron_gpt`` (``megatron_deepspeed_gpt``) template puts in a trial's
    script (one definition: :func:`tuner.launch.megatron_flags.parallel_args`).
    """
    moe = [word for flag in moe_flags(spec.model, config, spec.framework) for word in flag]
    return parallel_args(config, spec.model.num_layers, spec.framework) + moe
