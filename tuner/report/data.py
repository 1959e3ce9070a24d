"""What the report shows, gathered from the study's storage (read only; never the loop).

Every trial becomes a :class:`TrialRow`; the models (:mod:`tuner.models.memory.estimate`,
:mod:`tuner.models.time.estimate`) are pure functions, so a row's predicted breakdowns are
recomputed from its recorded config.
"""

from __future__ import annotations

import html
import json
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.config.spelling import spell
from tuner.errors import ConfigError
from tuner.models.memory.bound import stage_bounds
from tuner.models.memory.estimate import (
    GIB,
    MemoryBreakdown,
    estimate_memory,
    stage_plans,
    with_slack,
)
from tuner.models.time.estimate import TimeBreakdown, estimate_time
from tuner.outcome import Outcome, rankable
from tuner.report.leaderboard import board_trials, load_optuna_study, megatron_args, optuna_trials
from tuner.space.enumerate import enumerate_space, study_gpu
from tuner.space.trials import is_duplicate, trial_outcome
from tuner.spec.frameworks import traits
from tuner.spec.study import StudySpec
from tuner.study.attrs_read import TrialAttrs

MEMORY_PARTS = ("weights", "gradients", "optimizer states", "activations", "buffers", "overhead")
"""The stacked memory components, bottom to top."""

TIME_PARTS = (
    "compute", "pipeline bubble", "TP / CP comm", "DP comm", "EP comm", "FP8 casts, MoE routing",
    "other",
)  # fmt: skip
"""The stacked step-time components, bottom to top."""

MOE_FP8_TIME_PARTS = frozenset({"EP comm", "FP8 casts, MoE routing"})
"""Parts only MoE or FP8 configs have: the figure leaves them out when no shown config has them."""


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Predicted GiB per component on one pipeline stage."""

    label: str
    """What the bar is, in words (``stage 0 (most loaded)``)."""
    parts: dict[str, float]
    """:data:`MEMORY_PARTS` -> GiB."""

    @property
    def total(self) -> float:
        """The predicted peak of that stage."""
        return sum(self.parts.values())


def stage_memory(b: MemoryBreakdown) -> list[StageMemory]:
    """One bar per pipeline stage, each at its own peak phase (forward/backward or the
    optimizer step), the config's most loaded stage marked."""
    bars, loaded = [], b.stage  # once: each read is a pass over every stage's device figure
    for st in b.stages:
        p = st.worst
        parts = {
            "weights": p.weights, "gradients": p.grads, "optimizer states": p.optimizer,
            "activations": p.activations + p.stage_extras,
            "buffers": p.framework_buffers + p.workspaces + p.comm_buffers,
            "overhead": p.cuda_context + p.slack,
        }  # fmt: skip
        most = ", most loaded" if st.stage == loaded else ""
        label = f"stage {st.stage} ({st.layers} layers, {p.phase}{most})"
        bars.append(StageMemory(label, {k: v / GIB for k, v in parts.items()}))
    return bars


STAGE_MARGIN = float(2**20)
"""Bytes: a stage whose upper bound is this far under another's lower bound is not simulated
for a trial view (:func:`most_loaded_bars`); far more than the phases' tie (one byte) and the
float sums' rounding, so the stage it leaves out is below the most loaded one by either the
device figure or the bars' totals."""


def most_loaded_bars(spec: StudySpec, c: ParallelConfig, gpu: GPUSpec) -> list[StageMemory]:
    """The bars of :func:`stage_memory` of ``c``'s estimate (with its most loaded stage marked)
    that can hold its largest total, in stage order: the others are left out by the bounds on
    each stage's largest device figure (``bound.stage_bounds``: the allocator's slack at its
    bounds, no simulation). The bar with the largest total is the same as among all bars."""
    precision = spec.training.precision
    plans = stage_plans(spec.model, c, gpu, spec.framework, precision, {})
    bounds = stage_bounds(plans, gpu)
    floor = max(low for low, _ in bounds) - STAGE_MARGIN
    kept = tuple(plan for plan, (_, high) in zip(plans, bounds, strict=True) if high >= floor)
    return stage_memory(MemoryBreakdown(with_slack(kept, gpu)))


