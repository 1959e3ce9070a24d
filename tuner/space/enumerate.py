"""The search space: expand ``space`` (lists or ``auto``), enumerate, validate and estimate.

``enumerate_space`` walks every combination of the study's knobs, derives DP from the world
size, checks the framework's rules (``tuner.config.parallel``) and, for the valid ones, predicts
memory (``tuner.models.memory.estimate``); :class:`SharedSpace` keeps one enumeration for the parts
of a study loop that read it. ``config_from_settings`` builds one config from ``--set key=value``
pairs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from tuner.catalog import GPUSpec, get_gpu
from tuner.config.build import FIELDS, built
from tuner.config.parallel import ParallelConfig
from tuner.config.pipe_layers import pipe_layers
from tuner.config.rule_table import RuleTable
from tuner.config.rules import RuleViolation, validate
from tuner.config.settings import parse_settings
from tuner.errors import ConfigError
from tuner.models.memory.estimate import GIB, MemoryBreakdown
from tuner.models.memory.stack import stack_overheads, study_stack
from tuner.models.moe import memory_view
from tuner.models.rates import Rates
from tuner.models.stack import StackTerms
from tuner.models.time.estimate import TimeBreakdown, estimate_time
from tuner.models.time.shared import SharedTimes
from tuner.space.candidates import Candidate as Candidate  # re-exported: its home was here
from tuner.space.candidates import DeferredMemory, MemoryJudge
from tuner.space.candidates import SpaceReport as SpaceReport
from tuner.space.collection import paused_collection
from tuner.space.grid import Block, valid_values
from tuner.space.probes import may_probe, probe_ceiling_gib
from tuner.spec.frameworks import traits
from tuner.spec.moe import ep_auto
from tuner.spec.pipeline_split import EVEN, auto_splits, canonical_split
from tuner.spec.recompute import canonical_modules, parse_recompute
from tuner.spec.study import StudySpec
from tuner.spec.torchtitan import FSDP_DEFAULT, KNOBS, FsdpKnobs, config_fields


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


#: Most combinations ``tune`` enumerates. Why: every one is validated and the valid ones
#: estimated (a MoE space of 10^6 takes about 90 s of CPU streamed, docs/speed.md), so a
#: bigger space would stall ``tune`` for longer; real spaces have a few thousand.
MAX_SPACE_SIZE = 1_000_000


@dataclass(frozen=True, slots=True)
class Axes:
    """The concrete values of every knob after ``auto`` is expanded."""

    tp: tuple[int, ...]
    pp: tuple[int, ...]
    cp: tuple[int, ...]
    vp: tuple[int, ...]
    micro_batch_size: tuple[int, ...]
    sequence_parallel: tuple[bool, ...]
    recompute: tuple[tuple[str, str | None, int | None, tuple[str, ...] | None], ...]
    """(granularity, method, layers, selective modules) per setting (``tuner.spec.recompute``)."""
    distributed_optimizer: tuple[bool, ...]
    zero_stage: tuple[int, ...]
    ep: tuple[int, ...] = (1,)
    etp: tuple[int | None, ...] = (None,)
    """Expert tensor parallel sizes; None: equal to tp."""
    moe_token_dispatcher: tuple[str, ...] = ("alltoall",)
    pipeline_split: tuple[str, ...] = ("even",)
    """The listed splits; with ``auto``, every split any (pp, vp) of the space may take."""
    split_auto: bool = False
    """``pipeline_split: auto``: each (pp, vp) takes its own ``auto_splits``."""
    moe: bool = False
    """The model has experts: the MoE knobs (ep, etp, dispatcher) are trial parameters."""
    tp_comm_overlap: tuple[bool, ...] = (False,)
    """TE userbuffers overlap; only sequence-parallel configs take it (others: off)."""
    fsdp: tuple[FsdpKnobs, ...] = (FSDP_DEFAULT,)
    """torchtitan: (dp_shard, dp_replicate, pp_schedule, reshard_after_forward, compile) per
    combination of the space's lists; the other frameworks: the one default."""
    fsdp2: bool = False
    """torchtitan: its knobs are trial parameters (other studies stay the same)."""

    @property
    def size(self) -> int:
        """Number of combinations (at tp=1 sequence parallelism has one value: off; at pp=1
        the pipeline split has one value: even)."""
        n = 1
        for name in self.__dataclass_fields__:
            if name not in (
                "tp", "pp", "sequence_parallel", "pipeline_split", "split_auto", "moe",
                "tp_comm_overlap", "fsdp2",
            ):  # fmt: skip
                n *= len(getattr(self, name))
        n *= sum(len(self.pipeline_split) if pp > 1 else 1 for pp in self.pp)
        sp = sum(len(self.tp_comm_overlap) if on else 1 for on in self.sequence_parallel)
        return n * sum(sp if tp > 1 else 1 for tp in self.tp)


