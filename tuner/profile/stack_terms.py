"""The framework probe's measurements as the models' measured terms, and its saved file.

Derivation (each figure from differences, none fitted): the study's own models are evaluated at the
probed config and depth, and split by their own structure into what the probe measures and what it
does not. For time, one optimizer step of ``m`` micro-batches at ``L`` layers per stage is
``m x V(L) + S(L)``, where ``V(L) = L x layer + rest`` is what each micro-batch computes (the
layers' forward, backward and recomputation; the embedding, LM head, loss and the framework's
per-micro-batch work) and ``S(L)`` everything else (optimizer step, gradient reduction, step
overhead: the catalog's and the collective profile's). The measured step times at the two depths (1
layer and a few, :func:`tuner.profile.probe.probe_depths`) less ``S`` give the measured ``layer``
(their difference over ``m`` and the layers between them) and ``rest``; each is kept as its ratio
to the model's (:class:`tuner.models.stack.StackPoint`); ``S``'s fixed part (the step's own work
besides the gradient reduction and the optimizer's arithmetic) is measured by the base's 1-layer
run at more micro-batches (:func:`_overhead_scale`), and a pipeline point's per-micro-batch rest by
solving the composed model for it (:func:`_pipeline_point`). Where the probe interleaved its
points' steps, each row's step time is first read against the base point's 1-layer run, as its
median times their paired ratio (:func:`tuner.profile.paired.aligned`), so a drifting load moves
the rows of a group alike and leaves their differences alone. For memory the peak allocated
bytes at the two depths less the model's weights, gradients, optimizer states and buffers give
one layer's activations (the difference over the layers between them) and the stage's extras
(what is left at 1 layer). A point run at one depth takes the rest and the extras of its base
point (same TP and CP) and measures its own per-layer figures. In an MoE study the base's config
also runs at another micro-batch size (:func:`tuner.profile.probe.probe_runs`): the layer at the
two sizes is a line in the model's layer seconds, whose slope is the layer scale and whose
intercept the seconds each local expert call costs per micro-batch whatever its tokens
(:func:`_expert_fixed`), which every point of the group then takes but the EP neighbour: it
takes the base's slope and keeps what its own run measured over it as its part per micro-batch
(:func:`_ep_point`: the token exchange's blocking all-to-alls, a cost per call). Slack
(reserved - allocated)
comes from GPU runs only: on CPU ranks the workloads' reserved figure is the growth of the
resident set, not an allocator's.

The probe's saved file is :mod:`tuner.profile.probe_file`'s; the terms are derived again from its
rows on load, under the current cluster profile's rates.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.config.parallel import ParallelConfig
from tuner.layout import ClusterLayout
from tuner.models.memory.estimate import GIB, estimate_memory
from tuner.models.rates import Rates, catalog_rates
from tuner.models.stack import CATALOG, StackPoint, StackTerms, expert_calls
from tuner.models.time.estimate import estimate_time
from tuner.profile.paired import aligned, spread
from tuner.profile.probe import BATCH_SCALE, ProbeRow, reduced
from tuner.profile.probe_file import check_probe, load_probe
from tuner.profile.run import ProfileError, local_versions
from tuner.space.enumerate import iter_configs, study_gpu
from tuner.spec.study import StudySpec

# ----------------------------------------------------------------------------- derivation


def _time_parts(
    spec: StudySpec, c: ParallelConfig, depth: int, rates: Rates, overhead: float | None = None
) -> tuple[float, float, float]:
    """(V, S, D) of the model at ``depth`` layers: per micro-batch compute, the step's rest, and
    the part of the rest that the sharding decides (data-parallel traffic, optimizer step).
    ``overhead``: the measured ``overhead_scale`` of the step's fixed rest, in S."""
    small = reduced(spec, c, depth)
    b = estimate_time(small.model, spec.training, c, study_gpu(spec), spec.cluster.gpus_per_node,
                      spec.framework, rates)  # fmt: skip
    m = max(c.num_microbatches, 1)
    v = (b.compute + b.recompute) / m + rates.microbatch_overhead
    shift = (overhead - 1.0) * rates.step_overhead if overhead is not None else 0.0
    return v, b.step - m * v + shift, b.dp_comm + b.optimizer


