"""A predicted device memory as an explained breakdown: per phase (:class:`PhaseMemory`), per
pipeline stage (:class:`StageMemory`) and for the config (:class:`MemoryBreakdown`);
:func:`tuner.models.memory.estimate.estimate_memory` builds them."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from tuner.models.uncertainty import (
    CATALOG_MEMORY_SIGMA,
    MEMORY_GROUPS,
    Provenance,
    TermSource,
    band,
    term_sources,
)

GIB = float(2**30)
Phase = Literal["fwd_bwd", "step"]
# The former fixed relative uncertainty of a predicted device peak (8%, an in-sample judgement).
# A breakdown now states its own (MemoryBreakdown.sigma): each term's held-out catalog error or
# its measured spread, combined (tuner.models.uncertainty). Kept as the floor the probes'
# band never goes under without a measurement of this stack.
MEMORY_UNCERTAINTY = 0.08
PHASE_TIE_BYTES = 1.0
"""Device figures of a stage's two phases this close count as a tie (``StageMemory.worst``)."""
PARTS = (
    "weights grads optimizer activations stage_extras framework_buffers workspaces slack "
    "cuda_context comm_buffers"
).split()
METRIC_PARTS = {
    "allocated": tuple(p for p in PARTS if p not in ("slack", "cuda_context", "comm_buffers")),
    "reserved": tuple(p for p in PARTS if p not in ("cuda_context", "comm_buffers")),
    "device": tuple(PARTS),
}
"""The terms each figure sums (``PhaseMemory.allocated`` / ``reserved`` / ``device``)."""


@functools.lru_cache(maxsize=256)
def memory_sources(provenance: Provenance = ()) -> Mapping[str, TermSource]:
    """Every memory term's source: ``provenance``'s where given, else the catalog's (cached:
    every breakdown of a space asks for the same; read-only)."""
    return MappingProxyType(term_sources(PARTS, provenance, MEMORY_GROUPS, CATALOG_MEMORY_SIGMA))


def phase_sigma(phase: PhaseMemory, metric: str = "device", provenance: Provenance = ()) -> float:
    """Relative sd of ``phase``'s ``metric`` figure from its terms' sources (the sum
    :func:`tuner.models.uncertainty.combined_sigma` makes, over a cached plan of the terms:
    the space's enumeration and the sampler ask it of every config)."""
    total = var = 0.0
    whole: dict[str, float] = {}
    for name, sigma, share, group in _sigma_plan(metric, provenance):
        value = getattr(phase, name)
        total += value
        var += (value * sigma) ** 2
        if share and value:
            whole[group] = max(whole.get(group, 0.0), share)
    if total <= 0:
        return 0.0
    return math.sqrt(var / total**2 + sum(w * w for w in whole.values()))


@functools.lru_cache(maxsize=256)
def _sigma_plan(metric: str, provenance: Provenance) -> tuple[tuple[str, float, float, str], ...]:
    sources = memory_sources(provenance)
    return tuple(
        (n, sources[n].sigma, sources[n].whole, sources[n].group or n)
        for n in METRIC_PARTS[metric]
    )