def expand_axes(spec: StudySpec) -> Axes:
    """Resolve ``auto`` values against the model and the world size of one trial."""
    s, m, world = spec.space, spec.model, spec.world_size
    t = traits(spec.framework)

    def pick(value: Any, auto: list[int]) -> tuple[int, ...]:
        return tuple(auto) if value == "auto" else tuple(value)

    heads_ok = [t for t in _powers_of_two(min(spec.cluster.gpus_per_node, world))]
    tp_auto = [n for n in heads_ok if m.query_groups % n == 0] if t.megatron_model else [1]
    cp_auto = (
        [c for c in _powers_of_two(min(8, world)) if m.seq_length % (2 * c) == 0 or c == 1]
        if t.context_parallel
        else [1]
    )
    mbs_auto = [b for b in _powers_of_two(16) if spec.training.global_batch_size % b == 0]
    recompute: list[tuple[str, str | None, int | None, tuple[str, ...] | None]] = []
    for text in s.recompute:
        knobs = parse_recompute(text)
        if knobs.granularity != "full":
            recompute.append((knobs.granularity, None, None, knobs.modules))
            continue
        layers = (0,) if s.recompute_num_layers == "auto" else s.recompute_num_layers
        for method in s.recompute_method:
            recompute.extend(("full", method, n, None) for n in layers)
    # an uneven split lets pp leave a remainder of layers: auto then tries every pp
    uneven = s.pipeline_split == "auto" or s.pipeline_split != (EVEN,)
    pp_auto = [p for p in _divisors(world) if p <= m.num_layers] if uneven else None
    axes = Axes(
        tp=pick(s.tp, tp_auto),
        pp=pick(s.pp, pp_auto or [p for p in _divisors(m.num_layers) if p <= world]),
        cp=pick(s.cp, cp_auto),
        vp=pick(s.vp, [1] if t.deepspeed_pipeline else [1, 2, 3, 4]),
        micro_batch_size=pick(s.micro_batch_size, mbs_auto),
        sequence_parallel=s.sequence_parallel,
        recompute=tuple(recompute),
        distributed_optimizer=s.distributed_optimizer,
        zero_stage=s.zero_stage,
        ep=pick(s.ep, list(ep_auto(spec.model.moe, spec.world_size))),
        etp=(None,) if s.etp is None else tuple(s.etp),
        moe_token_dispatcher=s.moe_token_dispatcher,
        moe=m.moe is not None,
        tp_comm_overlap=s.tp_comm_overlap,
        fsdp=(
            tuple(itertools.product(*(getattr(s, name) for name in KNOBS)))
            if t.fsdp2
            else (FSDP_DEFAULT,)
        ),
        fsdp2=t.fsdp2,
    )
    if s.pipeline_split == "auto":
        union = {
            t: None
            for pp, vp in itertools.product(axes.pp, axes.vp)
            for t in _splits(spec, pp, vp)
        }
        axes = dataclasses.replace(axes, pipeline_split=tuple(union), split_auto=True)
    else:
        splits = tuple(canonical_split(t) for t in s.pipeline_split)
        axes = dataclasses.replace(axes, pipeline_split=splits)
    if axes.size > MAX_SPACE_SIZE:
        raise ConfigError(
            f"the search space of {spec.name} has {axes.size:,} combinations, more than "
            f"{MAX_SPACE_SIZE:,}: list fewer values",
            path="space",
        )
    return axes