def _overhead_scale(spec: StudySpec, c: ParallelConfig, one: ProbeRow,
                    wide: tuple[ProbeRow, ParallelConfig] | None,
                    rates: Rates) -> float | None:  # fmt: skip
    """Measured / model seconds of the step's fixed rest (``rates.step_overhead``: the engine's
    optimizer-step call, gradient-norm and clipping, logging), from the base point at 1 layer
    run with ``m`` and with ``k x m`` micro-batches per step (``wide``, the config it ran). Each
    run less the model's step rest ``S`` at its own micro-batch count (what grows with them
    there: DeepSpeed's per-micro-batch gradient accumulation, ZeRO-2/3's per-micro-batch
    traffic) is ``m x V`` plus the fixed rest, so their difference over ``(k - 1) x m`` is one
    micro-batch's work ``V`` and ``t - m x V - S`` the fixed rest's departure from the model's:
    the composed model then gives both runs' steps. None without ``wide``; nil when measured
    at or under nothing."""
    m = max(c.num_microbatches, 1)
    if wide is None or rates.step_overhead <= 0 or wide[1].num_microbatches <= m:
        return None
    row, cw = wide
    _, s_one, _ = _time_parts(spec, c, one.depth, rates)
    _, s_wide, _ = _time_parts(spec, cw, row.depth, rates)
    per_mb = ((row.step_s - s_wide) - (one.step_s - s_one)) / (cw.num_microbatches - m)
    fixed = one.step_s - m * per_mb - (s_one - rates.step_overhead)
    return max(fixed, 0.0) / rates.step_overhead


def _memory_parts(
    spec: StudySpec, c: ParallelConfig, depth: int
) -> tuple[float, float, float, float]:
    """(other, states, activations, extras) bytes of the model's phase with the largest allocated
    figure (the one a peak-allocated measurement sees) at ``depth`` layers: ``states`` are the
    model states (weights, gradients, optimizer states, and the buffers around them in the
    forward and backward phase; the step phase's are the optimizer's temporaries), ``other``
    the rest besides activations and extras (workspaces, the step's temporaries)."""
    small = reduced(spec, c, depth)
    mem = estimate_memory(small.model, c, study_gpu(spec), spec.framework,
                          spec.training.precision)  # fmt: skip
    ph = max((p for s in mem.stages for p in s.phases), key=lambda p: p.allocated)
    states = ph.weights + ph.grads + ph.optimizer
    states += ph.framework_buffers if ph.phase == "fwd_bwd" else 0.0
    other = ph.allocated - states - ph.activations - ph.stage_extras
    return other, states, ph.activations, ph.stage_extras


def _ratio(measured: float, model: float) -> float | None:
    """A time's measured / model ratio; None when either is not positive (no measurement)."""
    return measured / model if measured > 0 and model > 0 else None


def _part_ratio(measured: float, model: float) -> float | None:
    """A part's measured / model ratio, where the part is what the probe's runs leave after the
    other parts are taken out: a part left at or under nothing is nothing, not "not measured"
    (bytes of a checkpointed layer that keeps no more than its input; a per-micro-batch rest or
    a sharded work that the runs' noise puts under nil). None when the model has none."""
    return max(measured, 0.0) / model if model > 0 else None


def _bytes_ratio(measured: float, model: float) -> float | None:
    """:func:`_part_ratio` of a part in bytes, where less than one byte is nothing: what the
    figures' arithmetic leaves of a part the runs did not hold (a rounding residue) reads as
    nil, not as a measured sliver."""
    return _part_ratio(measured if measured >= 1.0 else 0.0, model)


