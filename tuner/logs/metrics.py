"""The typed result of parsing one training log, and the warm-up rule shared by the parsers."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from tuner.outcome import Outcome

V = TypeVar("V")

Need = Literal["global_batch_size", "step_tokens"]
"""What a log that measured steps may need besides itself to give a step time: the global batch
size (a DeepSpeed log with only throughput lines, samples/s) or the tokens of one step per rank
(a torchtitan log: tokens/s per GPU)."""

#: Keys of :meth:`RunMetrics.to_json`, in order (the ``tune parse-log --json`` contract).
JSON_KEYS = (
    "file",
    "outcome",
    "iterations",
    "step_time_s",
    "peak_memory_gib",
    "peak_reserved_gib",
    "tflops_per_gpu",
    "samples_per_s",
    "reason",
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunMetrics:
    """What one run's log says about it."""

    outcome: Outcome
    """ok, oom, diverged, nccl_timeout, launch_error, timeout, hang or no_metrics (the parser
    never says more)."""
    iterations: int = 0
    """Per-step records seen (Megatron iteration lines; DeepSpeed steps from the chosen source)."""
    step_times_s: tuple[float, ...] = ()
    """Every per-step time seen, in log order, seconds."""
    step_time_s: float | None = None
    """Steady-state step time: the median after the warm-up records are dropped."""
    peak_memory_gib: float | None = None
    """Max over ranks of the allocator's "max allocated" (GiB)."""
    peak_reserved_gib: float | None = None
    """Max over ranks of the allocator's "max reserved" (GiB)."""
    tflops_per_gpu: float | None = None
    """Median steady-state TFLOP/s per GPU as the framework logged it."""
    tflops_includes_recompute: bool | None = None
    """True for Megatron-DeepSpeed ``TFLOPs`` (counts recompute), False for Megatron-LM's."""
    samples_per_s: float | None = None
    """Steady-state samples per second (logged, or global batch size / step time)."""
    theoretical_memory_gib: float | None = None
    """Megatron's own "Theoretical memory footprints" total (or weight+optimizer) in GiB."""
    reason: str | None = None
    """One line saying why the outcome is not ok (the OOM message, the bad flag, ...)."""
    needs: Need | None = None
    """What the log needs besides itself to give a step time, where that is why it gave none
    (:data:`Need`; a study always gives it, ``tune parse-log`` only when told)."""

    def to_json(self, file: str) -> dict[str, Any]:
        """The ``tune parse-log --json`` object for this log, read from ``file``."""
        return {
            "file": file,
            "outcome": str(self.outcome),
            "iterations": self.iterations,
            "step_time_s": self.step_time_s,
            "peak_memory_gib": self.peak_memory_gib,
            "peak_reserved_gib": self.peak_reserved_gib,
            "tflops_per_gpu": self.tflops_per_gpu,
            "samples_per_s": self.samples_per_s,
            "reason": self.reason,
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StepSummary:
    """The per-step part of :class:`RunMetrics`, as one parser source yields it."""

    iterations: int = 0
    step_times_s: tuple[float, ...] = ()
    step_time_s: float | None = None
    tflops_per_gpu: float | None = None
    tflops_includes_recompute: bool | None = None
    samples_per_s: float | None = None
    diverged: str | None = None
    """Why the run diverged (a NaN/inf loss, nan or skipped iterations), or None."""
    no_step_time: str | None = None
    """Why the step records measure nothing, where a record printed its step time and the
    figure was not a number above zero (``elapsed time per iteration (ms): nan``)."""
    needs: Need | None = None
    """:attr:`RunMetrics.needs`."""


def warmup_count(n: int, warmup: int | None = None) -> int:
    """How many of ``n`` step records to drop as warm-up.

    By default the larger of 1 and 20 % of ``n`` (rounded down); an explicit ``warmup`` replaces
    that. Either way at least one record is kept, so a log with a single step still measures it.
    """
    if n <= 1:
        return 0
    k = max(1, n // 5) if warmup is None else max(0, warmup)
    return min(k, n - 1)


def steady(samples: Sequence[tuple[float, V]], warmup: int | None = None) -> list[V]:
    """Values of ``(order_key, value)`` samples after dropping the warm-up.

    Samples are ordered by key (the iteration number where the log has one, so an excerpt pasted
    out of order still drops its earliest iterations); ties keep log order.
    """
    ordered = sorted(samples, key=lambda kv: kv[0])
    return [value for _, value in ordered[warmup_count(len(ordered), warmup) :]]


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values."""
    return float(statistics.median(values)) if values else None
