"""Pipeline stages: which transformer layers each stage holds, and what its schedule keeps alive.

One definition used by the memory model, the time model, the validity rules and the templates.
"""

from __future__ import annotations

from tuner.parallel import ParallelConfig
from tuner.spec import Framework, ModelSpec


def stage_layers(
    model: ModelSpec, config: ParallelConfig, framework: Framework
) -> tuple[int, ...]:
    """Transformer layers on each pipeline stage, first to last (``len == config.pp``).

    Even split: every stage holds ``num_layers / pp`` layers (the validity rules reject the
    rest for now).
    """
    del framework
    per_stage = model.num_layers // config.pp
    return (per_stage,) * config.pp


def in_flight(config: ParallelConfig, stage: int) -> float:
    """Micro-batches of the stage's layers whose activations ``stage`` holds at its peak.

    1F1B (Korthikanti et al. 2022, section 4): stage i holds min(p - i, m); the interleaved
    schedule multiplies by 1 + (p - 1) / (p v) (Narayanan et al. 2021).
    """
    m = max(config.num_microbatches, 1)
    if config.pp == 1:
        return 1.0
    held = float(min(config.pp - stage, m))
    if config.vp > 1 and m >= config.pp:
        held *= 1 + (config.pp - 1) / (config.pp * config.vp)
    return held
