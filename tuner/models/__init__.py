"""Pure models over (study, config): device memory per stage and step time, each an explained
breakdown.

Owns :mod:`.memory` (the peak per pipeline stage: weights, gradients, optimizer states,
activations, buffers, the allocator's slack and the stack's overheads), :mod:`.time` (the step:
compute, TP/CP/EP/DP communication, the pipeline's bubble, recompute, FP8), and what both read:
the GPU's rates (:mod:`.rates`), MoE routing (:mod:`.moe`), the optimizer's layout.

May import: :mod:`tuner.config`, :mod:`tuner.spec`, :mod:`tuner.catalog` and below. Never the
search, calibration, the loop, launchers, logs, report or CLI: a model does no I/O.
"""

from __future__ import annotations

from tuner.models.memory.estimate import GIB, MemoryBreakdown, estimate_memory, fits
from tuner.models.time.estimate import TimeBreakdown, estimate_time

__all__ = ["GIB", "MemoryBreakdown", "TimeBreakdown", "estimate_memory", "estimate_time", "fits"]
