"""torchtitan's metric line, as the pinned release prints it.

torchtitan 0.3.0 ``components/metrics.py`` ``MetricsProcessor.log`` prints, every ``log_freq``
steps and at step 1 (``should_log``), one line through its logger (``[titan] <date> - root -
INFO - `` prefix), each field wrapped in an ANSI colour unless ``disable_color_printing``::

    step:  2  loss:  8.12345  grad_norm:  1.2345  memory: 12.34GiB(15.61%)  tps: 1,234
    tflops: 56.78  mfu: 5.74%

(one line; ``mfu: N/A`` under float8/MX). ``memory`` is the printing rank's
``torch.cuda.max_memory_reserved`` since the previous line (``DeviceMemoryMonitor``; the peak is
reset after each line), ``tps`` the tokens per second per device, rounded:
``tokens seen by this DP rank / (seconds since the last line x cp x tp x pp)``
(``ntokens_since_last_log`` counts ``labels.numel()`` of every micro-batch). No step time is
printed, so with the global tokens per step ``T`` and ``W`` ranks one step takes
``T / (tps x W)`` seconds when ``log_freq`` is 1 (the template sets it). ``validate step:`` lines
are not training steps.

torchtitan disables Python's automatic GC and collects every ``training.gc_freq`` steps
(``tools/utils.py`` ``GarbageCollection.run``: ``step > 1 and step % gc_freq == 0``), inside that
step's time: those steps are left out of the median.
"""

from __future__ import annotations

import dataclasses
import math
import re

from tuner.logs.metrics import StepSummary, median, steady

_STEP = re.compile(
    r"(?<![A-Za-z])step:\s*(\d+)\s+loss:\s*(\S+)\s+(?:grad_norm:\s*\S+\s+)?"
    r"memory:\s*([\d.]+)GiB\(([\d.]+)%\)\s+tps:\s*([\d,]+)\s+tflops:\s*([\d,.]+)"
    r"(?:\s+mfu:\s*(\S+))?"
)

#: Every line :meth:`TitanScan.feed` reads holds this.
MARKERS = ("tps:",)

DEFAULT_GC_FREQ = 50
"""torchtitan 0.3.0 ``TrainingConfig.gc_freq``."""


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """One metric line."""

    step: int
    loss: float
    reserved_gib: float
    tps: float
    tflops: float


@dataclasses.dataclass(slots=True)
class TitanScan:
    """The metric lines of one log."""

    steps: list[StepRecord] = dataclasses.field(default_factory=list)

    def feed(self, line: str) -> None:
        """Read one (escape- and prefix-stripped) line."""
        if "tps:" not in line or "validate step:" in line:
            return
        match = _STEP.search(line)
        if match is None:
            return
        step, loss, reserved, _pct, tps, tflops, _mfu = match.groups()
        self.steps.append(
            StepRecord(
                step=int(step),
                loss=_number(loss),
                reserved_gib=float(reserved),
                tps=float(tps.replace(",", "")),
                tflops=float(tflops.replace(",", "")),
            )  # fmt: skip
        )

    def reserved_peak(self) -> float | None:
        """The largest logged max-reserved figure, GiB."""
        return max((s.reserved_gib for s in self.steps), default=None)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def summarise(
    scan: TitanScan, warmup: int | None, step_tokens: float | None, gc_freq: int | None = None
) -> StepSummary:
    """Step time from tps (``step_tokens``: the global tokens of one step over the world size,
    None: no step time), TFLOP/s as logged; GC steps and the warm-up dropped, then the median."""
    freq = gc_freq or DEFAULT_GC_FREQ
    records = [s for s in scan.steps if not (s.step > 1 and s.step % freq == 0)]
    times = [
        (float(s.step), step_tokens / s.tps) for s in records if step_tokens and s.tps > 0
    ]  # fmt: skip
    bad = next((s for s in scan.steps if not math.isfinite(s.loss)), None)
    return StepSummary(
        iterations=len(scan.steps),
        step_times_s=tuple(t for _, t in times),
        step_time_s=median(steady(times, warmup)),
        tflops_per_gpu=median(steady([(float(s.step), s.tflops) for s in records], warmup)),
        tflops_includes_recompute=False,  # num_flops_per_token: model FLOPs (6N + attention)
        diverged=None if bad is None else f"loss is {bad.loss} at step {bad.step}",
    )
