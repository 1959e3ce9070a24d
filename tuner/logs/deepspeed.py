"""DeepSpeed log lines, and the ``tuner-step`` line our own workload prints.

Recognised (interfaces reference §3c):

* ThroughputTimer, every generation: ``0/450, SamplesPerSec=X`` (<= v0.5), ``..., MemAllocated=
  XGB, MaxMemAllocated=YGB`` (v0.6), ``RunningAvgSamplesPerSec=/CurrSamplesPerSec=`` (v0.7) and
  ``epoch=E/micro_step=M/global_step=G, ...`` (>= v0.8). GB there is GiB (bytes / 1024**3).
* ``wall_clock_breakdown`` timers ``[rank=0 ]time (ms) | name: ms | ...`` with the old
  (``forward``/``backward``/``step``) and new (``fwd``/``bwd``/``step``) names; only the lines
  printed at the gradient-accumulation boundary (no ``_microstep`` suffix) make a step.
* PipelineEngine ``steps: N loss: X iter time (s): Y samples/sec: Z``.
* ``see_memory_usage``: ``MA x GB  Max_MA x GB  CA x GB  Max_CA x GB``.
* Megatron-DeepSpeed / GPT-NeoX iteration lines and Megatron memory reports (via
  :mod:`tuner.logs.megatron`).

The ``tuner-step`` line, printed once per optimizer step by the workloads tuner ships::

    tuner-step: iter=12 time_s=0.8312 samples_per_s=38.5 max_allocated_gib=3.21 \
max_reserved_gib=3.5 rank=0

Space-separated ``key=value`` tokens after ``tuner-step:`` (anything may precede it, e.g. a
logging prefix). ``iter`` (int, 1-based optimizer step) and ``time_s`` (the step's wall time in
seconds, from the start of the step to the end of the optimizer step) are required; the others are
optional: ``samples_per_s`` (samples of the global batch per second), ``max_allocated_gib`` and
``max_reserved_gib`` (the accelerator allocator's peaks so far, GiB; CPU runs may omit them) and
``rank`` (global rank) and ``loss`` (the step's loss: NaN or inf marks the run diverged). Unknown
keys are ignored. When several ranks print the same ``iter``, the
step time is the slowest rank's, memory the largest.

Step time comes from the first source present: tuner-step lines, iteration lines, pipeline
``iter time (s)``, boundary timers (fwd + bwd + step, or ``train_batch``), and finally
``global_batch_size / samples per second`` when the caller knows the global batch size.

A step time or throughput printed that is no number above zero (0, negative, NaN, an infinity:
a broken timer's) measures nothing: it is left out, and named as the reason when no step time is
left (as Megatron's ``elapsed time per iteration (ms): nan``). A pipeline ``steps: N`` printed
twice (a log two runs appended to) is one step, its slowest print. Two prints glued on one line
without a break (``... rank=0tuner-step: iter=3 ...``) are two records.

A run diverged when a ``tuner-step`` or pipeline ``loss:`` is NaN/inf, or when its Megatron
iteration lines say so (:func:`tuner.logs.megatron.divergence`). DeepSpeed's fp16 ``OVERFLOW!
... Skipping step`` lines are its loss scaler at work, not divergence.

Peak memory likewise: the ``tuner-step`` figures when present, which are the framework allocator's
own peaks. Otherwise the largest of DeepSpeed's ``MaxMemAllocated=`` / ``see_memory_usage`` and
Megatron's memory reports. On a CPU run DeepSpeed's figure is the process's resident memory
(interpreter, libraries and all), several times what the model's tensors take.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

from tuner.logs import lines, megatron
from tuner.logs.metrics import StepSummary, median, steady

_TUNER_STEP = re.compile(r"\btuner-step:((?:\s+[A-Za-z_]+=\S+)+)")
_PIPELINE = re.compile(
    r"\bsteps: (\d{1,18}) loss: (\S+) iter time \(s\): (\S+) samples/sec: (\S+)"
)
_TIMERS = re.compile(r"\btime \(ms\)\s*\|")
_THROUGHPUT_PAIR = re.compile(
    r"\b(global_step|RunningAvgSamplesPerSec|CurrSamplesPerSec|SamplesPerSec|MaxMemAllocated)"
    r"=([^,\s]+)"
)
_OLD_STEP = re.compile(r"\b\d+/(\d+), (?:SamplesPerSec|RunningAvgSamplesPerSec)=")
_SEE_MEMORY = re.compile(
    r"\bMA ([\d.]+) GB\s+Max_MA ([\d.]+) GB\s+CA ([\d.]+) GB\s+Max_CA ([\d.]+) GB"
)
#: Lines only DeepSpeed (or our DeepSpeed workload) prints: used to auto-detect the framework.
SIGNATURES = re.compile(
    r"SamplesPerSec=|_microstep: |iter time \(s\):|see_memory_usage|Max_MA |tuner-step:"
    r"|\[deepspeed\]|log_dist\]|deepspeed\.|DeepSpeed"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One step measurement: (order key, seconds, samples/s or None)."""

    key: float
    time_s: float
    samples_per_s: float | None = None


