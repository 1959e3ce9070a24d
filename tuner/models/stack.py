"""Terms measured on the user's own stack, as an explicit input of the memory and time models.

``tune profile --probe`` (:mod:`tuner.profile.probe`) runs the study's own launch template with the
study's model cut to 1 and a few layers per stage, at a few points of the space, and derives from
the differences between depths what a formula cannot know about the stack: how long one transformer
layer's forward and backward really take per micro-batch, how long the per-micro-batch rest (the
embedding, LM head, loss and the framework's per-micro-batch work) takes, how many bytes one
layer's saved activations and the stage's extras (logits, embedding output) really hold, the
allocator's slack (reserved - allocated) and the memory held outside the allocator (device -
reserved: CUDA context, NCCL, workspaces) where the stack reports them.

Each measured figure is stored as the ratio of the measurement to the model's own term at the
probed point (:class:`StackPoint`), so the model's structure carries it to every other config:
layers per stage, micro-batches in flight, the pipeline's bubble (which is made of per-layer
time), TP and CP splits and the micro-batch size scale the measured term exactly as they scale
the catalog's, and the collectives stay the collective profile's. Each term of an estimate says
where it came from (:meth:`StackTerms.sources`): ``measured`` at a probed point, with the probe's
own spread, or ``catalog``.

:data:`CATALOG` (no points) is the default everywhere: the models then are exactly the catalog's,
and a fast path may use its own arithmetic only when ``terms.is_catalog``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tuner.config.parallel import ParallelConfig
from tuner.config.spelling import RECOMPUTE_KNOB, spell
from tuner.models.memory.breakdown import MemoryBreakdown, PhaseMemory, StageMemory
from tuner.models.moe import framework_moe, moe_layer_flags
from tuner.models.rates import Rates
from tuner.models.time.breakdown import TimeBreakdown
from tuner.models.uncertainty import (
    MEMORY_SIGMA_FLOORS,
    TIME_SIGMA_FLOORS,
    Provenance,
    TermSource,
)
from tuner.spec.study import Framework, ModelSpec

TIME_TERMS = ("layer_time", "fixed_time", "optimizer_step", "step_overhead")
MEMORY_TERMS = (
    "activations", "stage_extras", "model_states", "slack", "outside_allocator", "optimizer_temps",
)  # fmt: skip
TERMS = TIME_TERMS + MEMORY_TERMS
"""Every term an estimate reports the source of (:meth:`StackTerms.sources`)."""


POINT_KNOBS = ("tp", "cp", "pp", "ep", "mbs", RECOMPUTE_KNOB, "zero", "distopt")
"""The knobs that tell the probe's points apart (:class:`StackPoint`), as the spelling names
them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StackPoint:
    """What the probe measured at one point ``(tp, cp, micro-batch, recompute, zero stage)``."""

    tp: int
    cp: int = 1
    mbs: int
    recompute: str
    zero_stage: int = 0
    ep: int = 1
    distopt: bool = False
    """Megatron's distributed optimizer (its sharding, as the ZeRO stage is DeepSpeed's)."""
    pp: int = 1
    """Pipeline stages. A point with more than one (the probe's pipeline point) gives the configs
    with pipeline stages its per-micro-batch rest (``fixed_scale``) alone: a pipeline engine's
    rest is its own (:meth:`StackTerms.point`)."""
    layer_scale: float | None = None
    """Measured / model seconds of one layer's forward + backward (+ recomputation) per
    micro-batch; None where not measured."""
    fixed_scale: float | None = None
    """Measured / model seconds of the per-micro-batch rest (embedding, LM head, loss, the
    framework's per-micro-batch overhead)."""
    activation_scale: float | None = None
    """Measured / model bytes of one layer's saved activations."""
    extras_scale: float | None = None
    """Measured / model bytes of the stage's extras (embedding output, logits, loss)."""
    states_scale: float | None = None
    """Measured / model bytes of the model states (weights, gradients, optimizer states and the
    framework's buffers around them) at this point's sharding (ZeRO stage, distributed
    optimizer); None: the catalog's."""
    step_scale: float | None = None
    """Measured / model seconds of the step's sharding-dependent work (data-parallel gradient and
    parameter traffic, the optimizer step) at this point's sharding; None: the catalog's."""
    overhead_scale: float | None = None
    """Measured / model seconds of the step's fixed rest (what an optimizer step does once
    besides data-parallel traffic and the optimizer's arithmetic: the engine's step call,
    gradient-norm and clipping, logging; ``Rates.step_overhead``), from the base point run at
    two micro-batch counts; None: the catalog's."""
    expert_fixed_s: float | None = None
    """Seconds each local expert call of an MoE layer costs per micro-batch whatever its tokens,
    beyond ``layer_scale`` times the model's layer (:func:`expert_calls`): from the point at two
    micro-batch sizes (a line in the model's layer seconds); None: the layer is a ratio alone."""
    temps_scale: float | None = None
    """Measured / model bytes of the optimizer step's temporaries (the step phase's buffers);
    None: the catalog's."""
    slack_bytes: float | None = None
    """The allocator's slack, reserved - allocated (None: not reported, e.g. CPU ranks)."""
    outside_bytes: float | None = None
    """Device - reserved: CUDA context, NCCL, workspaces (None: not reported)."""
    time_spread: float = 0.0
    """Relative spread of the probe's own step-time samples (median absolute deviation /
    median, worst depth)."""
    memory_spread: float = 0.0
    """Relative spread of the probe's peak-memory figures over its ranks."""
    activations_unresolved: bool = False
    """Whether the point ran full recomputation on GPU ranks and its layers' activations came
    out at or under nothing (``activation_scale`` is then None: the catalog's). Under full
    (uniform) recomputation a layer still keeps its input, ``2sbh`` bytes per layer and
    micro-batch in flight (split by TP under sequence parallelism), and the layer being
    recomputed holds its full activations again in its backward (Korthikanti et al. 2022,
    sec. 5; ``tuner.models.memory.terms.layers_activation_bytes``): a run whose peak left
    nothing for them (the few bytes of a shallow run under what the model over-counts
    elsewhere) has not measured them, and composing with none would drop them from every
    deeper stage."""

    @property
    def config(self) -> ParallelConfig:
        """The point's knobs as a config (the others at their defaults: a point is not one
        config but every config that shares its :data:`POINT_KNOBS`)."""
        return ParallelConfig(tp=self.tp, cp=self.cp, pp=self.pp, ep=self.ep,
                              micro_batch_size=self.mbs, recompute=self.recompute,  # type: ignore[arg-type]
                              zero_stage=self.zero_stage,
                              distributed_optimizer=self.distopt)  # fmt: skip

    @property
    def label(self) -> str:
        """How estimates name the point, in the spelling of every config a person reads
        (:mod:`tuner.config.spelling`): ``tp1 pp1 mbs2``."""
        return spell(self.config, POINT_KNOBS)

    def distance(self, config: ParallelConfig) -> float:
        """How far ``config`` is from this point: recomputation weighs most (it changes what a
        layer does), then the expert and optimizer sharding (what a layer computes and gathers),
        then the micro-batch size (log2 steps)."""
        return (
            4.0 * (self.recompute != config.recompute)
            + 2.0 * (self.ep != config.ep)
            + 2.0 * (self.zero_stage != config.zero_stage)
            + 2.0 * (self.distopt != config.distributed_optimizer)
            + abs(math.log2(self.mbs / max(config.micro_batch_size, 1)))
        )


