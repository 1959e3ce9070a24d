"""How sure a prediction is, from where each of its terms came.

Every term of a memory or step-time breakdown has a *provenance*: ``catalog`` (a formula over the
GPU and model catalogs) or ``measured`` (taken from runs of this stack, e.g. the framework probe
of ``tune profile``). Each carries a relative standard deviation, the sd of log(true / stated)
of that term:

- a catalog term carries the error the catalog has shown on sources its terms were **not**
  developed on (leave-one-source-out, ``benchmarks/memory_accuracy.py`` and
  ``benchmarks/time_accuracy.py`` print how these figures come out of the held-out rows and
  tests/test_benchmark_data.py holds them to what the benchmarks derive);
- a measured term carries the spread of its measurements (narrow), given by whoever measured it.

The terms are taken as independent, so the sd of a total is the root sum of squares of each
term's sd in bytes (or seconds), over the total, plus once the sd of each group stated as a
share of the whole figure (:data:`WHOLE_FIGURE_GROUPS`); the total is read as log-normal around
the prediction with that sd. A 90% band is ``value x exp(+-1.645 sd)``.

Memory terms fall into three groups that differ in how well a formula can know them and that
the measured figures tell apart: what is *counted* (weights, gradients, optimizer states,
activations, framework buffers, workspaces: the live tensors ``max_memory_allocated`` sees), the
caching allocator's *slack* (reserved minus allocated) and the *fixed* memory outside the
allocator (CUDA context, NCCL's buffers: facts of a software stack a formula cannot see,
pytorch#107667, NVIDIA/nccl#1685). The step time's terms
fall into compute (kernels at the catalog's rates, the pipeline bubble and fixed overheads that
scale with them) and communication (collectives and transfers at the catalog's link rates); on
top of them, a stack never seen has its own bias on every catalog term of its step
(:data:`CATALOG_TIME_STACK_SIGMA`), which the rows of one published source share.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

Source = Literal["catalog", "measured"]

BAND_LEVEL = 0.90
"""The stated band: 90% of true values should fall inside it (the benchmarks print coverage)."""
Z_BAND = NormalDist().inv_cdf(0.5 + BAND_LEVEL / 2)

MEMORY_GROUPS: dict[str, str] = {
    "weights": "counted", "grads": "counted", "optimizer": "counted",
    "activations": "counted", "stage_extras": "counted",
    "framework_buffers": "counted", "workspaces": "counted", "slack": "slack",
    "cuda_context": "fixed", "comm_buffers": "fixed",
}  # fmt: skip
"""Each memory term (``tuner.models.memory.breakdown.PARTS``) and the group its catalog error
is stated for."""

WHOLE_FIGURE_GROUPS = frozenset({"fixed"})
"""Groups whose catalog error is a share of the whole figure they sit in, not of their own
bytes: the memory a stack holds outside PyTorch's allocator (CUDA context and kernel images,
NCCL's buffers, libraries' handles) is a fact of the stack's builds and communicators, which a
catalog figure of a GiB or two cannot scale; what the held-out device figures show is the whole
figure off by a share (BigScience's 2022 stack: 10-20% more on every row)."""

MEMORY_SIGMA_FLOORS: dict[str, float] = {"counted": 0.02, "slack": 0.30, "fixed": 0.01}
"""The least sd each group is known to have whatever the data say (``fixed``: a share of the
whole figure). Counted: padding and alignment the parameter and activation counts round over
(2%). Slack: the allocator's fragmentation spans 5-15% of transient bytes (30% of its figure).
Fixed: the CUDA context alone spans 0.3-1.0 GiB across driver and PyTorch builds
(pytorch#107667, pytorch#109888), about 1% of a large model's figure."""

CATALOG_MEMORY_SIGMA: dict[str, float] = {"counted": 0.095, "slack": 0.70, "fixed": 0.151}
"""Held-out sd of each group's catalog terms (``fixed``: a share of the whole figure): the
maximum-likelihood sds of every source's leave-one-source-out residuals in
``benchmarks/memory_accuracy.py`` (each measured row predicted without the terms developed on
its own source; a known OOM counts as a peak of at least the GPU's memory), never under the
floors."""

TIME_GROUPS: dict[str, str] = {
    "compute": "compute", "recompute": "compute", "optimizer": "compute",
    "stage_imbalance": "compute", "overhead": "compute", "fp8_cast": "compute",
    "moe_routing": "compute", "pp_bubble": "compute",
    "tp_comm": "comm", "cp_comm": "comm", "ep_comm": "comm", "pp_p2p": "comm",
    "dp_comm": "comm",
}  # fmt: skip
"""Each step-time term (``tuner.models.time.breakdown.TimeBreakdown``'s parts) and its group."""

TIME_SIGMA_FLOORS: dict[str, float] = {"compute": 0.05, "comm": 0.10}
"""The least relative sd of the step-time groups: kernels' achieved rates vary by a few percent
run to run and across library versions (5%); collectives by more with topology and NCCL's
algorithm choice (10%)."""

CATALOG_TIME_SIGMA: dict[str, float] = {"compute": 0.100, "comm": 0.290}
"""Held-out relative sd of each group's catalog step-time terms *within* one stack, derived by
``benchmarks/time_accuracy.py`` as the memory's are, from its leave-one-source-out residuals
less each source's own mean (what :data:`CATALOG_TIME_STACK_SIGMA` states)."""

CATALOG_TIME_STACK_SIGMA = 0.130
"""The between-source sd of the catalog's step times: a stack's own bias, shared by every step
it runs (its kernels' and libraries' versions, its clocks and power limits, cluster-wide
effects), which the rows of one published source have in common and the catalog cannot see
(BigScience's 2022 stack: 15% slow on every row). A random-effects view of the held-out
residuals (``benchmarks/held_out.py`` ``between_source_sd``): DerSimonian & Laird's
method-of-moments estimate over the sources' mean residuals, widened to Student's t quantile
for the few sources it rests on (Higgins, Thompson & Spiegelhalter 2009). It moves the catalog
part of a step as one, so it counts in proportion to the terms the catalog states
(:func:`combined_sigma`'s ``stack``) and not for terms measured on the stack itself: the
framework probe's timings carry the stack's bias already, and a calibration from real trials
states its own spread."""

CATALOG_STEP_SIGMA = math.hypot(CATALOG_TIME_SIGMA["compute"], CATALOG_TIME_STACK_SIGMA)
"""How far a catalog step time may be off on a stack never seen: the held-out sd of a step whose
terms are all the catalog's compute (within a stack and the stack's own bias); what ``tune
estimate`` and ``tune space`` say of the catalog's rates (each config states its own sd, from
its terms' shares)."""


@dataclass(frozen=True, slots=True)
class TermSource:
    """Where one term's figure came from and how far it may be off."""

    source: Source
    sigma: float
    """Relative sd of the term (of log(true / stated))."""
    detail: str = ""
    """What stands behind it: the held-out error for a catalog term, the runs for a measured
    one."""
    whole: float = 0.0
    """An sd as a share of the whole figure the term sits in, for its whole group, counted once
    per figure (``WHOLE_FIGURE_GROUPS``); 0 for a term with a relative one."""
    group: str = ""
    """Terms of one whole-figure group share its sd."""

    def to_dict(self) -> dict[str, object]:
        """JSON-able."""
        out: dict[str, object] = {"source": self.source, "sigma": round(self.sigma, 4)}
        if self.whole:
            out["sigma_of_figure"] = round(self.whole, 4)
        return out | {"detail": self.detail}


Provenance = tuple[tuple[str, TermSource], ...]
"""Terms whose source is not the catalog, by name (empty: every term from the catalog). A
breakdown composed from measured terms lists them here with their spread."""


def catalog_term(name: str, groups: Mapping[str, str], sigmas: Mapping[str, float]) -> TermSource:
    """A catalog term's source: its group's held-out sd."""
    group = groups[name]
    detail = f"catalog, held-out error of its {group} terms"
    if group in WHOLE_FIGURE_GROUPS:
        return TermSource("catalog", 0.0, detail, sigmas[group], group)
    return TermSource("catalog", sigmas[group], detail, 0.0, group)


def term_sources(
    names: Iterable[str], provenance: Provenance, groups: Mapping[str, str],
    sigmas: Mapping[str, float],
) -> dict[str, TermSource]:  # fmt: skip
    """Every named term's source: the provenance's where given, else the catalog's."""
    given = dict(provenance)
    return {n: given.get(n) or catalog_term(n, groups, sigmas) for n in names}


def combined_sigma(
    parts: Mapping[str, float], sources: Mapping[str, TermSource], stack: float = 0.0
) -> float:
    """Relative sd of the sum of ``parts``: independent terms, each with its source's relative
    sd, plus each whole-figure group's sd once (where any of its terms is held), plus a
    stack's own bias ``stack`` (:data:`CATALOG_TIME_STACK_SIGMA`) on the share of the figure
    whose terms are the catalog's: one factor moves them all, so it adds as a whole-figure
    sd scaled by that share; a measured term already carries its stack's bias."""
    total = sum(parts.values())
    if total <= 0:
        return 0.0
    var = sum((value * sources[name].sigma) ** 2 for name, value in parts.items()) / total**2
    if stack:
        catalog = sum(v for n, v in parts.items() if sources[n].source == "catalog") / total
        var += (stack * catalog) ** 2
    whole: dict[str, float] = {}
    for name, value in parts.items():
        s = sources[name]
        if s.whole and value:  # a group none of whose terms is held (CPU ranks) adds none
            key = s.group or name
            whole[key] = max(whole.get(key, 0.0), s.whole)
    return math.sqrt(var + sum(w * w for w in whole.values()))


def band(value: float, sigma: float, level: float = BAND_LEVEL) -> tuple[float, float]:
    """The ``level`` band around ``value`` for a log-normal relative sd ``sigma``."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return value * math.exp(-z * sigma), value * math.exp(z * sigma)


def inside(measured: float, predicted: float, sigma: float, level: float = BAND_LEVEL) -> bool:
    """Whether ``measured`` lies in the ``level`` band around ``predicted``."""
    low, high = band(predicted, sigma, level)
    return low <= measured <= high


def max_memory_sigma(provenance: Provenance = (), slack_share: float = 1.0) -> float:
    """An upper bound on the combined sd of any breakdown whose allocator slack is at most
    ``slack_share`` of its figure (1: any breakdown): what a bound-only verdict may assume.

    Why it bounds: the relative part is the root sum of squares of each term's bytes times its
    sd, over the figure T. Every term but the slack has an sd of at most ``rel`` (the largest
    of the other relative groups' and the measured terms'), and the squares of parts never sum
    past the square of their sum, so with s = slack / T the relative variance is at most
    ``((1 - s) rel)^2 + (s sd_slack)^2``: convex in s, so on [0, slack_share] largest at an end.
    Each whole-figure group adds its own once."""
    rel, slack, whole = _sigma_parts(provenance)
    share = min(max(slack_share, 0.0), 1.0)
    var = max(rel * rel, ((1.0 - share) * rel) ** 2 + (share * slack) ** 2)
    return math.sqrt(var + whole)


@functools.lru_cache(maxsize=256)
def _sigma_parts(provenance: Provenance) -> tuple[float, float, float]:
    """(rel, the slack's sd, the whole-figure groups' summed squares) of
    :func:`max_memory_sigma`, which does not depend on the share (cached: the enumeration
    asks per config)."""
    given = [s.sigma for _, s in provenance]
    rel = max([CATALOG_MEMORY_SIGMA[g] for g in CATALOG_MEMORY_SIGMA
               if g not in WHOLE_FIGURE_GROUPS and g != "slack"] + given)  # fmt: skip
    slack = max([CATALOG_MEMORY_SIGMA["slack"], *given])
    whole = [CATALOG_MEMORY_SIGMA[g] for g in WHOLE_FIGURE_GROUPS]
    whole += [s.whole for _, s in provenance]
    return rel, slack, sum(w * w for w in whole)