def _base_point(spec: StudySpec, c: ParallelConfig, rows: Mapping[int, ProbeRow],
                rates: Rates,
                wide: tuple[ProbeRow, ParallelConfig] | None = None) -> StackPoint:  # fmt: skip
    """A point run at two depths (``lo`` and ``hi`` layers per stage,
    :func:`tuner.profile.probe.probe_depths`): every term from their difference over the layers
    between them, and the step's fixed rest from the ``lo``-layer run at more
    micro-batches (``wide``, :func:`_overhead_scale`)."""
    m = max(c.num_microbatches, 1)
    lo, hi = min(rows), max(rows)
    k_over = _overhead_scale(spec, c, rows[lo], wide, rates)
    (v1, s1, _), (v2, s2, _) = (_time_parts(spec, c, d, rates, k_over) for d in (lo, hi))
    t1, t2 = rows[lo].step_s, rows[hi].step_s
    layer, lay_model = ((t2 - s2) - (t1 - s1)) / m / (hi - lo), (v2 - v1) / (hi - lo)
    rest = (t1 - s1) / m - lo * layer
    (f1, w1, a1, e1), (f2, w2, a2, e2) = (_memory_parts(spec, c, d) for d in (lo, hi))
    o1, o2 = f1 + w1, f2 + w2
    p1, p2 = rows[lo].peak_gib * GIB, rows[hi].peak_gib * GIB
    k_act = _bytes_ratio((p2 - o2) - (p1 - o1), a2 - a1)
    extras = p1 - o1 - (k_act or 1.0) * a1
    return _point(spec, c, rows.values(), layer_scale=_ratio(layer, lay_model),
                  fixed_scale=_part_ratio(rest, v1 - lo * lay_model), activation_scale=k_act,
                  extras_scale=_part_ratio(extras, e1), overhead_scale=k_over)  # fmt: skip


def _neighbour_point(spec: StudySpec, c: ParallelConfig, row: ProbeRow, base: StackPoint | None,
                     rates: Rates) -> StackPoint:  # fmt: skip
    """A point run at one depth. It takes the base point's rest, extras and expert calls' fixed
    part. A neighbour in sharding alone (ZeRO stage, distributed optimizer: what each rank holds
    of the model states and how gradients and parameters travel, not what a layer saves or
    computes) also takes the base's per-layer terms and measures its states and its step's
    sharding-dependent work. A neighbour in EP alone, where the base measured its layer at two
    sizes, takes the base's slope and measures its own part per micro-batch (:func:`_ep_point`;
    as a ratio when its layer came out under that slope); any other neighbour (recomputation,
    micro-batch size) measures its own per-layer terms."""
    if base is not None and _sharding_only(c, base):
        return _sharding_point(spec, c, row, base, rates)
    layer, lay_model = _one_depth_layer(spec, c, row, base, rates)
    fixed, calls = _fixed_of(spec, c, base), expert_calls(spec.model, c, spec.framework)
    if base is not None and base.expert_fixed_s is not None and _ep_only(c, base) and calls:
        own = layer - (base.layer_scale or 0.0) * lay_model
        if base.layer_scale is not None and own >= 0.0:
            return _ep_point(spec, c, row, base, own / calls)
    other, states, act, ext = _memory_parts(spec, c, row.depth)
    k_ext = base.extras_scale if base and base.extras_scale is not None else 1.0
    acts = row.peak_gib * GIB - other - states - k_ext * ext
    return _point(spec, c, (row,),
                  layer_scale=_part_ratio(layer - fixed, lay_model) if fixed
                  else _ratio(layer, lay_model),
                  fixed_scale=base.fixed_scale if base else None,
                  activation_scale=_bytes_ratio(acts, act),
                  extras_scale=base.extras_scale if base else None,
                  overhead_scale=base.overhead_scale if base else None,
                  expert_fixed_s=base.expert_fixed_s if base else None)  # fmt: skip


def _ep_only(c: ParallelConfig, base: StackPoint) -> bool:
    """Whether ``c`` differs from the base point in its EP degree alone."""
    knobs = (c.micro_batch_size, c.recompute, c.zero_stage, c.distributed_optimizer)
    return knobs == (base.mbs, base.recompute, base.zero_stage, base.distopt) and c.ep != base.ep


