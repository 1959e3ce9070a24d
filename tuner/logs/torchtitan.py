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

Every rank prints the line (the template filters none) and a log two runs appended to holds a
step twice: a step is one record, its slowest print's (lowest tps) with the largest memory, as
DeepSpeed's ``tuner-step`` lines of several ranks are read. A tps that is no number above zero
measures nothing, and is the reason given when no step time is left (as Megatron's
``elapsed time per iteration (ms): nan``).
"""

from __future__ import annotations

import dataclasses
import math
import re

from tuner.logs.metrics import StepSummary, median, steady

_STEP = re.compile(
    r"(?<![A-Za-z])step:\s*(\d{1,18})\s+loss:\s*(\S+)\s+(?:grad_norm:\s*\S+\s+)?"
    r"memory:\s*(\S+?)GiB\((\S+?)%\)\s+tps:\s*(\S+)\s+tflops:\s*(\S+)"
    r"(?:\s+mfu:\s*(\S+))?"
)
"""The figures are any word (a step of more than 18 digits is no step): each is read as a
number only when the whole word is one (:func:`_number`), so a line two prints were spliced
into (``memory: 9.469.46GiB``) or one cut short is no figure, never a ValueError."""

#: Every line :meth:`TitanScan.feed` reads holds this.
MARKERS = ("tps:",)

DEFAULT_GC_FREQ = 50
"""torchtitan 0.3.0 ``TrainingConfig.gc_freq``."""


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """One metric line (a figure that is no number: NaN, or None where it is only shown)."""

    step: int
    loss: float
    reserved_gib: float | None
    tps: float
    tps_text: str
    tflops: float | None

    def measured(self) -> bool:
        """Whether its tps is a number above zero (a step time can come from it)."""
        return math.isfinite(self.tps) and self.tps > 0


def _merged(old: StepRecord, new: StepRecord) -> StepRecord:
    """Two prints of one step (each rank prints the line; a log two runs appended to holds it
    twice) as one: the slowest print's figures (the lowest tps that measures), the largest
    memory, and a loss that is no number where either is (the run diverged)."""
    slow = new if new.measured() and (not old.measured() or new.tps < old.tps) else old
    memory = [m for m in (old.reserved_gib, new.reserved_gib) if m is not None]
    loss = next((r.loss for r in (old, new) if not math.isfinite(r.loss)), slow.loss)
    return dataclasses.replace(
        slow, reserved_gib=max(memory, default=None), loss=loss
    )  # fmt: skip


@dataclasses.dataclass(slots=True)
class TitanScan:
    """The metric lines of one log, one record per step."""

    steps: dict[int, StepRecord] = dataclasses.field(default_factory=dict)

    def feed(self, line: str) -> None:
        """Read one (escape- and prefix-stripped) line."""
        if "tps:" not in line or "validate step:" in line:
            return
        for match in _STEP.finditer(line):  # two prints glued without a break: two steps
            step, loss, reserved, _pct, tps, tflops, _mfu = match.groups()
            record = StepRecord(
                step=int(step), loss=_number(loss), reserved_gib=_figure(reserved),
                tps=_number(tps.replace(",", "")), tps_text=tps, tflops=_figure(tflops),
            )  # fmt: skip
            previous = self.steps.get(record.step)
            self.steps[record.step] = record if previous is None else _merged(previous, record)

    def reserved_peak(self) -> float | None:
        """The largest logged max-reserved figure, GiB."""
        return max((s.reserved_gib for s in self.steps.values() if s.reserved_gib is not None),
                   default=None)  # fmt: skip


def _number(text: str) -> float:
    """``text`` as a number when the whole of it is one, else NaN."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return math.nan


def _figure(text: str) -> float | None:
    """``text`` as a finite number, else None (not a figure to show)."""
    value = _number(text)
    return value if math.isfinite(value) else None


def summarise(
    scan: TitanScan, warmup: int | None, step_tokens: float | None, gc_freq: int | None = None
) -> StepSummary:
    """Step time from tps (``step_tokens``: the global tokens of one step over the world size,
    None: no step time), TFLOP/s as logged; GC steps and the warm-up dropped, then the median."""
    freq = gc_freq or DEFAULT_GC_FREQ
    steps = list(scan.steps.values())
    records = [s for s in steps if not (s.step > 1 and s.step % freq == 0)]
    times = [(float(s.step), step_tokens / s.tps) for s in records if step_tokens and s.measured()]
    tflops = [(float(s.step), s.tflops) for s in records if s.tflops is not None]
    bad = next((s for s in steps if not math.isfinite(s.loss)), None)
    return StepSummary(
        iterations=len(steps),
        step_times_s=tuple(t for _, t in times),
        step_time_s=median(steady(times, warmup)),
        tflops_per_gpu=median(steady(tflops, warmup)),
        tflops_includes_recompute=False,  # num_flops_per_token: model FLOPs (6N + attention)
        diverged=None if bad is None else f"loss is {bad.loss} at step {bad.step}",
        no_step_time=None if times else _unmeasured(steps, step_tokens),
        needs="step_tokens"
        if steps and not step_tokens and all(s.measured() for s in steps)
        else None,
    )


def _unmeasured(steps: list[StepRecord], step_tokens: float | None) -> str | None:
    """Why metric lines gave no step time: none of their tps is a number above zero, or the
    tokens per step that turn tps into one are not known (``tune parse-log``)."""
    if not steps:
        return None
    if (bad := next((s for s in steps if not s.measured()), None)) is not None:
        return f"tps is {bad.tps_text!r} at step {bad.step}: not a number above zero"
    if not step_tokens:
        return (
            "torchtitan logs tokens per second per GPU (tps), which is a step time only with "
            "the study's tokens per step"
        )
    return None
