"""Megatron-LM (and Megatron-DeepSpeed) log lines.

Iteration lines come in three shapes (no timestamp up to core_r0.5 and in Megatron-DeepSpeed,
`` [YYYY-mm-dd HH:MM:SS]`` in core_r0.6..v0.15, microseconds from core_v0.16); their fields are
read generically as ``| key: value |`` because the set of keys varies by version and model.
Memory reports come from every rank with data-parallel rank 0; the peak is the max over them.
Megatron-Bridge (and NeMo) print the same iteration line, a ``memory (GB)`` report whose
``mem-*-gigabytes`` values are 1e9 bytes (Bridge v0.6.0 training/utils/train_utils.py
``report_memory``), and before each iteration line a ``Step Time : 14.26s GPU utilization:
58.2MODEL_TFLOP/s/GPU`` line (``TFLOP/s/GPU`` before 2026), whose throughput stands in when the
iteration line has none (``logger.log_throughput`` off).

A run *diverged* when an iteration line shows a NaN/inf loss, or, after the warm-up records, a
non-zero ``number of nan iterations`` or ``number of skipped iterations`` (both count the
iterations since the previous line). A skipped iteration with a loss scale above 1 is fp16's
dynamic loss scaler backing off after an overflow, which it does for the first ~20 iterations of
every fp16 run: that is not divergence. With bf16/fp32 (loss scale 1.0) or a scale that has fallen
to its minimum, a skipped step means the gradients were inf/NaN.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable

from tuner.logs import lines
from tuner.logs.metrics import StepSummary, median, steady

# No leading \b: a pattern that starts with a literal is found by a fast substring search, one
# that starts with \b is tried at every position (30 us per line). The word start is checked after.
# Counts have at most 18 digits: a longer one is no count, and int() refuses over 4,300 digits.
_ITERATION = re.compile(r"iteration\s+(\d{1,18})\s*/\s*(\d{1,18})\s*\|")
_MEMORY = re.compile(
    r"(?:\[Rank\s+(\d{1,18})\]\s*)?\(?after\s+(\d{1,18})\s+iterations\)?\s+memory\s+"
    r"\((MB|GB)\)"
)
_STEP_TIME = re.compile(r"Step Time\s*:\s*([\d.]+)s\s+GPU utilization:\s*([\d.]+)")
_THEORETICAL = re.compile(
    r"Theoretical memory footprints: weight and optimizer=([\d.]+) MB"
    r"(?:, activation=([\d.]+) MB, total=([\d.]+) MB)?"
)
# Throughput fields: (key, includes recompute). Megatron-LM counts model FLOPs only; the
# Megatron-DeepSpeed and GPT-NeoX figures add the recomputed forward.
_TFLOPS_KEYS = (
    ("throughput per gpu (tflop/s/gpu)", False),
    ("tflops", True),
    ("approx flops per gpu", True),
)
_SAMPLES_KEYS = ("samples per second", "samples/sec")
_MB_PER_GIB = 1024.0
_GB_PER_GIB = 2**30 / 1e9


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class IterationRecord:
    """One ``iteration i/N | ...`` line."""

    iteration: int
    train_iters: int
    step_time_s: float | None
    tflops: float | None
    tflops_includes_recompute: bool | None
    samples_per_s: float | None
    global_batch_size: float | None
    fields: dict[str, str]
    bad_loss: str | None = None
    """``lm loss: nan``: the first loss field whose value is NaN or infinite."""
    nan_iterations: int = 0
    """``number of nan iterations`` (since the previous line)."""
    skipped_iterations: int = 0
    """``number of skipped iterations`` (since the previous line)."""
    loss_scale: float | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MemoryReport:
    """One ``[Rank N] (after K iterations) memory (MB) | ...`` line, in GiB."""

    rank: int | None
    after_iterations: int
    max_allocated_gib: float | None
    max_reserved_gib: float | None


def iteration_records(line: str) -> list[IterationRecord]:
    """Every iteration record in ``line`` (two may be glued on one line)."""
    records = []
    previous_end = 0
    starts = lines.record_starts(line)
    for match in _ITERATION.finditer(line):
        start = match.start()
        if start and (line[start - 1].isalnum() or line[start - 1] == "_"):
            continue
        fields = lines.bar_fields(line[previous_end : match.start()], closed=True)
        end = lines.segment_end(line, match.end(), starts)
        fields.update(lines.bar_fields(line[match.end() : end], closed=True))
        records.append(_record(int(match.group(1)), int(match.group(2)), fields))
        previous_end = end
    return records


ELAPSED = "elapsed time per iteration (ms)"


def _record(iteration: int, train_iters: int, fields: dict[str, str]) -> IterationRecord:
    elapsed = _field(fields, ELAPSED)
    tflops, includes = None, None
    for key, counts_recompute in _TFLOPS_KEYS:
        if (tflops := _field(fields, key)) is not None:
            includes = counts_recompute
            break
    samples = _first(fields, *_SAMPLES_KEYS)
    bad_loss = next(
        (
            f"{key} is {text}"
            for key, text in fields.items()
            if "loss" in key
            and key != "loss scale"
            and (value := lines.number(text, finite=False)) is not None
            and not math.isfinite(value)
        ),
        None,
    )
    return IterationRecord(
        iteration=iteration,
        train_iters=train_iters,
        step_time_s=elapsed / 1000.0 if elapsed is not None and elapsed > 0 else None,
        tflops=tflops,
        tflops_includes_recompute=includes,
        samples_per_s=samples,
        global_batch_size=_field(fields, "global batch size"),
        fields=fields,
        bad_loss=bad_loss,
        nan_iterations=int(_field(fields, "number of nan iterations") or 0),
        skipped_iterations=int(_field(fields, "number of skipped iterations") or 0),
        loss_scale=_field(fields, "loss scale"),
    )


def _field(fields: dict[str, str], key: str) -> float | None:
    text = fields.get(key)
    return lines.number(text) if text is not None else None


def _first(fields: dict[str, str], *keys: str) -> float | None:
    return next((v for k in keys if (v := _field(fields, k)) is not None), None)


def memory_reports(line: str) -> list[MemoryReport]:
    """Megatron's memory reports in ``line`` (any version, MB or the NeMo GB form)."""
    reports = []
    starts = lines.record_starts(line)
    for match in _MEMORY.finditer(line):
        end = lines.segment_end(line, match.end(), starts)
        fields = lines.bar_fields(line[match.end() : end] + "|", closed=True)
        scale = 1.0 / (_MB_PER_GIB if match.group(3) == "MB" else _GB_PER_GIB)
        allocated = _first(fields, "max allocated", "mem-max-allocated-gigabytes")
        reserved = _first(fields, "max reserved", "mem-max-reserved-gigabytes")
        reports.append(
            MemoryReport(
                rank=int(match.group(1)) if match.group(1) is not None else None,
                after_iterations=int(match.group(2)),
                max_allocated_gib=allocated * scale if allocated is not None else None,
                max_reserved_gib=reserved * scale if reserved is not None else None,
            )
        )
    return reports