def _ep_point(spec: StudySpec, c: ParallelConfig, row: ProbeRow, base: StackPoint,
              per_call: float) -> StackPoint:  # fmt: skip
    """A neighbour in EP alone, run at the base's micro-batch size, where the base measured its
    layer as a line over two sizes (:func:`_expert_fixed`): its layer takes the base's slope
    (``layer_scale``) and keeps what its run measured over it as its own part per micro-batch
    (``per_call`` seconds per local expert call: :func:`tuner.models.stack.expert_calls`).
    What EP changes in a layer does not grow with the tokens: each rank runs E / ep experts on
    ep times their tokens (the capacity-padded buffers DeepSpeed's ``MOELayer`` exchanges),
    the same GEMM FLOPs on the same kernels, while the exchange adds two blocking all-to-alls
    per MoE layer forward and two backward per micro-batch, whose cost on a busy host is the
    wait for the slowest rank, not their bytes (the demo's two CPU ranks measured 1-2 ms a call
    in the step against the collective profile's 0.2 ms alone), and the gate runs once per
    layer however many experts are local. Read as a ratio of the per-token work instead, that
    part shrank with the micro-batch: ep 2 at micro-batch 1, never run, read 8-30% high."""
    other, states, act, ext = _memory_parts(spec, c, row.depth)
    k_ext = base.extras_scale if base.extras_scale is not None else 1.0
    acts = row.peak_gib * GIB - other - states - k_ext * ext
    return _point(spec, c, (row,), layer_scale=base.layer_scale,
                  fixed_scale=base.fixed_scale, activation_scale=_bytes_ratio(acts, act),
                  extras_scale=base.extras_scale, overhead_scale=base.overhead_scale,
                  expert_fixed_s=per_call)  # fmt: skip


def _one_depth_layer(spec: StudySpec, c: ParallelConfig, row: ProbeRow, base: StackPoint | None,
                     rates: Rates) -> tuple[float, float]:  # fmt: skip
    """(measured, model) seconds of one layer per micro-batch of a run at one depth: its step
    less the model's step rest (with the base's measured fixed rest) and the base's
    per-micro-batch rest, over its layers."""
    m, depth = max(c.num_microbatches, 1), row.depth
    (v1, _, _), (v2, _, _) = (_time_parts(spec, c, d, rates) for d in (1, 2))
    _, sd, _ = _time_parts(spec, c, depth, rates, base.overhead_scale if base else None)
    k_rest = base.fixed_scale if base and base.fixed_scale is not None else 1.0
    return ((row.step_s - sd) / m - k_rest * (2 * v1 - v2)) / depth, v2 - v1


def _fixed_of(spec: StudySpec, c: ParallelConfig, base: StackPoint | None) -> float:
    """Seconds of ``c``'s expert calls' fixed part per layer per micro-batch as ``base``
    measured it (nil where it measured none)."""
    per_call = base.expert_fixed_s if base and base.expert_fixed_s else 0.0
    return per_call * expert_calls(spec.model, c, spec.framework)


def _expert_fixed(spec: StudySpec, base: StackPoint, c: ParallelConfig, row: ProbeRow,
                  rates: Rates) -> StackPoint:  # fmt: skip
    """The base point with its layer as a line in the model's layer seconds ``M``: measured
    ``L = k x M + F`` at the base's micro-batch size (its two depths) and at ``c``'s (``row``,
    the base's config at another size, one depth, read as a neighbour is), ``F`` the seconds
    that do not grow with the micro-batch. In an MoE layer they are its expert calls' (each
    local expert a module call of its own per micro-batch: :func:`tuner.models.stack.
    expert_calls`; DeepSpeed's gate, ``TopKGate`` in deepspeed/moe/sharded_moe.py, some thirty
    small ops per call whatever the tokens, is counted with them), kept per call. ``F`` is held
    within nil and the base's whole layer, ``k`` then gives the base's runs exactly."""
    calls = expert_calls(spec.model, c, spec.framework)
    (v1, _, _), (v2, _, _) = (_time_parts(spec, c, d, rates) for d in (1, 2))
    base_c = dataclasses.replace(c, micro_batch_size=base.mbs)
    (w1, _, _), (w2, _, _) = (_time_parts(spec, base_c, d, rates) for d in (1, 2))
    m_a, m_b = w2 - w1, v2 - v1
    if calls <= 0 or base.layer_scale is None or abs(m_a - m_b) <= 1e-6 * m_a:
        return base
    l_a = base.layer_scale * m_a
    l_b, _ = _one_depth_layer(spec, c, row, base, rates)
    fixed = min(max((l_b * m_a - l_a * m_b) / (m_a - m_b), 0.0), l_a)
    return dataclasses.replace(base, layer_scale=_part_ratio(l_a - fixed, m_a),
                               expert_fixed_s=fixed / calls)  # fmt: skip