#: Every line :meth:`DeepSpeedScan.feed` reads holds one of these or a Megatron marker.
MARKERS = (
    *megatron.MARKERS,
    "tuner-step:",
    "iter time (s)",
    "time (ms)",
    "SamplesPerSec=",
    "Max_MA ",
)


@dataclasses.dataclass(slots=True)
class DeepSpeedScan:
    """Everything the DeepSpeed line parsers found in one log."""

    tuner_steps: dict[int, Step] = dataclasses.field(default_factory=dict)
    pipeline: dict[int, Step] = dataclasses.field(default_factory=dict)
    """The ``steps: N`` lines by N: a step printed twice (a log two runs appended to) is one
    step, its slowest print, as ``tuner-step`` lines of several ranks are."""
    timers: list[Step] = dataclasses.field(default_factory=list)
    boundary_lines: int = 0
    """The boundary timer lines read, those that measured nothing included."""
    throughput: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    allocated_gib: list[float] = dataclasses.field(default_factory=list)
    """DeepSpeed's own memory figures (``MaxMemAllocated=``, ``see_memory_usage``)."""
    reserved_gib: list[float] = dataclasses.field(default_factory=list)
    tuner_allocated_gib: list[float] = dataclasses.field(default_factory=list)
    """The ``tuner-step`` memory figures (the workload's allocator peaks): preferred."""
    tuner_reserved_gib: list[float] = dataclasses.field(default_factory=list)
    megatron: megatron.MegatronScan = dataclasses.field(default_factory=megatron.MegatronScan)
    bad_loss: str | None = None
    """The first NaN/inf loss of a ``tuner-step`` or pipeline line, as a reason."""
    unmeasured: str | None = None
    """The first step time printed that is no number above zero (NaN, an infinity, 0 or
    negative: a broken timer's), as a reason: never a step time (it was the log's, ``ok``)."""

    def feed(self, line: str) -> None:
        """Read one (prefix-stripped) line."""
        self.megatron.feed(line)
        if "tuner-step:" in line:
            for piece in _glued(line, "tuner-step:"):
                self._tuner_step(piece)
        if "iter time (s)" in line:
            for piece in _glued(line, "steps: "):
                if match := _PIPELINE.search(piece):
                    self._pipeline(match)
        if "time (ms)" in line and (match := _TIMERS.search(line)):
            self._timers(line, match.end())
        if "SamplesPerSec=" in line:
            self._throughput(line)
        if "Max_MA " in line and (match := _SEE_MEMORY.search(line)):
            allocated, reserved = lines.number(match.group(2)), lines.number(match.group(4))
            self.allocated_gib += [] if allocated is None else [allocated]  # "." or too large
            self.reserved_gib += [] if reserved is None else [reserved]

    def _loss(self, text: str, where: str) -> None:
        value = lines.number(text, finite=False)
        if self.bad_loss is None and value is not None and not math.isfinite(value):
            self.bad_loss = f"loss is {text} at {where}"

    def peaks(self) -> tuple[float | None, float | None]:
        """Peak (allocated, reserved) GiB: the ``tuner-step`` figures when present, else the
        largest of DeepSpeed's and Megatron's own."""
        reports = self.megatron.memory
        return (
            megatron.peak(
                self.tuner_allocated_gib
                or [*self.allocated_gib, *(m.max_allocated_gib for m in reports)]
            ),
            megatron.peak(
                self.tuner_reserved_gib
                or [*self.reserved_gib, *(m.max_reserved_gib for m in reports)]
            ),
        )

    def _tuner_step(self, line: str) -> None:
        match = _TUNER_STEP.search(line)
        if match is None:
            return
        values = dict(token.split("=", 1) for token in match.group(1).split())
        if "loss" in values:
            self._loss(values["loss"], f"iter {values.get('iter', '?')}")
        iteration = lines.number(values.get("iter", ""))
        if iteration is None or "time_s" not in values:
            return
        time_s = self._seconds(values["time_s"], f"time_s is {{}} at iter {int(iteration)}")
        if time_s is None:
            return
        samples = _above_zero(values.get("samples_per_s", ""))
        previous = self.tuner_steps.get(int(iteration))
        if previous is not None:
            time_s = max(time_s, previous.time_s)
            if samples is None or (
                previous.samples_per_s is not None and previous.samples_per_s < samples
            ):
                samples = previous.samples_per_s
        self.tuner_steps[int(iteration)] = Step(iteration, time_s, samples)
        for key, bucket in (
            ("max_allocated_gib", self.tuner_allocated_gib),
            ("max_reserved_gib", self.tuner_reserved_gib),
        ):
            if (value := lines.number(values.get(key, ""))) is not None:
                bucket.append(value)

    def _timers(self, line: str, start: int) -> None:
        fields = lines.bar_fields(line[start : lines.segment_end(line, start)] + "|", closed=True)
        values = {k: v for k, text in fields.items()
                  if (v := lines.number(text, finite=False)) is not None}  # fmt: skip
        if "train_batch" in values:
            total_ms, what = values["train_batch"], "train_batch"
        else:
            forward = values.get("fwd", values.get("forward"))
            backward = values.get("bwd", values.get("backward"))
            if forward is None or backward is None or "step" not in values:
                return
            total_ms, what = forward + backward + values["step"], "fwd + bwd + step"
        self.boundary_lines += 1
        where = f"{what} is {{}} ms at boundary timer line {self.boundary_lines}"
        if (seconds := self._seconds(f"{total_ms:g}", where)) is not None:
            self.timers.append(Step(float(self.boundary_lines), seconds / 1000.0))

    def _pipeline(self, match: re.Match[str]) -> None:
        step = int(match.group(1))
        self._loss(match.group(2), f"step {step}")
        seconds = self._seconds(match.group(3), f"iter time (s) is {{}} at step {step}")
        if seconds is None:  # a malformed number ("4.0e") is not a measurement
            return
        samples = _above_zero(match.group(4))
        previous = self.pipeline.get(step)
        if previous is None or previous.time_s < seconds:
            self.pipeline[step] = Step(float(step), seconds, samples)

    def _seconds(self, text: str, where: str) -> float | None:
        """``text``'s number when it is one above zero; else None, and the first such noted as
        :attr:`unmeasured` (``where`` with ``{}`` for the text)."""
        value = lines.number(text, finite=False)
        if value is None:
            return None
        if not math.isfinite(value) or value <= 0:
            if self.unmeasured is None:
                self.unmeasured = f"{where.format(repr(text))}: not a number above zero"
            return None
        return value

    def _throughput(self, line: str) -> None:
        pairs = {
            k: v
            for k, text in _THROUGHPUT_PAIR.findall(line)
            if (v := _above_zero(text)) is not None
        }
        samples = pairs.get("CurrSamplesPerSec", pairs.get("SamplesPerSec"))
        if samples is not None:
            old = _OLD_STEP.search(line)
            key = pairs.get("global_step", float(old.group(1)) if old else len(self.throughput))
            self.throughput.append((key, samples))
        if "MaxMemAllocated" in pairs:
            self.allocated_gib.append(pairs["MaxMemAllocated"])