def theoretical_memory_gib(line: str) -> float | None:
    """Megatron's ``Theoretical memory footprints`` total (else weight+optimizer), GiB."""
    match = _THEORETICAL.search(line)
    if match is None:
        return None
    total = lines.number(match.group(3) or match.group(1))  # None for "." or an infinity
    return None if total is None else total / _MB_PER_GIB


#: Every line :meth:`MegatronScan.feed` reads holds one of these.
MARKERS = ("iteration", "Theoretical", "Step Time")


@dataclasses.dataclass(slots=True)
class MegatronScan:
    """Everything the Megatron line parsers found in one log."""

    iterations: list[IterationRecord] = dataclasses.field(default_factory=list)
    memory: list[MemoryReport] = dataclasses.field(default_factory=list)
    theoretical_gib: float | None = None
    utilization: float | None = None
    """The last ``Step Time ... GPU utilization`` TFLOP/s/GPU (Bridge), not yet used."""
    seen: set[int] = dataclasses.field(default_factory=set, repr=False)
    """The iterations recorded: a second print of one is the same step, not another (two
    ranks' prints spliced on one line, or interleaved: "iters" said 10 for 5, and the copies
    weighed twice in the step time's estimate). The first is kept, as the live watch keeps it
    (:class:`tuner.study.measure.LogTail`)."""

    def feed(self, line: str) -> None:
        """Read one (prefix-stripped) line."""
        if "Step Time" in line and (step := _STEP_TIME.search(line)) is not None:
            self.utilization = lines.number(step.group(2))  # None for "." or an infinity
        if "iteration" in line:  # iteration lines and "(after N iterations) memory" reports
            for record in iteration_records(line):
                if record.tflops is None and self.utilization is not None:
                    record = dataclasses.replace(
                        record, tflops=self.utilization, tflops_includes_recompute=False
                    )
                self.utilization = None
                if record.iteration not in self.seen:
                    self.seen.add(record.iteration)
                    self.iterations.append(record)
            if "memory" in line:
                self.memory.extend(memory_reports(line))
        if "Theoretical" in line and (theoretical := theoretical_memory_gib(line)) is not None:
            self.theoretical_gib = theoretical

    def peaks(self) -> tuple[float | None, float | None]:
        """Max over ranks of (max allocated, max reserved), GiB."""
        return (
            peak(m.max_allocated_gib for m in self.memory),
            peak(m.max_reserved_gib for m in self.memory),
        )