def _size_only(c: ParallelConfig, base: StackPoint) -> bool:
    """Whether ``c`` differs from the base point in its micro-batch size alone."""
    knobs = (c.recompute, c.zero_stage, c.distributed_optimizer, c.ep)
    same = knobs == (base.recompute, base.zero_stage, base.distopt, base.ep)
    return same and c.micro_batch_size != base.mbs


def _sharding_only(c: ParallelConfig, base: StackPoint) -> bool:
    """Whether ``c`` differs from the base point in its ZeRO stage or distributed optimizer
    alone (same micro-batch size, recomputation and EP)."""
    same = (c.micro_batch_size, c.recompute, c.ep) == (base.mbs, base.recompute, base.ep)
    return same and (c.zero_stage, c.distributed_optimizer) != (base.zero_stage, base.distopt)


def _sharding_point(spec: StudySpec, c: ParallelConfig, row: ProbeRow, base: StackPoint,
                    rates: Rates) -> StackPoint:  # fmt: skip
    """A neighbour in sharding alone: what a layer saves and computes is the base's, so the rest
    of its peak is its model states (a ratio to the model's, which scales with the parameters a
    stage holds) and the rest of its step time is its sharding-dependent work (a ratio to the
    model's data-parallel traffic and optimizer step, which scale with the same bytes)."""
    m, depth = max(c.num_microbatches, 1), row.depth
    (v1, _, _), (v2, _, _) = (_time_parts(spec, c, d, rates) for d in (1, 2))
    k_lay = base.layer_scale if base.layer_scale is not None else 1.0
    k_rest = base.fixed_scale if base.fixed_scale is not None else 1.0
    per_mb = (k_lay * (v2 - v1) + _fixed_of(spec, c, base)) * depth + k_rest * (2 * v1 - v2)
    _, sd, shard = _time_parts(spec, c, depth, rates, base.overhead_scale)
    work = row.step_s - m * per_mb - (sd - shard)
    other, states, act, ext = _memory_parts(spec, c, depth)
    k_act = base.activation_scale if base.activation_scale is not None else 1.0
    k_ext = base.extras_scale if base.extras_scale is not None else 1.0
    held = row.peak_gib * GIB - other - k_act * act - k_ext * ext
    return _point(spec, c, (row,), layer_scale=base.layer_scale, fixed_scale=base.fixed_scale,
                  activation_scale=base.activation_scale, extras_scale=base.extras_scale,
                  states_scale=_part_ratio(held, states),
                  step_scale=_part_ratio(work, shard),
                  overhead_scale=base.overhead_scale,
                  expert_fixed_s=base.expert_fixed_s)  # fmt: skip