def time_parts(t: TimeBreakdown) -> dict[str, float]:
    """:data:`TIME_PARTS` -> predicted seconds; they add up to ``t.step``."""
    parts = {
        "compute": t.compute + t.recompute + t.optimizer,
        "pipeline bubble": t.pp_bubble + t.pp_p2p,
        "TP / CP comm": t.tp_comm + t.cp_comm,
        "DP comm": t.dp_comm,
        "EP comm": t.ep_comm,
        "FP8 casts, MoE routing": t.fp8_cast + t.moe_routing,
    }
    parts["other"] = t.step - sum(parts.values())
    return parts


FAILED = frozenset(str(o) for o in Outcome if o.launched) - {Outcome.OK, Outcome.INTERRUPTED}
"""The outcomes of a launched trial that ran and measured nothing (an interrupted one runs again
on resume: not failed yet)."""


@dataclass(slots=True)
class TrialRow:
    """One trial of the study as the report shows it."""

    number: int
    outcome: str
    config: ParallelConfig | None
    reason: str
    launched: bool
    predicted_step_s: float | None
    measured_step_s: float | None
    predicted_peak_gib: float | None
    measured_peak_gib: float | None
    tokens_per_s_per_gpu: float | None
    tflops_per_gpu: float | None
    mfu: float | None
    gpu_hours: float
    start: datetime | None
    end: datetime | None
    predicted_step_sd: float | None = None
    """The prediction's stated relative sd (log-normal, :mod:`tuner.models.uncertainty`) when
    the trial was screened; None for trials stored before it was kept."""
    predicted_peak_sd: float | None = None
    """The same for the predicted peak."""
    predicted_peak_where: str = ""
    """Where the screen put the predicted peak (``stage 0, fwd_bwd``); empty: not recorded."""
    ranked: bool = True
    """Whether the trial may rank and be called the best: False where its stored step time, or
    its tokens/s where it stored one, is no figure (:func:`tuner.outcome.figure`: NaN,
    infinite, zero, negative); such a trial shows no tokens/s (every figure reads them)."""
    proxy: str = ""
    """How a proxy figure was measured (``proxy dp4 on 2 nodes: 12.3 s measured``); empty for a
    full-scale measurement (``tuner.study.proxy``)."""
    _key: str | None = field(default=None, init=False, repr=False, compare=False)
    """:attr:`key`, once made: the report asks a row's key some seven times (the figures'
    groups, the breakdowns, the views: some 70,000 keys of 10,000 trials)."""

    @property
    def key(self) -> str:
        """The config in words (``tp=2,pp=1,...``), or ``no config``."""
        if self._key is None:
            self._key = self.config.key() if self.config else "no config"
        return self._key

    @property
    def label(self) -> str:
        """The config as a person reads it (``tp2 pp1 dp4 mbs2 ga4``,
        :mod:`tuner.config.spelling`); :attr:`key` stays the machine form that baselines and
        links match on."""
        return _spelled(self.config) if self.config else "no config"

    @property
    def ok(self) -> bool:
        """Whether the trial measured a step time."""
        return self.outcome == str(Outcome.OK) and self.measured_step_s is not None

    @property
    def failed(self) -> bool:
        """Whether the trial was launched and ended without a measurement (an OOM, a timeout, a
        hang, a launch error...): not one still running, nor one to run again on resume."""
        return self.launched and self.outcome in FAILED

    @property
    def hover(self) -> str:
        """The hover text of every point of this trial: config, number, outcome and reason."""
        text = f"trial {self.number}: {self.outcome}<br>{self.label}"
        return text + (f"<br>{_wrap(self.reason)}" if self.reason else "")


@lru_cache(maxsize=4096)
def _spelled(config: ParallelConfig) -> str:
    """:func:`~tuner.config.spelling.spell`, once per config: every figure's hover text reads a
    row's label, and a long study measures the same configs again."""
    return spell(config)


def _wrap(text: str, width: int = 80) -> str:
    """Free ``text`` (a failure's reason) for a hover label: at most four lines of ``width``,
    each with ``&``, ``<`` and ``>`` escaped. plotly reads a label as its own markup: a reason
    quoting ``<a href=...>`` or ``<b onmouseover=...>`` became a link or bold text, and a
    JavaScript error on hovering ("Cannot set property target of #<Event>")."""
    chunks = (text[i : i + width] for i in range(0, min(len(text), 4 * width), width))
    return "<br>".join(html.escape(chunk, quote=False) for chunk in chunks)


def _place(r: TrialRow) -> tuple[bool, float, int]:
    """A measured row's place: the ranked ones by the most tokens/s/GPU (none last), then the
    others; then the trial number."""
    rate = r.tokens_per_s_per_gpu if r.ranked else None
    return (not r.ranked, -(rate or 0.0), r.number)


