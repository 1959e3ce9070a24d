"""A measured cluster profile as the time model's rates (``tuner.models.rates.Rates``).

``tune profile`` measures GEMMs of the study's shapes and the collectives of its groups on the
cluster itself (:mod:`tuner.profile.run`). Here those measurements replace the catalog's datasheet
figures: the GEMM samples replace the tile model (the nearest measured shape gives the achieved
FLOP/s), the all-reduce alpha-beta fits replace the catalog's link rates and latencies, the
memory-streaming figure replaces the datasheet bandwidth times HBM_EFFICIENCY that prices the
element-wise kernels (norms, residual adds, dropouts, softmax), and the fused attention samples
replace the catalog's attention efficiency by call length, and the tiny-op chain's time per op the
catalog's kernel latency. What the profile does not measure (the framework's fixed per-step and
per-micro-batch overheads) stays the catalog's; so do the
FP8 GEMMs of ``precision: fp8``, since the probe times bf16 torch.matmul
(``tuner.profile.plan.make_plan``): its samples then price the 16-bit GEMMs only (LM head,
router).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from tuner.catalog import GPUSpec
from tuner.models.rates import Link, Rates, catalog_rates
from tuner.profile.run import AlphaBeta, AttentionSample, ClusterProfile, study_profile
from tuner.space.enumerate import study_gpu
from tuner.spec.study import StudySpec


def _link(profile: ClusterProfile, fits: list[AlphaBeta], link: str,
          op: str = "all_reduce") -> Link | None:  # fmt: skip
    """The ``op`` fit (the all-reduce's by default) of the largest group on ``link`` as a
    per-GPU link: a group spanning nodes used the network shares of its ranks on each node
    (tuner.models.rates.group_link multiplies them back)."""
    rows = [f for f in fits if f.op == op and f.link == link and f.busbw_gbps > 0]
    if not rows:
        return None
    best = max(rows, key=lambda f: f.group_size)
    on_node = ranks_per_node(profile, op, link, best.group_size) if link == "inter" else 1
    return Link(best.busbw_gbps * 1e9 / on_node, max(best.alpha_s, 0.0))


def ranks_per_node(profile: ClusterProfile, op: str, link: str, size: int) -> int:
    """Most ranks of the measured ``size`` group on one node, from the ranks it ran on (torchrun
    numbers a node's ranks together: rank // ranks-per-host is the node). A group larger than a
    node is placed on consecutive ranks, so it is not ``size // hosts`` on a profile of more nodes
    than the group spans (32 ranks of a 48-node profile hold 8 per node, not 1)."""
    per_host = max(profile.world_size // max(profile.hosts, 1), 1)
    for s in profile.collectives:
        if (s.op, s.link, s.group_size) == (op, link, size) and s.ranks:
            counts: dict[int, int] = {}
            for r in s.ranks:
                counts[r // per_host] = counts.get(r // per_host, 0) + 1
            return max(counts.values())
    return max(1, size // max(profile.hosts, 1))  # no ranks saved: the group spans every host


def attention_table(profile: ClusterProfile) -> tuple[tuple[float, float, float], ...]:
    """The measured attention as ``tuner.models.rates.Rates.attention`` rows, ``(tokens, forward,
    backward)`` FLOP/s ascending in the call's length: per length, the median over the shapes
    measured at it (micro-batch sizes and TP degrees run one kernel on more or fewer heads)."""
    by_seq: dict[int, list[AttentionSample]] = {}
    for a in profile.attention:
        if a.forward_tflops > 0 and a.backward_tflops > 0:
            by_seq.setdefault(a.seq, []).append(a)
    return tuple(
        (float(seq), statistics.median(a.forward_tflops for a in rows) * 1e12,
         statistics.median(a.backward_tflops for a in rows) * 1e12)
        for seq, rows in sorted(by_seq.items())
    )  # fmt: skip


def rates_from_profile(profile: ClusterProfile, gpu: GPUSpec, precision: str) -> Rates:
    """The catalog's rates of ``gpu`` with every figure the profile measured replaced."""
    base = catalog_rates(gpu, precision)
    fits = profile.alpha_beta()
    samples = tuple(
        (float(g.m), float(g.n), float(g.k), g.tflops * 1e12) for g in profile.gemm if g.tflops > 0
    )
    stream, launch = profile.stream, profile.launch
    return dataclasses.replace(
        base,
        gemm_samples=samples or base.gemm_samples,
        attention=attention_table(profile) or base.attention,
        hbm=stream.gbps * 1e9 if stream is not None and stream.gbps > 0 else base.hbm,
        op_latency=launch.per_op_s
        if launch is not None and launch.per_op_s > 0
        else base.op_latency,
        intra=_link(profile, fits, "intra") or base.intra,
        inter=_link(profile, fits, "inter") or base.inter,
        all_to_all=_link(profile, fits, "intra", "all_to_all"),
    )


_BUILT: dict[tuple[str, str, str, str], Rates] = {}


def study_rates(spec: StudySpec, results: str | Path = "results") -> Rates | None:
    """The rates of ``spec``'s cluster from its saved profile (checked: a stale or foreign one is
    a one-line error), or None when there is none (the time model then uses the catalog)."""
    profile = study_profile(spec, results)
    return None if profile is None else profile_rates(spec, profile)


def profile_rates(spec: StudySpec, profile: ClusterProfile) -> Rates:
    """:func:`rates_from_profile` for ``spec``'s GPU and precision, one object per profile: rates
    compare by identity, and the time model's per-shape caches key on them."""
    gpu = study_gpu(spec)
    key = (profile.cluster, profile.created, gpu.name, spec.training.precision)
    if key not in _BUILT:
        _BUILT[key] = rates_from_profile(profile, gpu, spec.training.precision)
    return _BUILT[key]