def _point(
    spec: StudySpec, c: ParallelConfig, rows: Any, *, layer_scale: float | None,
    fixed_scale: float | None, activation_scale: float | None, extras_scale: float | None,
    states_scale: float | None = None, step_scale: float | None = None,
    overhead_scale: float | None = None, expert_fixed_s: float | None = None,
) -> StackPoint:  # fmt: skip
    rows = list(rows)
    slack = temps = None
    unresolved = False
    if spec.cluster.gpu != "cpu":  # reserved on CPU ranks is the RSS growth, not a cache's
        deep = max(rows, key=lambda r: r.depth)
        if deep.reserved_gib is not None:
            slack = max(deep.reserved_gib - deep.peak_gib, 0.0) * GIB
        # full recomputation keeps each layer's input (StackPoint.activations_unresolved): a
        # run that left nothing for them did not measure them, the catalog's term stands
        if c.recompute == "full" and activation_scale is not None and activation_scale <= 0:
            activation_scale, unresolved = None, True
    else:
        # CPU ranks keep no allocator statistics: the peak the stack reports is its tensor
        # accounting (params, grads, optimizer states, saved activations; the workloads'
        # ``tuner-memory`` line), which holds none of the step's transient buffers (a reduce
        # bucket's flattened copy, the fp32 gradient partition): their bytes in its figure
        # are nil on every point, so the composed peak counts none. Nor does it hold a
        # checkpointed layer's input where the framework keeps it outside autograd's saved
        # tensors (DeepSpeed's CheckpointFunction: ``ctx.deepspeed_saved_tensors``): a
        # full-recompute point's nil activations are that accounting's, and stand.
        temps = 0.0
    return StackPoint(
        tp=c.tp, cp=c.cp, mbs=c.micro_batch_size, recompute=c.recompute,
        zero_stage=c.zero_stage, ep=c.ep, distopt=c.distributed_optimizer, slack_bytes=slack,
        time_spread=max(spread(r.samples_s) for r in rows), layer_scale=layer_scale,
        fixed_scale=fixed_scale, activation_scale=activation_scale, extras_scale=extras_scale,
        states_scale=states_scale, step_scale=step_scale, temps_scale=temps,
        overhead_scale=overhead_scale, expert_fixed_s=expert_fixed_s,
        activations_unresolved=unresolved,
    )  # fmt: skip


def probe_configs(
    spec: StudySpec, keys: Collection[str]
) -> tuple[dict[str, ParallelConfig], dict[str, ParallelConfig]]:
    """The configs of ``spec``'s space by key, with those of the probe's row ``keys`` that are
    a base point's run at more micro-batches per step (:data:`tuner.profile.probe.BATCH_SCALE`);
    and those runs alone. A key of neither is a foreign row's."""
    configs = {c.key(): c for c in iter_configs(spec)}
    wides: dict[str, ParallelConfig] = {}
    if set(keys) - configs.keys():
        for c in configs.values():
            if c.pp == 1:
                gbs = c.global_batch_size * BATCH_SCALE
                scaled = dataclasses.replace(c, global_batch_size=gbs)
                wides[scaled.key()] = scaled
        wides = {k: c for k, c in wides.items() if k in keys}
        configs.update(wides)
    return configs, wides


def derive_terms(spec: StudySpec, rows: Sequence[ProbeRow], rates: Rates | None = None,
                 where: str = "") -> StackTerms:  # fmt: skip
    """The measured terms of the probe's ``rows`` for ``spec`` (``rates``: the cluster
    profile's, or the catalog's); a row whose config is not in the space is foreign."""
    rates = rates or catalog_rates(study_gpu(spec), spec.training.precision)
    configs, wides = probe_configs(spec, {r.key for r in rows})
    by_key: dict[str, dict[int, ProbeRow]] = {}
    for row in rows:
        if row.key not in configs:
            raise ProfileError(f"foreign probe: its config {row.key} is not in the study's "
                               f"space; run {spec.profile_command} --probe",
                               file=where)  # fmt: skip
        by_key.setdefault(row.key, {})[row.depth] = row
    by_key = aligned(by_key, configs)
    wide = {(configs[k].tp, configs[k].cp): (d[min(d)], configs[k])
            for k, d in by_key.items() if k in wides}  # fmt: skip
    bases: dict[tuple[int, int], StackPoint] = {}
    for key, depths in by_key.items():
        if len(depths) > 1 and configs[key].pp == 1:
            c = configs[key]
            bases[(c.tp, c.cp)] = _base_point(spec, c, depths, rates, wide.get((c.tp, c.cp)))
    for key, depths in by_key.items():  # the base's config at another micro-batch size
        c, base = configs[key], bases.get((configs[key].tp, configs[key].cp))
        if base is not None and len(depths) == 1 and c.pp == 1 and _size_only(c, base):
            bases[(c.tp, c.cp)] = _expert_fixed(spec, base, c, depths[max(depths)], rates)
    points = list(bases.values())
    for key, depths in by_key.items():
        c = configs[key]
        if len(depths) == 1 and c.pp == 1 and key not in wides:
            row = depths[max(depths)]
            points.append(_neighbour_point(spec, c, row, bases.get((c.tp, c.cp)), rates))
    flat = StackTerms(tuple(points))
    for key, depths in by_key.items():
        c = configs[key]
        if c.pp > 1:
            points.append(_pipeline_point(spec, c, depths[max(depths)], flat, rates))
    return StackTerms(tuple(points))