@dataclass(frozen=True, slots=True)
class PhaseMemory:
    """Bytes one rank holds at the peak of one phase, by term."""

    phase: Phase
    weights: float
    grads: float
    optimizer: float
    activations: float  # transformer layers' saved activations (all in-flight micro-batches)
    stage_extras: float  # embedding output, final norm, output-layer input, fp32 logits
    framework_buffers: float  # buckets, gathered ZeRO-3 parameters, optimizer-step temporaries
    workspaces: float  # GEMM workspaces, Megatron's global memory buffer (persistent scratch)
    slack: float  # caching allocator: reserved but not allocated
    cuda_context: float  # CUDA context and kernel images
    comm_buffers: float  # NCCL communicators' buffers, TE userbuffers

    @property
    def allocated(self) -> float:
        """Live tensor bytes (torch.cuda.max_memory_allocated)."""
        return (
            self.weights + self.grads + self.optimizer + self.activations + self.stage_extras
            + self.framework_buffers + self.workspaces
        )  # fmt: skip

    @property
    def reserved(self) -> float:
        """Caching allocator's reserved bytes (torch.cuda.max_memory_reserved)."""
        return self.allocated + self.slack

    @property
    def device(self) -> float:
        """What nvidia-smi shows for the process: reserved + context + NCCL."""
        return self.device_with(self.slack)

    def device_with(self, slack: float) -> float:
        """The device figure were the allocator's slack ``slack`` (the same sum, in order)."""
        return self.allocated + slack + self.cuda_context + self.comm_buffers

    def to_dict(self) -> dict[str, Any]:
        """Each term in GiB plus the three figures."""
        out: dict[str, Any] = {"phase": self.phase}
        out.update({n: round(getattr(self, n) / GIB, 4) for n in PARTS})
        for n in ("allocated", "reserved", "device"):
            out[f"{n}_gib"] = round(getattr(self, n) / GIB, 4)
        return out