@dataclass
class ReportData:
    """Everything the report needs, read once from storage."""

    spec: StudySpec
    gpu: GPUSpec
    study: optuna.Study
    rows: list[TrialRow]
    baseline_request: str | None = None
    train_tokens: float | None = None
    results: str = "results"
    """The results folder the trials' logs and scripts are in."""
    space_counts: dict[str, Any] = field(default_factory=dict)
    """The space's counts (``SpaceReport.counts``): total, invalid by rule, predicted OOM,
    viable."""
    _breakdowns: dict[str, tuple[list[StageMemory], dict[str, float]]] = field(
        default_factory=dict
    )
    """By config key: the models are pure functions of the config, and a long study measures
    the same configs again (10,000 trials of some 700 configs)."""
    view_words: dict[str, tuple[str, str]] = field(default_factory=dict)
    """By config key: a trial view's predicted memory and time in words
    (:func:`tuner.report.views.trial_view`)."""
    page_dir: str | None = None
    """The folder the page is written to (trial views link files relative to it); None: not
    known, every view carries its tails (:func:`tuner.report.views.trial_view`)."""
    stored: list[TrialAttrs] = field(default_factory=list)
    """Every stored trial as the report read it: its :data:`REPORT_ATTRS` and times."""
    trials: list[FrozenTrial] = field(default_factory=list)
    """The completed trials, as Optuna's views read them (:func:`tuner.report.leaderboard.
    optuna_trials`: values, parameters, their distributions, no attributes), each a
    :class:`ReadOnlyTrial`."""

    @cached_property
    def measured(self) -> list[TrialRow]:
        """Measured trials, fastest first; those not :attr:`TrialRow.ranked` (a stored figure
        that is NaN, infinite, zero or negative) last."""
        ok = [r for r in self.rows if r.ok]
        return sorted(ok, key=_place)

    @property
    def best(self) -> TrialRow | None:
        """The fastest measured trial; None when no measured trial has a figure to rank by."""
        first = self.measured[0] if self.measured else None
        return first if first is not None and first.ranked else None

    @property
    def first_pick(self) -> TrialRow | None:
        """The model's first pick: the first trial launched (the top predicted config, which the
        loop enqueues first)."""
        launched = [r for r in self.rows if r.launched]
        return min(launched, key=lambda r: r.number) if launched else None

    @cached_property
    def baseline(self) -> TrialRow | None:
        """The payback's reference: ``--baseline`` (a trial number or config words), else the
        model's first pick when it was measured."""
        if self.baseline_request is None:
            first = self.first_pick
            return first if first is not None and first.ok else None
        return find_trial(self.measured, self.baseline_request)

    @property
    def gpu_hours(self) -> float:
        """GPU-hours spent by every launched trial."""
        return sum(r.gpu_hours for r in self.rows)

    @property
    def wall_s(self) -> float:
        """Seconds from the first trial's start to the last one's end."""
        starts = [r.start for r in self.rows if r.start is not None]
        ends = [r.end for r in self.rows if r.end is not None]
        if not starts or not ends:
            return 0.0
        return max(0.0, (max(ends) - min(starts)).total_seconds())

    def outcome_counts(self) -> dict[str, int]:
        """Trials by outcome, most frequent first."""
        counts: dict[str, int] = {}
        for r in self.rows:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def breakdowns(self, row: TrialRow) -> tuple[list[StageMemory], dict[str, float]]:
        """The predicted memory (one bar per stage the model describes) and step-time parts of
        a trial's config."""
        if row.config is None:
            return [], {}
        key = row.key
        if key not in self._breakdowns:
            spec, c = self.spec, row.config
            memory = estimate_memory(spec.model, c, self.gpu, spec.framework,
                                     spec.training.precision)  # fmt: skip
            time = estimate_time(spec.model, spec.training, c, self.gpu,
                                 spec.cluster.gpus_per_node, spec.framework)  # fmt: skip
            self._breakdowns[key] = (stage_memory(memory), time_parts(time))
        return self._breakdowns[key]

    def has_breakdowns(self, row: TrialRow) -> bool:
        """Whether :meth:`breakdowns` of ``row``'s config are made already (a figure drew it)."""
        return row.config is not None and row.key in self._breakdowns

    def view_breakdowns(self, row: TrialRow) -> tuple[StageMemory | None, dict[str, float]]:
        """A trial view's predictions: the bar of :meth:`breakdowns` with the largest total
        (None: no config) and the step-time parts, the same figures. A config whose bars are
        not made already (most of a long study's: the figures draw a few hundred trials) has
        only the stages that can be its most loaded one simulated (:func:`most_loaded_bars`)."""
        if row.config is None:
            return None, {}
        key = row.key
        if key in self._breakdowns:
            stages, parts = self._breakdowns[key]
        else:
            spec, c = self.spec, row.config
            stages = most_loaded_bars(spec, c, self.gpu)
            time = estimate_time(spec.model, spec.training, c, self.gpu,
                                 spec.cluster.gpus_per_node, spec.framework)  # fmt: skip
            parts = time_parts(time)
        return (max(stages, key=lambda s: s.total) if stages else None), parts

    def launch_args(self, row: TrialRow) -> list[tuple[str, str]]:
        """How to launch a trial's config, as (what, text) pairs read from the framework's
        traits (:mod:`tuner.spec.frameworks`): the parallelism arguments in the flag names of
        Megatron's model code (Megatron-LM's or Megatron-DeepSpeed's), the ds_config as one
        line of JSON where DeepSpeed's engine runs the training (``megatron-deepspeed`` takes
        both), and torchtitan's trainer options for a torchtitan study."""
        if row.config is None:
            return [("launch", "")]
        t = traits(self.spec.framework)
        out = []
        if t.megatron_model:
            out.append(("Megatron arguments", shlex.join(megatron_args(self.spec, row.config))))
        if t.deepspeed_optimizer:
            from tuner.launch import deepspeed_config

            out.append(("ds_config.json", json.dumps(deepspeed_config(self.spec, row.config))))
        if t.fsdp2:  # torchtitan's trainer options (tune best --emit torchtitan)
            from tuner.launch.torchtitan_flags import torchtitan_args

            words = torchtitan_args(self.spec, row.config)
            out.append(("torchtitan arguments", shlex.join(words)))
        return out


