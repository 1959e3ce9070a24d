"""A full-scale step predicted from a proxy: the same config measured at a smaller DP size.

A proxy keeps every rank's work (tp, pp, cp, ep, vp, micro-batch, micro-batches per step; the
global batch scales with DP) and changes only what depends on the DP size: the exposed gradient
reduction and parameter gather, the sharded optimizer step (distributed optimizer, ZeRO, FSDP:
``psi / dp`` states per rank) and the expert-DP group of MoE layers. The full-scale step is the
measured proxy step plus the difference the time model predicts between the two scales
(``tuner.models.time.estimate.estimate_time`` at both: one definition of every term, the
collectives priced at each scale's node count from the same ``Rates``, a cluster profile's or
the catalog's).

The difference is not additive in the model's own compute speed. Megatron reduces gradients
during the last micro-batch's backward and gathers parameters during the first forward
(``tuner.models.time.dp.dp_megatron``): only the traffic longer than those windows is exposed, so
how much a larger DP group adds depends on how long the windows really are. The proxy measures
them: the time model's per-rank work (compute, memory traffic, per-op and per-micro-batch
overheads) is rescaled by the one factor ``s`` that makes the model's proxy step equal the
measured one, while the links keep their rates (a proxy's DP traffic is a small part of its
step, so its measurement says little about the network; the links are what the profile measured).
Both scales are then priced with the rescaled rates. ``s`` is bounded to
[``MIN_SCALE``, ``MAX_SCALE``]; a measurement outside what any ``s`` explains is kept as the
proxy step and only the modelled difference is added at the bound (``clamped``).

Pure arithmetic on Python floats, as the rest of the time model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.models.rates import Rates, catalog_rates
from tuner.models.time.breakdown import TimeBreakdown
from tuner.models.time.estimate import estimate_time
from tuner.spec.frameworks import Framework
from tuner.spec.study import ModelSpec, TrainingSpec

MIN_SCALE = 0.05
"""Smallest factor on the model's per-rank work: a proxy 20x faster than predicted is a broken
measurement (or a broken model), not a fast cluster."""
MAX_SCALE = 20.0
"""Largest factor on the model's per-rank work (CPU ranks or a throttled GPU run slower than the
catalog says, but not 20x)."""
SOLVE_STEPS = 48
"""Bisection steps on log(s): 2^-48 of the bracket's log-width, far below any timer's precision."""
DP_TERMS = ("dp_comm", "optimizer")
"""The breakdown's parts a DP size changes (the rest differ only through ``s``, equal at both
scales; ``ProxyBreakdown.other`` keeps whatever else differs, e.g. a pipeline hop that crosses
nodes at one scale and not at the other)."""
_ADDITIVE = (
    "compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "pp_bubble", "dp_comm",
    "optimizer", "stage_imbalance", "overhead", "fp8_cast", "moe_routing",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProxyBreakdown:
    """The full-scale step predicted from a measured proxy, term by term (seconds)."""

    measured_proxy_s: float
    """The proxy's measured step."""
    predicted_proxy_s: float
    """The time model's proxy step at its own rates (before the rescale)."""
    scale: float
    """``s``: the factor on the model's per-rank work that explains the measured proxy step."""
    clamped: bool
    """Whether ``s`` hit its bound (the measurement is outside what the model explains)."""
    dp_comm: tuple[float, float]
    """Exposed DP traffic (proxy, full), at the rescaled rates."""
    optimizer: tuple[float, float]
    """The optimizer step (proxy, full): its states sharded over each scale's DP group."""
    other: float
    """What the other parts differ by from proxy to full (0 unless a link changes)."""
    step_s: float
    """The predicted full-scale step: measured proxy step plus the modelled difference."""

    @property
    def difference_s(self) -> float:
        """Full minus proxy, as modelled."""
        return self.step_s - self.measured_proxy_s

    def to_dict(self) -> dict[str, float | bool]:
        """Flat figures for JSON, tables and trial attributes."""
        return {
            "measured_proxy_s": self.measured_proxy_s,
            "predicted_proxy_s": self.predicted_proxy_s, "scale": self.scale,
            "clamped": self.clamped, "dp_comm_proxy_s": self.dp_comm[0],
            "dp_comm_full_s": self.dp_comm[1], "optimizer_proxy_s": self.optimizer[0],
            "optimizer_full_s": self.optimizer[1], "other_s": self.other, "step_s": self.step_s,
        }  # fmt: skip


def scaled_rates(rates: Rates, s: float) -> Rates:
    """``rates`` with every per-rank rate ``s`` times slower (GEMMs, attention, HBM, per-op and
    per-micro-batch / per-step overheads); the links (``intra``, ``inter``) unchanged."""
    return dataclasses.replace(
        rates,
        peak=rates.peak / s, gemm=rates.gemm / s, gemm16=rates.gemm16 / s,
        gemm_samples=tuple((m, n, k, f / s) for m, n, k, f in rates.gemm_samples),
        attention=tuple((t, f / s, b / s) for t, f, b in rates.attention),
        hbm=rates.hbm / s, op_latency=rates.op_latency * s,
        microbatch_overhead=rates.microbatch_overhead * s, step_overhead=rates.step_overhead * s,
    )  # fmt: skip


def _parts(b: TimeBreakdown) -> dict[str, float]:
    return {name: float(getattr(b, name)) for name in _ADDITIVE}


def extrapolate(
    model: ModelSpec, training: TrainingSpec, full: ParallelConfig, proxy: ParallelConfig,
    measured_proxy_s: float, gpu: GPUSpec, gpus_per_node: int,
    framework: Framework = "megatron", rates: Rates | None = None,
) -> ProxyBreakdown:  # fmt: skip
    """The step of ``full`` predicted from ``proxy``'s measured step (``measured_proxy_s``).

    ``proxy`` must be ``full`` at a smaller DP (``tuner.space.proxy.proxy_config``); ``rates``:
    the cluster's (a profile's), the catalog's by default. See the module docstring."""
    if not measured_proxy_s > 0:
        raise ValueError(f"a proxy step must be positive, got {measured_proxy_s}")
    base = rates or catalog_rates(gpu, training.precision)

    def step(config: ParallelConfig, s: float) -> TimeBreakdown:
        return estimate_time(model, training, config, gpu, gpus_per_node, framework,
                             scaled_rates(base, s))  # fmt: skip

    predicted = step(proxy, 1.0).step
    lo, hi = math.log(MIN_SCALE), math.log(MAX_SCALE)
    if step(proxy, MIN_SCALE).step >= measured_proxy_s:
        s, clamped = MIN_SCALE, True
    elif step(proxy, MAX_SCALE).step <= measured_proxy_s:
        s, clamped = MAX_SCALE, True
    else:  # the proxy's step grows with s: bisect on log(s)
        for _ in range(SOLVE_STEPS):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if step(proxy, math.exp(mid)).step < measured_proxy_s else (lo, mid)
        s, clamped = math.exp(0.5 * (lo + hi)), False
    at_proxy, at_full = _parts(step(proxy, s)), _parts(step(full, s))
    diff = {k: at_full[k] - at_proxy[k] for k in _ADDITIVE}
    other = sum(v for k, v in diff.items() if k not in DP_TERMS)
    return ProxyBreakdown(
        measured_proxy_s=measured_proxy_s, predicted_proxy_s=predicted, scale=s,
        clamped=clamped, dp_comm=(at_proxy["dp_comm"], at_full["dp_comm"]),
        optimizer=(at_proxy["optimizer"], at_full["optimizer"]), other=other,
        step_s=measured_proxy_s + sum(diff.values()),
    )  # fmt: skip