@dataclass(frozen=True, slots=True)
class StageMemory:
    """One pipeline stage: its layer count, in-flight micro-batches and both phases."""

    stage: int
    layers: int
    in_flight: float  # micro-batches whose activations the stage holds at its peak
    params: float  # parameters one rank of the stage holds (before ZeRO-3 sharding)
    layout: str  # the optimizer layout (e.g. "deepspeed ZeRO-2")
    phases: tuple[PhaseMemory, PhaseMemory]  # (fwd_bwd, step)
    lazy_optimizer: float = 0.0  # Adam moments the first optimizer step creates (in optimizer)

    @property
    def worst(self) -> PhaseMemory:
        """The phase with the largest device figure (fwd_bwd on a tie: the cache never shrinks,
        so the step's reserved figure equals the forward/backward's unless the step needs new
        segments; a byte's tolerance absorbs the float sums of the two phases' terms)."""
        fwd, step = self.phases
        return step if step.device > fwd.device + PHASE_TIE_BYTES else fwd

    @property
    def allocated(self) -> float:
        """Largest allocated figure over the phases."""
        return max(p.allocated for p in self.phases)

    @property
    def reserved(self) -> float:
        """Largest reserved figure over the phases (the allocator never gives memory back)."""
        return max(p.reserved for p in self.phases)

    @property
    def device(self) -> float:
        """Largest device figure over the phases."""
        return max(p.device for p in self.phases)

    @property
    def first_iteration_allocated(self) -> float:
        """Allocated peak of the first iteration alone: its forward/backward runs before the
        optimizer's lazily created moments exist (what a log printed after iteration 1 shows)."""
        fwd, step = self.phases
        return max(fwd.allocated - self.lazy_optimizer, step.allocated)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, GiB."""
        return {
            "stage": self.stage, "layers": self.layers, "in_flight": round(self.in_flight, 3),
            "params": self.params, "layout": self.layout, "peak_phase": self.worst.phase,
            "allocated_gib": round(self.allocated / GIB, 4),
            "reserved_gib": round(self.reserved / GIB, 4),
            "device_gib": round(self.device / GIB, 4),
            "phases": [p.to_dict() for p in self.phases],
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """All stages; the flat attributes describe the worst (stage, phase): the OOM decider."""

    stages: tuple[StageMemory, ...]
    provenance: Provenance = ()
    """Terms measured on this stack (name, source); every other term is the catalog's."""

    @property
    def sigma(self) -> float:
        """Relative sd of the peak (device figure of the worst stage and phase), from where its
        terms came (:mod:`tuner.models.uncertainty`)."""
        return phase_sigma(self.worst, "device", self.provenance)

    def band_gib(self) -> tuple[float, float]:
        """The peak's 90% band, GiB."""
        low, high = band(self.peak, self.sigma)
        return low / GIB, high / GIB

    @property
    def worst_stage(self) -> StageMemory:
        """The stage with the largest device figure (the first such on a tie)."""
        return max(self.stages, key=lambda s: s.device)

    @property
    def worst(self) -> PhaseMemory:
        """The (stage, phase) whose device figure is the peak."""
        return self.worst_stage.worst

    @property
    def stage(self) -> int:
        """Index of the worst stage."""
        return self.worst_stage.stage

    @property
    def phase(self) -> Phase:
        """Phase of the worst stage that peaks."""
        return self.worst.phase

    @property
    def in_flight(self) -> int:
        """Micro-batches the worst stage holds at once (rounded up for interleaving)."""
        held = self.worst_stage.in_flight
        return int(round(held)) if abs(held - round(held)) < 1e-9 else int(held + 0.999)

    @property
    def params(self) -> float:
        """Parameters a rank of the worst stage holds."""
        return self.worst_stage.params

    @property
    def allocated(self) -> float:
        """Allocated bytes of the worst (stage, phase)."""
        return self.worst.allocated

    @property
    def reserved(self) -> float:
        """Reserved bytes of the worst (stage, phase)."""
        return self.worst.reserved

    @property
    def device(self) -> float:
        """Device bytes of the worst (stage, phase) = max over all of them."""
        return self.worst.device

    @property
    def peak(self) -> float:
        """The device figure: what must fit in the GPU's memory."""
        return self.device

    @property
    def activation_share(self) -> float:
        """The share of the worst (stage, phase)'s allocated bytes that are activations (the
        layers' saved tensors and the stage's embedding / logits ones): the part of the peak
        that a knob like recomputation or the micro-batch size scales
        (:mod:`tuner.calibrate.correction` apportions a measured memory error by it)."""
        w = self.worst
        return (w.activations + w.stage_extras) / w.allocated if w.allocated > 0 else 0.0

    @property
    def fragmentation(self) -> float:
        """Allocator slack of the worst (stage, phase) (the former name of the term)."""
        return self.worst.slack

    @property
    def weights(self) -> float:
        """Worst (stage, phase): 16-bit (or fp32) weights."""
        return self.worst.weights

    @property
    def grads(self) -> float:
        """Worst (stage, phase): gradients as the framework keeps them."""
        return self.worst.grads

    @property
    def optimizer(self) -> float:
        """Worst (stage, phase): optimizer states (fp32 master, Adam moments)."""
        return self.worst.optimizer

    @property
    def activations(self) -> float:
        """Worst (stage, phase): saved activations of the transformer layers."""
        return self.worst.activations

    @property
    def stage_extras(self) -> float:
        """Worst (stage, phase): embedding / logits activations."""
        return self.worst.stage_extras

    @property
    def framework_buffers(self) -> float:
        """Worst (stage, phase): buckets, gathered parameters, step temporaries."""
        return self.worst.framework_buffers

    @property
    def workspaces(self) -> float:
        """Worst (stage, phase): cuBLAS workspaces."""
        return self.worst.workspaces

    @property
    def cuda_context(self) -> float:
        """Worst (stage, phase): CUDA context and kernel images."""
        return self.worst.cuda_context

    @property
    def comm_buffers(self) -> float:
        """Worst (stage, phase): NCCL buffers."""
        return self.worst.comm_buffers

    def to_dict(self) -> dict[str, Any]:
        """The worst (stage, phase)'s terms in GiB, the three figures and every stage."""
        out: dict[str, Any] = {n: round(getattr(self.worst, n) / GIB, 4) for n in PARTS}
        out["fragmentation"] = out["slack"]
        out.update(
            stage=self.stage, phase=self.phase, in_flight=self.in_flight,
            allocated_gib=round(self.allocated / GIB, 4),
            reserved_gib=round(self.reserved / GIB, 4), device_gib=round(self.device / GIB, 4),
            peak_gib=round(self.peak / GIB, 4), uncertainty=round(self.sigma, 4),
            band_gib=[round(x, 4) for x in self.band_gib()],
            sources={n: s.to_dict() for n, s in memory_sources(self.provenance).items()},
            stages=[s.to_dict() for s in self.stages],
        )  # fmt: skip
        return out


# ----------------------------------------------------------------------------- assembly