def find_trial(rows: list[TrialRow], request: str) -> TrialRow:
    """The measured trial ``request`` names: its number, or ``k=v`` words of its config key that
    match exactly one measured config (``tp=2,pp=2,mbs=4``). A number in ASCII digits only, as
    the other number options (``str.isdigit`` and ``int`` take ``４``: it was trial 4)."""
    if request.strip().isascii() and request.strip().isdigit():
        hits = [r for r in rows if r.number == int(request)]
    else:
        words = {w.strip() for w in request.split(",") if w.strip()}
        hits = [r for r in rows if words <= set(r.key.split(","))]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise ConfigError(f"--baseline {request!r} matches no measured trial")
    names = ", ".join(str(r.number) for r in hits[:8])
    raise ConfigError(f"--baseline {request!r} matches {len(hits)} measured trials ({names})")


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and value == value else None


REPORT_ATTRS = (
    "config", "outcome", "launched", "duplicate_of", "hosts", "reason", "duration_s",
    "predicted_step_s", "step_time_s", "tokens_per_s", "predicted_peak_gib", "peak_memory_gib",
    "tflops_per_gpu", "mfu", "predicted_step_sd", "predicted_peak_sd", "predicted_peak_stage",
    "predicted_peak_phase", "proxy", "proxy_dp", "proxy_nodes", "proxy_step_s",
    "measured_microbatches", "full_microbatches",
)  # fmt: skip
"""The user attributes the report reads of a trial (:func:`trial_row`, and whether it is a
duplicate): all that :func:`gather` reads of them."""