def _from_steps(steps: Sequence[Step], warmup: int | None) -> StepSummary:
    samples = [(s.key, s.samples_per_s) for s in steps if s.samples_per_s is not None]
    return StepSummary(
        iterations=len(steps),
        step_times_s=tuple(s.time_s for s in steps),
        step_time_s=median(steady([(s.key, s.time_s) for s in steps], warmup)),
        samples_per_s=median(steady(samples, warmup)),
    )


def summarise(
    found: DeepSpeedScan, warmup: int | None, global_batch_size: int | None = None
) -> StepSummary:
    """Per-step figures from the best source present (see the module docstring)."""
    if found.tuner_steps:
        summary = _from_steps(list(found.tuner_steps.values()), warmup)
    elif any(r.step_time_s is not None for r in found.megatron.iterations):
        summary = megatron.summarise(found.megatron.iterations, warmup)
    elif found.pipeline or found.timers:
        summary = _from_steps(list(found.pipeline.values()) or found.timers, warmup)
    else:
        summary = StepSummary(iterations=len(found.throughput))
    throughput = median(steady(found.throughput, warmup))
    step = summary.step_time_s
    if step is None and throughput and global_batch_size:
        step = global_batch_size / throughput
    samples = summary.samples_per_s or throughput
    if samples is None and step and global_batch_size:
        samples = global_batch_size / step
    diverged = found.bad_loss or megatron.divergence(found.megatron.iterations, warmup)
    unmeasured = summary.no_step_time or found.unmeasured
    return dataclasses.replace(
        summary, step_time_s=step, samples_per_s=samples, diverged=diverged,
        no_step_time=None if step is not None else unmeasured,
        needs="global_batch_size" if step is None and throughput and not unmeasured else None,
    )  # fmt: skip


def _glued(line: str, literal: str) -> list[str]:
    """The records of ``line`` that start with ``literal``, each cut where the next starts: two
    prints written without a line break between them (``... rank=0tuner-step: iter=3 ...``, a
    print cut short and the next glued to it) are two records; read as one, the first's
    ``key=value`` tokens ran on into the second's and its step was lost."""
    pieces = line.split(literal)
    return [literal + piece for piece in pieces[1:]]


def _above_zero(text: str) -> float | None:
    """The number in ``text`` when it is a finite one above zero: a throughput of 0 or less
    (a broken timer's) is none (``CurrSamplesPerSec=-64`` made a step of -0.5 s)."""
    value = lines.number(text)
    return value if value is not None and value > 0 else None