PIPE_SCALE_MAX = 64.0
"""The largest per-micro-batch rest a pipeline point may state, as a multiple of the model's:
a bound for the search (:func:`_pipeline_point`), far past anything measured (x0.5-3)."""


def _pipeline_point(spec: StudySpec, c: ParallelConfig, row: ProbeRow, flat: StackTerms,
                    rates: Rates) -> StackPoint:  # fmt: skip
    """The pipeline point: its per-micro-batch rest (``fixed_scale``: the LM head on the last
    stage, the loss, the pipeline engine's per-micro-batch schedule) is the one scale at which
    the model, composed with the flat points' per-layer terms (the same blocks) and its own
    schedule (layers per stage, 1F1B fill and drain, point-to-point transfers; sharded work as
    the flat point of its sharding measured it), gives the measured step. The composed step
    rises with that scale (the last stage's head and rest run once per micro-batch), so it is
    found by bisection; a measured step under the composed one at nil rest states nil, one over
    :data:`PIPE_SCALE_MAX` states that."""
    small = reduced(spec, c, row.depth)
    gpu, gpn = study_gpu(spec), spec.cluster.gpus_per_node

    def step(k: float) -> float:
        pipe = StackPoint(tp=c.tp, cp=c.cp, pp=c.pp, mbs=c.micro_batch_size,
                          recompute=c.recompute, zero_stage=c.zero_stage, ep=c.ep,
                          distopt=c.distributed_optimizer, fixed_scale=k)  # fmt: skip
        terms = StackTerms((*flat.points, pipe))
        return estimate_time(small.model, spec.training, c, gpu, gpn, spec.framework, rates,
                             terms=terms).step  # fmt: skip

    lo, hi = 0.0, PIPE_SCALE_MAX
    if row.step_s <= step(lo):
        hi = lo
    elif row.step_s >= step(hi):
        lo = hi
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(mid) < row.step_s else (lo, mid)
    # its other terms are the flat points' (what the configs with pipeline stages take)
    near = flat.point(c) or StackPoint(tp=c.tp, mbs=c.micro_batch_size, recompute=c.recompute)
    return dataclasses.replace(near, cp=c.cp, pp=c.pp, mbs=c.micro_batch_size,
                               recompute=c.recompute, zero_stage=c.zero_stage, ep=c.ep,
                               distopt=c.distributed_optimizer, fixed_scale=(lo + hi) / 2,
                               time_spread=spread(row.samples_s))  # fmt: skip


def study_terms(spec: StudySpec, results: str | Path = "results", rates: Rates | None = None,
                now: dt.datetime | None = None) -> StackTerms:  # fmt: skip
    """The measured terms of ``spec``'s saved probe (checked), or :data:`CATALOG` without one."""
    layout = ClusterLayout(Path(results).resolve(), spec.cluster_name)
    path = layout.stack_yaml(spec.name)
    if not path.is_file():
        return CATALOG
    data = load_probe(path, spec)
    local = local_versions() if spec.cluster.executor == "local" else None
    check_probe(data, spec, now=now or dt.datetime.now(dt.UTC), versions=local, path=str(path))
    return derive_terms(spec, data["rows"], rates, str(path))