@dataclass(frozen=True, slots=True)
class TermOrigin:
    """Where one probe-measurable term of an estimate came from, and at which probed point (its
    uncertainty is :class:`tuner.models.uncertainty.TermSource`'s, :func:`stack_provenance`)."""

    term: str
    source: str
    """``measured`` or ``catalog``."""
    spread: float | None = None
    """The measurement's own relative spread (``measured`` only)."""
    point: str | None = None
    """The probed point it was measured at (:attr:`StackPoint.label`)."""
    note: str | None = None
    """Why a term of the point is the catalog's all the same (:data:`UNRESOLVED`)."""


@dataclass(frozen=True, slots=True)
class StackTerms:
    """The probe's points; empty (:data:`CATALOG`): every term is the catalog's."""

    points: tuple[StackPoint, ...] = ()

    @property
    def is_catalog(self) -> bool:
        """Whether nothing was measured (the models are exactly the catalog's)."""
        return not self.points

    def _nearest(self, config: ParallelConfig) -> tuple[StackPoint, StackPoint | None] | None:
        """(the probed point nearest ``config`` with its TP and CP degrees, the nearest one with
        its sharding: ZeRO stage, distributed optimizer and EP), or None."""
        same = [p for p in self.points if (p.tp, p.cp, p.pp) == (config.tp, config.cp, 1)]
        if not same:
            return None
        shard = [p for p in same if (p.zero_stage, p.distopt, p.ep) == _sharding(config)]
        near = min(same, key=lambda p: p.distance(config))
        return near, min(shard, key=lambda p: p.distance(config)) if shard else None

    def point(self, config: ParallelConfig) -> StackPoint | None:
        """The measured terms for ``config``, composed from the probed points with its TP and CP
        degrees (per-layer work splits by them, and their collectives are the collective
        profile's), or None. What a layer saves and computes comes from the nearest point
        (recomputation and EP weigh most: they change the layer's work); the model states and
        the step's sharding-dependent work from the nearest point with the config's own sharding
        (ZeRO stage, distributed optimizer, EP), because sharding changes what each rank holds of
        the states and how gradients and parameters travel, not what a layer saves or computes
        (ZeRO, Rajbhandari et al. 2020, sec. 5). Without a point of its sharding the states and
        that work stay the catalog's."""
        found = self._nearest(config)
        if found is None:
            return None
        near, shard = found
        if near is not shard:
            near = dataclasses.replace(
                near, states_scale=shard.states_scale if shard else None,
                step_scale=shard.step_scale if shard else None,
            )  # fmt: skip
        pipe = self._pipeline(config)
        if pipe is None:
            return near
        spread = max(near.time_spread, pipe.time_spread)
        return dataclasses.replace(near, fixed_scale=pipe.fixed_scale, time_spread=spread)

    def _pipeline(self, config: ParallelConfig) -> StackPoint | None:
        """The probed pipeline point for ``config`` (with pipeline stages, its TP and CP; the
        nearest stage count), whose per-micro-batch rest it takes: a pipeline engine runs each
        micro-batch through its own schedule (DeepSpeed's ``PipelineEngine`` executes an
        instruction list per micro-batch: load, forward, send activation, receive gradient,
        backward, send gradient; the last stage alone runs the LM head and loss), so the rest
        measured under the data-parallel engine is not its. Its layers stay the flat points'
        (the same blocks, the same kernels); its bubble is the model's own schedule structure
        (``tuner.models.time.pipeline``) made of them. None without one."""
        if config.pp == 1:
            return None
        pipes = [p for p in self.points if (p.tp, p.cp) == (config.tp, config.cp) and p.pp > 1
                 and p.fixed_scale is not None]  # fmt: skip
        return min(pipes, key=lambda p: abs(p.pp - config.pp)) if pipes else None

    def sources(self, config: ParallelConfig) -> tuple[TermOrigin, ...]:
        """Each of :data:`TERMS` for ``config``: measured (and where) or catalog."""
        found = self._nearest(config)
        p = self.point(config)
        shard = found[1] if found else None
        values = {
            "layer_time": p and p.layer_scale, "fixed_time": p and p.fixed_scale,
            "optimizer_step": p and p.step_scale, "step_overhead": p and p.overhead_scale,
            "activations": p and p.activation_scale, "stage_extras": p and p.extras_scale,
            "model_states": p and p.states_scale, "optimizer_temps": p and p.temps_scale,
            "slack": p and p.slack_bytes, "outside_allocator": p and p.outside_bytes,
        }  # fmt: skip
        out = []
        for term in TERMS:
            if p is not None and term == "activations" and p.activations_unresolved:
                out.append(TermOrigin(term, "catalog", point=p.label, note=UNRESOLVED))
                continue
            if p is None or values.get(term) is None:
                out.append(TermOrigin(term, "catalog"))
                continue
            where = shard if shard and term in ("optimizer_step", "model_states") else p
            pipe = self._pipeline(config)
            where = pipe if pipe and term == "fixed_time" else where
            spread = where.time_spread if term in TIME_TERMS else where.memory_spread
            out.append(TermOrigin(term, "measured", spread, where.label))
        return tuple(out)