def peak(values: Iterable[float | None]) -> float | None:
    """The max of the values that are known, or None."""
    known = [v for v in values if v is not None]
    return max(known) if known else None


def summarise(records: list[IterationRecord], warmup: int | None) -> StepSummary:
    """Step time, TFLOP/s and samples/s from iteration lines (warm-up dropped, then median)."""
    times = [(r.iteration, r.step_time_s) for r in records if r.step_time_s is not None]
    tflops = [(r.iteration, r.tflops) for r in records if r.tflops is not None]
    samples = [(r.iteration, r.samples_per_s) for r in records if r.samples_per_s is not None]
    step = median(steady(times, warmup))
    samples_per_s = median(steady(samples, warmup))
    batch = next((r.global_batch_size for r in reversed(records) if r.global_batch_size), None)
    if samples_per_s is None and step and batch:
        samples_per_s = batch / step
    includes = next((r.tflops_includes_recompute for r in records if r.tflops is not None), None)
    return StepSummary(
        diverged=divergence(records, warmup),
        iterations=len(records),
        step_times_s=tuple(t for _, t in times),
        step_time_s=step,
        tflops_per_gpu=median(steady(tflops, warmup)),
        tflops_includes_recompute=includes,
        samples_per_s=samples_per_s,
        no_step_time=None if times else unmeasured(records),
    )


def unmeasured(records: list[IterationRecord]) -> str | None:
    """The first record whose step time is printed but no number above zero (NaN, an
    infinity, 0 or negative: a broken timer's), said as such: it read "no per-iteration step
    time in the log", as if there were none."""
    for r in records:
        if (text := r.fields.get(ELAPSED)) is not None:
            shown = text.strip()[:32]  # a value runs to the next bar: a garbled line's is long
            return f"{ELAPSED} is {shown!r} at iteration {r.iteration}: not a number above zero"
    return None


def divergence(records: list[IterationRecord], warmup: int | None) -> str | None:
    """Why these iteration lines show a diverged run (see the module docstring), or None."""
    for r in records:
        if r.bad_loss is not None:
            return f"{r.bad_loss} at iteration {r.iteration}"
    for r in steady([(r.iteration, r) for r in records], warmup):
        if r.nan_iterations:
            return f"{r.nan_iterations} nan iteration(s) logged at iteration {r.iteration}"
        if r.skipped_iterations and (r.loss_scale is None or r.loss_scale <= 1.0):
            scale = "" if r.loss_scale is None else f", loss scale {r.loss_scale:g}"
            return (
                f"{r.skipped_iterations} skipped iteration(s) logged at iteration {r.iteration}"
                f"{scale}: inf/NaN gradients"
            )
    return None