def _splits(spec: StudySpec, pp: int, vp: int) -> tuple[str, ...]:
    """``pipeline_split: auto`` at one (pp, vp)."""
    m = spec.model
    layers = pipe_layers(m, spec.framework)  # one TP rank of tp=1: the splits' names
    return auto_splits(m.num_layers, pp, vp, spec.framework, layers)


def iter_configs(spec: StudySpec, axes: Axes | None = None) -> Iterator[ParallelConfig]:
    """Every combination of the axes as a ParallelConfig (DP derived; may be invalid):
    :func:`iter_values`' configs."""
    return map(built, iter_values(spec, axes))


def iter_values(spec: StudySpec, axes: Axes | None = None) -> Iterator[tuple[Any, ...]]:
    """Every combination of the axes as the values of a ParallelConfig's fields in
    ``build.FIELDS`` order (``build.built`` makes the config; the rules read them without it).

    At tp=1 sequence parallelism is off whatever the axis says (Megatron turns it off there), so
    `sequence_parallel: [true]` keeps the tp=1 configs instead of making them all invalid; at
    pp=1 likewise the pipeline split is ``even`` (one stage holds every layer).
    """
    return itertools.chain.from_iterable(b.values() for b in iter_blocks(spec, axes))


def iter_blocks(spec: StudySpec, axes: Axes | None = None) -> Iterator[Block]:
    """The walk of :func:`iter_values` as its outer combinations (tp, pp, cp, vp and
    torchtitan's knobs), each a :class:`~tuner.space.grid.Block` with the inner axes under it."""
    axes = axes or expand_axes(spec)
    world, gbs = spec.world_size, spec.training.global_batch_size
    layers = spec.model.num_layers
    fsdp = traits(spec.framework).fsdp2
    seen: set[tuple[Any, ...]] = set()
    # the recompute knobs with their modules as ParallelConfig.__post_init__ stores them
    recomputes = tuple((rc, m, n, canonical_modules(mods)) for rc, m, n, mods in axes.recompute)
    for tp, pp, cp, vp_axis, own in itertools.product(
        axes.tp, axes.pp, axes.cp, axes.vp, axes.fsdp if fsdp else (None,)
    ):
        dp, vp, titan = config_fields(own, world, tp, pp, cp, vp_axis, axes.fsdp[0][2])
        if titan is None or (fsdp and (tp, pp, cp, dp, vp, *titan.values()) in seen):
            continue  # a schedule at pp=1 repeats the first; dp_shard -1 may repeat a listed one
        if fsdp:
            seen.add((tp, pp, cp, dp, vp, *titan.values()))
        # Megatron turns SP off at tp=1, so there a wanted SP means "off", listed once.
        sps = axes.sequence_parallel if tp > 1 else (False,)
        # userbuffers need SP (Megatron asserts it): without it, one value, off
        pairs = tuple((sp, o) for sp in sps for o in (axes.tp_comm_overlap if sp else (False,)))
        if pp == 1:
            splits: tuple[str, ...] = (EVEN,)
        else:
            splits = _splits(spec, pp, vp) if axes.split_auto else axes.pipeline_split
        yield Block(
            (tp, pp, cp, dp, vp, gbs), max(layers // (pp * vp), 1),
            tuple(titan.get(name, _DEFAULTS[name]) for name in _TITAN),
            (axes.micro_batch_size, pairs, recomputes, axes.distributed_optimizer,
             axes.zero_stage, splits, axes.ep, axes.etp, axes.moe_token_dispatcher),
        )  # fmt: skip


_DEFAULTS = {name: f.default for name, f in ParallelConfig.__dataclass_fields__.items()}
_TITAN = FIELDS[FIELDS.index("tp_comm_overlap") + 1 :]
"""torchtitan's own fields, the last of ParallelConfig's (``config_fields`` gives them)."""


def study_gpu(spec: StudySpec) -> GPUSpec:
    """The study's GPU catalog entry with its memory override applied, the overheads its stack's
    versions decide (stated, or recorded by its cluster's profile: tuner.models.memory.stack's
    ``study_stack``) and, over both, the ones the study measured."""
    overheads = spec.cluster.overheads
    given = {**stack_overheads(study_stack(spec).versions), **overheads.values()}
    return get_gpu(spec.cluster.gpu, spec.cluster.gpu_memory_gib, given)


def study_violations(config: ParallelConfig, spec: StudySpec) -> list[RuleViolation]:
    """Every rule ``config`` breaks in ``spec``: its model, world size, framework, training and
    the cluster facts some rules need (``tuner.config.rules.validate``)."""
    return validate(
        config, spec.model, spec.world_size, spec.framework, spec.training,
        spec.cluster.gpus_per_node,
    )  # fmt: skip


def enumerate_space(
    spec: StudySpec,
    keep_oom: bool = False,
    with_time: bool = True,
    rates: Rates | None = None,
    fast: bool = True,
    terms: StackTerms | None = None,
) -> SpaceReport:
    """Validate and memory-estimate every combination; predict the step time of viable ones
    (``rates``: the cluster's measured rates, ``tuner.profile.rates``; the catalog's if None).

    ``fast``: a config whose verdict bounds on its peak settle (over the limit and the memory
    probes' ceiling, or under the limit) skips the allocator simulation
    (:class:`~tuner.space.candidates.MemoryJudge`); its exact breakdown is computed when read. The
    report is the same as with ``fast=False`` (the exact path everywhere):
    tests/test_space_fast.py holds the two equal. ``terms``: what the framework probe measured
    (``tuner.models.stack``); measured terms take the exact path for every config."""
    report = SpaceReport()
    near: list[Candidate] = []
    with paused_collection():  # it makes no cycles: the collector's passes find nothing
        for candidate in judged(spec, report, with_time, rates, fast, near, terms):
            (report.viable if candidate.fits else report.oom if keep_oom else []).append(candidate)
        report.probes = probes_of(
            near, fastest_fit(report), spec.search.memory_probes, study_gpu(spec).memory_gib
        )
    return report


def judged(
    spec: StudySpec,
    report: SpaceReport,
    with_time: bool = True,
    rates: Rates | None = None,
    fast: bool = True,
    near: list[Candidate] | None = None,
    terms: StackTerms | None = None,
) -> Iterator[Candidate]:
    """Every valid config of the space as a :class:`Candidate`, in the enumeration's order,
    counted into ``report`` (total, invalid by rule, predicted OOM; not its lists); the
    out-of-memory ones worth a memory probe (with their time) also go to ``near``. What
    :func:`enumerate_space` and :func:`~tuner.space.stream.stream_space` share."""
    gpu = study_gpu(spec)
    model, fw = spec.model, spec.framework
    precision, headroom = spec.training.precision, spec.search.memory_headroom
    gpn = spec.cluster.gpus_per_node
    probing = bool(spec.search.memory_probes and with_time)
    measured = terms is not None and not terms.is_catalog
    judge = MemoryJudge.of(model, gpu, fw, precision, headroom, probing, fast and not measured,
                           terms)  # fmt: skip
    # configs the memory model reads alike (moe.memory_view) share one verdict and breakdown;
    # the knob they differ in is the innermost loop, so a few recent views suffice
    seen: dict[ParallelConfig, tuple[MemoryBreakdown | DeferredMemory, bool]] = {}
    rules = RuleTable(model, spec.world_size, fw, spec.training, gpn)
    axes = expand_axes(spec)

    def estimate(config: ParallelConfig) -> TimeBreakdown:
        return estimate_time(model, spec.training, config, gpu, gpn, fw, rates, terms=terms)

    # configs that differ only in full recompute's method and chunk, with the same share of
    # layers run again, have one step time (tuner.models.time.shared); the exact path times
    # each config afresh
    alike = judge.fast and terms is None and sum(rc == "full" for rc, *_ in axes.recompute) > 1
    timed = SharedTimes(model, estimate) if alike else estimate
    for values in valid_values(iter_blocks(spec, axes), axes.size, rules, report):
        config = built(values)
        # deferred: the bounds settled it, computed when read
        memory, ok = _shared(seen, config, judge) if judge.fast else judge.memory(config)
        if ok:
            yield Candidate(config, memory, True, timed(config) if with_time else None)
            continue
        report.predicted_oom += 1
        yield Candidate(config, memory, False)
        if near is not None and probing and judge.may_probe(memory):
            near.append(Candidate(config, memory, False, timed(config)))


def _shared(
    seen: dict[ParallelConfig, tuple[MemoryBreakdown | DeferredMemory, bool]],
    config: ParallelConfig, judge: MemoryJudge,
) -> tuple[MemoryBreakdown | DeferredMemory, bool]:  # fmt: skip
    """``judge.memory(config)``, or the one of a recent config the memory model reads alike
    (``moe.memory_view``): the same breakdown, so one object serves both."""
    view = memory_view(config)
    if view not in seen:
        if len(seen) > 8:
            seen.clear()
        seen[view] = judge.memory(config)
    return seen[view]


class SharedSpace:
    """One :func:`enumerate_space` of a study under ``rates``, made on first use and kept.

    The model sampler's candidates and the screen's memory probes read the same one: the
    enumeration estimates every config's memory and time (about 1 s of CPU for the 70B space), and
    both need it with the same rates, so a study loop builds it once and hands it to both.
    """

    __slots__ = ("_report", "keep", "rates", "spec", "terms")

    def __init__(
        self, spec: StudySpec, rates: Rates | None = None, terms: StackTerms | None = None,
        keep: Collection[str] | None = None,
    ) -> None:  # fmt: skip
        """``keep``: the only configs (by key) the study may consider, all others left out of
        the enumeration (:meth:`SpaceReport.restricted`); None, the whole space. A replay of
        configs measured elsewhere (``benchmarks/replays.py``) searches those and no other."""
        self.spec, self.rates, self.terms = spec, rates, terms
        self.keep = None if keep is None else frozenset(keep)
        self._report: SpaceReport | None = None

    def report(self) -> SpaceReport:
        """The enumeration (viable configs with their times, and the memory probes); shared, so
        callers must not change it."""
        if self._report is None:
            whole = enumerate_space(self.spec, keep_oom=self.keep is not None, rates=self.rates,
                                    terms=self.terms)  # fmt: skip
            self._report = whole if self.keep is None else whole.restricted(self.keep)
        return self._report


def probes_of(
    near: list[Candidate], fastest: float, limit: int, capacity_gib: float
) -> list[Candidate]:
    """The near-limit configs worth a probe, fastest first: predicted faster than ``fastest``
    (the fastest config that fits) and with a chance of fitting (``probes.may_probe``, on the
    exact peak, computed here for those the step leaves in the running), at most ``limit``."""
    faster = [c for c in near if c.time is not None and c.time.step < fastest]
    faster = [c for c in faster if _may_probe_on_bounds(c, capacity_gib)]
    faster = [c for c in faster if _may_probe(c, capacity_gib)]
    faster.sort(key=lambda c: (c.time.step if c.time else 0.0, _peak(c), c.config.key()))
    return faster[:limit]


def _may_probe(c: Candidate, capacity_gib: float) -> bool:
    """``probes.may_probe`` on ``c``'s exact peak and sd (``DeferredMemory.peak_sigma``: from
    the worst stage alone where narrowing finds it)."""
    b = c.breakdown
    peak, sigma = b.peak_sigma() if isinstance(b, DeferredMemory) else (b.peak, b.sigma)
    return may_probe(peak / GIB, capacity_gib, sigma)


def _peak(c: Candidate) -> float:
    b = c.breakdown
    return b.peak() if isinstance(b, DeferredMemory) else b.peak


def _may_probe_on_bounds(c: Candidate, capacity_gib: float) -> bool:
    """False where ``c``'s bounds (every stage's, bounded here if the judge stopped early:
    ``DeferredMemory.complete``) prove its exact breakdown fails ``probes.may_probe``: its
    lower bound over the probes' ceiling at its sd bound, as ``MemoryJudge.may_probe`` has it;
    True otherwise (then the exact breakdown decides)."""
    b = c.breakdown
    if not isinstance(b, DeferredMemory) or b.known:
        return True
    b.complete()
    return b.low <= probe_ceiling_gib(capacity_gib, b.sigma_high) * GIB


def fastest_fit(report: SpaceReport) -> float:
    """The predicted step of the fastest viable config (inf: none, or no times)."""
    return min((c.time.step for c in report.viable if c.time), default=float("inf"))


def require_viable(spec: StudySpec, report: SpaceReport) -> None:
    """Raise a one-line ConfigError when no config of the space can run (all invalid or OOM)."""
    if report.viable:
        return
    rules = ", ".join(f"{rule} {n}" for rule, n in report.invalid_by_rule.most_common(3))
    raise ConfigError(
        f"no viable config in the search space of {spec.name}: {report.total} total, "
        f"{report.invalid} invalid by rule{f' ({rules})' if rules else ''}, "
        f"{report.predicted_oom} predicted OOM; nothing to run",
        path="space",
    )


def config_from_settings(spec: StudySpec, settings: list[str]) -> ParallelConfig:
    """Build one config from ``key=value`` strings; unset knobs take the space's first value."""
    axes = expand_axes(spec)
    rc, method, n, mods = axes.recompute[0]
    values: dict[str, Any] = {
        "tp": axes.tp[0], "pp": axes.pp[0], "cp": axes.cp[0], "vp": axes.vp[0],
        "micro_batch_size": axes.micro_batch_size[0],
        "sequence_parallel": axes.sequence_parallel[0], "recompute": rc,
        "recompute_method": method, "recompute_num_layers": n, "recompute_modules": mods,
        "distributed_optimizer": axes.distributed_optimizer[0], "zero_stage": axes.zero_stage[0],
        "pipeline_split": axes.pipeline_split[0], "ep": axes.ep[0], "etp": axes.etp[0],
        "moe_token_dispatcher": axes.moe_token_dispatcher[0],
        "tp_comm_overlap": axes.tp_comm_overlap[0],
    }  # fmt: skip
    given = parse_settings(settings, spec.framework, dense=spec.model.moe is None)
    values.update(given)
    if "sequence_parallel" not in given and values["tp"] == 1:
        values["sequence_parallel"] = False  # SP is meaningless at tp=1: don't default into it
    if "tp_comm_overlap" not in given and not values["sequence_parallel"]:
        values["tp_comm_overlap"] = False  # userbuffers need SP: don't default into it
    if "pipeline_split" not in given and values["pp"] == 1:
        values["pipeline_split"] = EVEN  # one stage: no split to choose
    if "recompute" in given:  # selective:MOD+MOD carries its modules, full:METHOD:N its knobs
        knobs = parse_recompute(str(given["recompute"]))
        values["recompute"], values["recompute_modules"] = knobs.granularity, knobs.modules
        for name, value in (("recompute_method", knobs.method),
                            ("recompute_num_layers", knobs.num_layers)):  # fmt: skip
            if value is not None:
                given.setdefault(name, value)
                values[name] = given[name]
    if values["recompute"] != "full":
        values["recompute_method"] = given.get("recompute_method")
        values["recompute_num_layers"] = given.get("recompute_num_layers")
    else:
        values["recompute_method"] = values["recompute_method"] or "uniform"
        if not values["recompute_num_layers"]:
            values["recompute_num_layers"] = 1
    mp = values["tp"] * values["pp"] * values["cp"]
    values["dp"] = max(spec.world_size // mp, 1) if mp > 0 else 1
    if axes.fsdp2:  # torchtitan: dp = dp_shard x dp_replicate, vp from the schedule
        own = tuple(given.get(n, d) for n, d in zip(KNOBS, axes.fsdp[0], strict=True))
        values["dp"], values["vp"], fields = config_fields(
            own, spec.world_size, values["tp"], values["pp"], values["cp"], 1, str(own[2])  # type: ignore[arg-type]
        )  # fmt: skip
        values.update(fields or {})
    values.pop("dp_shard", None)
    return ParallelConfig(global_batch_size=spec.training.global_batch_size, **values)
