"""Memory probes: near-limit configs that the memory model's own error could be hiding.

The memory model is a prediction with an error. Pruning every config predicted over the limit
would hide a fast config that in fact fits: on a replay of measured A100 clusters the fastest
config of one cluster ran fine but was predicted at 82.7 GiB on an 80 GiB GPU. So a config
predicted over the headroom limit is still launched, as a *memory probe*, when

- it could fit: its chance of staying under the GPU's capacity, with the model's relative error
  taken as log-normal with the breakdown's own sd (``MemoryBreakdown.sigma``: each term's
  held-out catalog error or measured spread, ``tuner.models.uncertainty``), is at least
  :data:`MIN_FIT_PROBABILITY`;
- it is worth it: the time model predicts it faster than every config that fits (a slower
  config could not improve the answer even if it fit);
- the study allows it: at most ``search.memory_probes`` of them, the fastest first.

A probe is an ordinary trial (its outcome is ``oom`` or a measured step time, so a probe that
fits costs no second launch) and is marked ``memory_probe`` in the storage. The model sampler
re-judges probes with the memory it has measured: its posterior sd of the memory correction
replaces the stated sd once that is smaller, so the band narrows as peaks arrive.

The other side of the band: a config predicted within the headroom limit whose chance of going
over the GPU's capacity is at least :data:`RISK_LEVEL` is *at risk*, not a sure fit: ``tune
estimate`` says so and the screen marks its trial (``memory_risk``).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from tuner.models.memory.estimate import MEMORY_UNCERTAINTY

MEMORY_SIGMA = MEMORY_UNCERTAINTY
"""The former fixed relative error of a predicted peak; only the default of the functions below
for callers without a breakdown (every caller in the tool passes ``MemoryBreakdown.sigma``)."""

RISK_LEVEL = 0.01
"""A config predicted within the headroom limit with at least this chance of exceeding the GPU's
memory is flagged *at risk*, not a sure fit: an out-of-memory launch costs a trial and measures
no step time, so a sure fit is one that runs out of memory less than once in a hundred."""

MIN_FIT_PROBABILITY = 0.2
"""Below this chance of fitting, a launch is more likely an OOM than a measurement."""


def fit_probability(peak_gib: float, capacity_gib: float, sigma: float = MEMORY_SIGMA) -> float:
    """Chance that a config predicted at ``peak_gib`` stays within ``capacity_gib`` when the
    true peak is log-normal around the prediction with sd ``sigma``."""
    if peak_gib <= 0:
        return 1.0
    if sigma <= 0:
        return 1.0 if peak_gib <= capacity_gib else 0.0
    z = math.log(capacity_gib / peak_gib) / sigma
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def may_probe(peak_gib: float, capacity_gib: float, sigma: float = MEMORY_SIGMA) -> bool:
    """Whether a near-limit config has a real chance of fitting."""
    return fit_probability(peak_gib, capacity_gib, sigma) >= MIN_FIT_PROBABILITY


def probe_ceiling_gib(capacity_gib: float, sigma: float = MEMORY_SIGMA) -> float:
    """A peak above which :func:`may_probe` is false: the peak where the chance of fitting is
    :data:`MIN_FIT_PROBABILITY`, raised by a millionth so that floating-point rounding in
    :func:`fit_probability` cannot move a config across it (the enumeration's fast path rejects a
    config on a lower bound of its peak above this, ``tuner.space.enumerate``)."""
    z = NormalDist().inv_cdf(MIN_FIT_PROBABILITY)
    return capacity_gib * math.exp(-sigma * z) * (1.0 + 1e-6)


def at_risk(peak_gib: float, capacity_gib: float, sigma: float = MEMORY_SIGMA) -> bool:
    """Whether a config's chance of exceeding ``capacity_gib`` is at least :data:`RISK_LEVEL`."""
    return 1.0 - fit_probability(peak_gib, capacity_gib, sigma) >= RISK_LEVEL