def _sharding(config: ParallelConfig) -> tuple[int, bool, int]:
    return config.zero_stage, config.distributed_optimizer, config.ep


UNRESOLVED = (
    "its full-recompute run left nothing for them: each layer's checkpointed input "
    "and one layer's recompute, as the catalog counts them"
)
"""Why a full-recompute point's activations are the catalog's (``activations_unresolved``),
as ``tune estimate``'s sources say it."""
CATALOG = StackTerms()
"""No measured term: the models' default."""


def expert_calls(model: ModelSpec, config: ParallelConfig, framework: Framework) -> float:
    """Local expert calls per layer per micro-batch on one rank, averaged over the layers (the
    MoE layers' share): each MoE layer calls its E / ep local experts one after another where
    they are not one grouped GEMM (DeepSpeed-MoE's ``Experts.forward``, deepspeed/moe/
    experts.py: one module call per local expert on its chunk of the dispatched buffer, each
    with its own GEMMs and autograd nodes; Megatron's ``SequentialMLP``), one call otherwise."""
    moe = framework_moe(model, config, framework).moe
    if moe is None:
        return 0.0
    share = sum(moe_layer_flags(model)) / model.num_layers
    return share * (1 if moe.grouped_gemm else max(1, moe.num_experts // config.ep))


def scaled_layer_times(
    terms: StackTerms | None, config: ParallelConfig, fwd: float, bwd: float, core: float,
    head: float, microbatch_overhead: float, model: ModelSpec | None = None,
    framework: Framework = "megatron",
) -> tuple[float, float, float, float, float]:  # fmt: skip
    """(fwd, bwd, attention core, head, per-micro-batch overhead) of one micro-batch with the
    measured terms: the layer's times times ``layer_scale`` (recomputation, being a share of the
    forward, follows), and the head and the framework's per-micro-batch overhead such that their
    sum is ``fixed_scale`` times the model's, and ``expert_fixed_s`` per expert call (given
    ``model`` and ``framework``: :func:`expert_calls`) added to the layer, split as the layer's
    forward and backward are (a recomputed forward calls the experts again: its recomputation,
    a share of the forward, follows). The head takes the change first; a measured rest
    under the model's overhead alone (a stack whose per-micro-batch call costs less than the
    catalog's) leaves the head nil and the overhead what was measured, so the composed model
    gives the probe's own runs whatever the rest measured."""
    p = None if terms is None else terms.point(config)
    if p is None:
        return fwd, bwd, core, head, microbatch_overhead
    k = p.layer_scale if p.layer_scale is not None else 1.0
    if p.fixed_scale is not None:
        rest = p.fixed_scale * (head + microbatch_overhead)
        head = max(rest - microbatch_overhead, 0.0)
        microbatch_overhead = rest - head
    calls = expert_calls(model, config, framework) if model is not None else 0.0
    fixed = (p.expert_fixed_s or 0.0) * calls
    share = fwd / (fwd + bwd) if fwd + bwd > 0 else 0.5
    fwd, bwd = fwd * k + share * fixed, bwd * k + (1 - share) * fixed
    return fwd, bwd, core * k, head, microbatch_overhead


def composed_memory(
    memory: MemoryBreakdown, config: ParallelConfig, terms: StackTerms | None
) -> MemoryBreakdown:
    """``memory`` with the measured terms: activations and extras scaled by what one layer and
    the stage's extras measured, the model states (weights, gradients, optimizer states and
    the buffers around them) by what the point of the config's sharding measured, the step's
    temporaries by what the stack's figure holds of them, slack and the memory outside the
    allocator replaced where the stack reported them."""
    p = None if terms is None else terms.point(config)
    if p is None:
        return memory
    return MemoryBreakdown(tuple(_stage(s, p) for s in memory.stages), memory_provenance(p))


def composed_time(
    time: TimeBreakdown, config: ParallelConfig, terms: StackTerms | None,
    rates: Rates | None = None,
) -> TimeBreakdown:  # fmt: skip
    """``time`` (already built from the measured layer times, :func:`scaled_layer_times`) with
    the step's sharding-dependent work (data-parallel traffic and the optimizer step) scaled as
    the point of its sharding measured it, the step's fixed rest (``rates.step_overhead``
    seconds in ``time.overhead``) as the probe measured it, and the provenance of its measured
    terms, so its stated sd is theirs."""
    p = None if terms is None else terms.point(config)
    given = () if p is None else time_provenance(p)
    if p is not None and p.overhead_scale is not None and rates is not None:
        extra = (p.overhead_scale - 1.0) * rates.step_overhead
        time = dataclasses.replace(time, overhead=time.overhead + extra, step=time.step + extra)
    if p is not None and p.step_scale is not None:
        k = p.step_scale
        extra = (k - 1.0) * (time.dp_comm + time.optimizer)
        time = dataclasses.replace(time, dp_comm=time.dp_comm * k, optimizer=time.optimizer * k,
                                   step=time.step + extra)  # fmt: skip
    return dataclasses.replace(time, provenance=given) if given else time


def memory_provenance(p: StackPoint) -> Provenance:
    """The measured memory terms of point ``p`` with their uncertainty: the probe's own spread,
    never under the group's floor (``tuner.models.uncertainty.MEMORY_SIGMA_FLOORS``: what a
    measurement still leaves, padding for counted bytes, fragmentation for the slack); memory
    outside the allocator, measured as one figure, keeps the fixed group's floor as a share of
    the whole figure."""
    why = f"framework probe at {p.label}"
    counted = max(p.memory_spread, MEMORY_SIGMA_FLOORS["counted"])
    out: list[tuple[str, TermSource]] = []
    if p.activation_scale is not None:
        out.append(("activations", TermSource("measured", counted, why, group="counted")))
    if p.extras_scale is not None:
        out.append(("stage_extras", TermSource("measured", counted, why, group="counted")))
    if p.states_scale is not None:
        for name in ("weights", "grads", "optimizer", "framework_buffers"):
            out.append((name, TermSource("measured", counted, why, group="counted")))
    if p.temps_scale is not None:  # the step phase's buffers (its temporaries)
        out.append(("framework_buffers", TermSource("measured", counted, why, group="counted")))
    if p.slack_bytes is not None:
        slack = max(p.memory_spread, MEMORY_SIGMA_FLOORS["slack"])
        out.append(("slack", TermSource("measured", slack, why, group="slack")))
    if p.outside_bytes is not None:
        fixed = TermSource("measured", 0.0, why, MEMORY_SIGMA_FLOORS["fixed"], "fixed")
        out += [("cuda_context", fixed), ("comm_buffers", fixed)]
    return tuple(out)


def time_provenance(p: StackPoint) -> Provenance:
    """The measured step-time terms of point ``p``: the layers' compute (and what is made of
    it: recomputation and the pipeline's bubble) and the per-micro-batch rest, at the probe's
    own spread, never under the compute group's floor (kernels' rates vary by a few percent run
    to run, ``TIME_SIGMA_FLOORS``)."""
    why = f"framework probe at {p.label}"
    sd = max(p.time_spread, TIME_SIGMA_FLOORS["compute"])
    names: tuple[str, ...] = ()
    if p.layer_scale is not None:
        names += ("compute", "recompute", "pp_bubble")
    if p.fixed_scale is not None:
        names += ("overhead",)
    out = [(n, TermSource("measured", sd, why, group="compute")) for n in names]
    if p.step_scale is not None:  # measured as one figure, at the collectives' floor
        comm = max(p.time_spread, TIME_SIGMA_FLOORS["comm"])
        out += [(n, TermSource("measured", comm, why, group="comm")) for n in ("dp_comm",)]
        out += [("optimizer", TermSource("measured", sd, why, group="compute"))]
    return tuple(out)


def _stage(stage: StageMemory, p: StackPoint) -> StageMemory:
    fwd, step = (_phase(ph, p) for ph in stage.phases)
    return StageMemory(
        stage.stage, stage.layers, stage.in_flight, stage.params, stage.layout, (fwd, step),
        stage.lazy_optimizer,
    )  # fmt: skip


def _phase(ph: PhaseMemory, p: StackPoint) -> PhaseMemory:
    a = p.activation_scale if p.activation_scale is not None else 1.0
    x = p.extras_scale if p.extras_scale is not None else 1.0
    k = p.states_scale if p.states_scale is not None else 1.0
    # the step phase's buffers are the optimizer step's temporaries: a term of their own
    # (``optimizer_temps``), which a peak of the forward and backward phase does not measure
    t = p.temps_scale if p.temps_scale is not None else 1.0
    buffers = ph.framework_buffers * (k if ph.phase == "fwd_bwd" else t)
    context, comm = ph.cuda_context, ph.comm_buffers
    if p.outside_bytes is not None:  # measured as one figure: kept in the context's place
        context, comm = p.outside_bytes, 0.0
    return PhaseMemory(
        phase=ph.phase, weights=ph.weights * k, grads=ph.grads * k, optimizer=ph.optimizer * k,
        activations=ph.activations * a, stage_extras=ph.stage_extras * x,
        framework_buffers=buffers, workspaces=ph.workspaces,
        slack=ph.slack if p.slack_bytes is None else p.slack_bytes,
        cuda_context=context, comm_buffers=comm,
    )  # fmt: skip