def trial_row(
    t: FrozenTrial | TrialAttrs, spec: StudySpec, config: ParallelConfig | None = None
) -> TrialRow:
    """The report's view of one stored trial (``config``: its config, when made already)."""
    a = t.user_attrs
    if config is None and a.get("config"):
        config = ParallelConfig(**a["config"])
    outcome = trial_outcome(t)
    step = _float(a.get("step_time_s"))
    stored = a.get("tokens_per_s")  # as the leaderboard ranks it (a NaN is no figure)
    ranked = rankable(step, stored)
    tokens = _float(stored)
    if tokens is None and ranked and step:
        tokens = spec.training.global_batch_size * spec.model.seq_length / step
    duration = _float(a.get("duration_s")) or 0.0
    hosts = len(a.get("hosts", [])) or spec.nodes_per_trial
    # A trial that measured a step ran, whatever its attributes say (a storage written before
    # "launched" was recorded, or by hand, holds measured trials without it).
    launched = bool(a.get("launched")) or (outcome == Outcome.OK and step is not None)
    return TrialRow(
        number=t.number, outcome=str(outcome or t.state.name.lower()), config=config,
        reason=str(a.get("reason") or ""), launched=launched,
        predicted_step_s=_float(a.get("predicted_step_s")), measured_step_s=step,
        predicted_peak_gib=_float(a.get("predicted_peak_gib")),
        measured_peak_gib=_float(a.get("peak_memory_gib")),
        tokens_per_s_per_gpu=tokens / spec.world_size if ranked and tokens else None,
        ranked=ranked,
        tflops_per_gpu=_float(a.get("tflops_per_gpu")), mfu=_float(a.get("mfu")),
        gpu_hours=duration * hosts * spec.cluster.gpus_per_node / 3600 if launched else 0.0,
        start=t.datetime_start if launched else None,
        end=t.datetime_complete if launched else None, proxy=proxy_note(a),
        predicted_step_sd=_float(a.get("predicted_step_sd")),
        predicted_peak_sd=_float(a.get("predicted_peak_sd")),
        predicted_peak_where=peak_where(a),
    )  # fmt: skip


def peak_where(a: dict[str, Any]) -> str:
    """The predicted peak's stage and phase as the screen recorded them (empty: not)."""
    stage, phase = a.get("predicted_peak_stage"), a.get("predicted_peak_phase")
    if stage is None:
        return ""
    return f"stage {stage}, {phase}" if phase else f"stage {stage}"


def proxy_note(a: dict[str, Any]) -> str:
    """A proxy trial's words (its DP size, nodes and measured step), empty for a full-scale one."""
    m = a.get("measured_microbatches")
    if not a.get("proxy") and not m:
        return ""
    step = _float(a.get("proxy_step_s"))
    measured = f": {step:.4g} s measured" if step else ""
    fewer = f"{m} of {a.get('full_microbatches')} micro-batches per step" if m else ""
    if not a.get("proxy"):
        return f"run at {fewer}{measured}"
    fewer = f" at {fewer}" if fewer else ""
    return f"proxy dp{a.get('proxy_dp')} on {a.get('proxy_nodes')} nodes{fewer}{measured}"


def gather(
    spec: StudySpec, *, storage: str | None = None, results: str = "results",
    baseline: str | None = None, train_tokens: float | None = None,
) -> ReportData:  # fmt: skip
    """Read the study of ``spec``; duplicates and queued trials are left out (not trials of
    their own). The trials are read for what the report shows: their :data:`REPORT_ATTRS` and
    times, and the completed ones' values and parameters for Optuna's views."""
    study = load_optuna_study(spec, storage, results)
    stored = board_trials(spec, storage, results, REPORT_ATTRS, times=True)
    made: dict[int, ParallelConfig | None] = {}  # by config object: shared by its trials
    rows = []
    for t in stored:
        if is_duplicate(t) or t.state == TrialState.WAITING:
            continue
        raw = t.user_attrs.get("config")
        if id(raw) not in made:
            made[id(raw)] = ParallelConfig(**raw) if raw else None
        rows.append(trial_row(t, spec, made[id(raw)]))
    trials = optuna_trials(spec, storage, results, stored, ReadOnlyTrial)
    recorded = study.user_attrs.get("space_counts")  # the loop's, when it ran (tuner.study.loop)
    counts = recorded or enumerate_space(spec, with_time=False).counts()
    data = ReportData(spec, study_gpu(spec), study, rows, baseline, train_tokens, results, counts,
                      stored=stored, trials=trials)  # fmt: skip
    _ = data.baseline  # a bad --baseline is an error before anything is drawn
    return data


class ReadOnlyTrial(FrozenTrial):
    """A stored trial as the report holds it: never changed, so a deep copy of it is a shallow
    one (its own number and id; the parameters and attributes shared).

    Optuna's plots read an in-memory copy of the study (:func:`tuner.report.figures.
    optuna_views`), and Optuna's in-memory storage deep-copies every trial it adds and every
    trial on each read; the importances read the study once per parameter. With 7,500
    completed trials of some 40 attributes and parameters each, those copies were about
    15 s of the report's CPU; the figures drawn are the same."""

    def __deepcopy__(self, memo: dict[int, Any]) -> ReadOnlyTrial:
        # What ``copy.copy`` makes of it (a new object of the class with the same attribute
        # dictionary entries), without its generic reduce protocol: the in-memory storage
        # copies about 84,000 trials for the importances of a 10,000-trial study.
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin
