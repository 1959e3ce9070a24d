"""Megatron-LM (and Megatron-DeepSpeed) log lines.

Iteration lines come in three shapes (no timestamp up to core_r0.5 and in Megatron-DeepSpeed,
`` [YYYY-mm-dd HH:MM:SS]`` in core_r0.6..v0.15, microseconds from core_v0.16); their fields are
read generically as ``| key: value |`` because the set of keys varies by version and model.
Memory reports come from every rank with data-parallel rank 0; the peak is the max over them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

from tuner.logs import classify, lines
from tuner.logs.metrics import RunMetrics, StepSummary, median, steady

_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_MEMORY = re.compile(
    r"(?:\[Rank\s+(\d+)\]\s*)?\(?after\s+(\d+)\s+iterations\)?\s+memory\s+\((MB|GB)\)"
)
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
    for match in _ITERATION.finditer(line):
        fields = lines.bar_fields(line[previous_end : match.start()], closed=True)
        end = lines.segment_end(line, match.end())
        fields.update(lines.bar_fields(line[match.end() : end], closed=True))
        records.append(_record(int(match.group(1)), int(match.group(2)), fields))
        previous_end = end
    return records


def _record(iteration: int, train_iters: int, fields: dict[str, str]) -> IterationRecord:
    elapsed = _field(fields, "elapsed time per iteration (ms)")
    tflops, includes = None, None
    for key, counts_recompute in _TFLOPS_KEYS:
        if (tflops := _field(fields, key)) is not None:
            includes = counts_recompute
            break
    samples = _first(fields, *_SAMPLES_KEYS)
    return IterationRecord(
        iteration=iteration,
        train_iters=train_iters,
        step_time_s=elapsed / 1000.0 if elapsed is not None and elapsed > 0 else None,
        tflops=tflops,
        tflops_includes_recompute=includes,
        samples_per_s=samples,
        global_batch_size=_field(fields, "global batch size"),
        fields=fields,
    )


def _field(fields: dict[str, str], key: str) -> float | None:
    text = fields.get(key)
    return lines.number(text) if text is not None else None


def _first(fields: dict[str, str], *keys: str) -> float | None:
    return next((v for k in keys if (v := _field(fields, k)) is not None), None)


def memory_reports(line: str) -> list[MemoryReport]:
    """Megatron's memory reports in ``line`` (any version, MB or the NeMo GB form)."""
    reports = []
    for match in _MEMORY.finditer(line):
        end = lines.segment_end(line, match.end())
        fields = lines.bar_fields(line[match.end() : end] + "|", closed=True)
        scale = 1.0 / _MB_PER_GIB if match.group(3) == "MB" else 1.0
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
    total = match.group(3) or match.group(1)
    return float(total) / _MB_PER_GIB


@dataclasses.dataclass(slots=True)
class MegatronScan:
    """Everything the Megatron line parsers found in one log."""

    iterations: list[IterationRecord] = dataclasses.field(default_factory=list)
    memory: list[MemoryReport] = dataclasses.field(default_factory=list)
    theoretical_gib: float | None = None

    def feed(self, line: str) -> None:
        """Read one (prefix-stripped) line."""
        self.iterations.extend(iteration_records(line))
        self.memory.extend(memory_reports(line))
        if (theoretical := theoretical_memory_gib(line)) is not None:
            self.theoretical_gib = theoretical


def scan(text: str) -> MegatronScan:
    """Run the Megatron line parsers over a whole log."""
    result = MegatronScan()
    for line in lines.log_lines(text):
        result.feed(line)
    return result


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
        iterations=len(records),
        step_times_s=tuple(t for _, t in times),
        step_time_s=step,
        tflops_per_gpu=median(steady(tflops, warmup)),
        tflops_includes_recompute=includes,
        samples_per_s=samples_per_s,
    )


def parse_megatron(
    text: str,
    warmup: int | None = None,
    *,
    exit_codes: Sequence[int | None] = (),
    timed_out: bool = False,
) -> RunMetrics:
    """Parse a Megatron-LM or Megatron-DeepSpeed log into :class:`RunMetrics`.

    ``exit_codes`` and ``timed_out`` come from whoever ran the job (see
    :func:`tuner.logs.classify.decide`); without them the outcome rests on the log alone.
    """
    found = scan(text)
    return run_metrics(
        text, summarise(found.iterations, warmup), exit_codes=exit_codes, timed_out=timed_out,
        peak_memory_gib=peak(m.max_allocated_gib for m in found.memory),
        peak_reserved_gib=peak(m.max_reserved_gib for m in found.memory),
        theoretical_memory_gib=found.theoretical_gib,
    )  # fmt: skip


def run_metrics(
    text: str,
    summary: StepSummary,
    *,
    exit_codes: Sequence[int | None],
    timed_out: bool,
    peak_memory_gib: float | None,
    peak_reserved_gib: float | None,
    theoretical_memory_gib: float | None,
) -> RunMetrics:
    """The outcome of a whole log (failure lines, exit codes, time-out) with its per-step and
    memory figures: the last step of every parser."""
    outcome, reason = classify.decide(
        classify.find_failure(text),
        has_step_time=summary.step_time_s is not None,
        exit_codes=exit_codes,
        timed_out=timed_out,
    )
    return RunMetrics(
        outcome=outcome,
        reason=reason,
        iterations=summary.iterations,
        step_times_s=summary.step_times_s,
        step_time_s=summary.step_time_s,
        tflops_per_gpu=summary.tflops_per_gpu,
        tflops_includes_recompute=summary.tflops_includes_recompute,
        samples_per_s=summary.samples_per_s,
        peak_memory_gib=peak_memory_gib,
        peak_reserved_gib=peak_reserved_gib,
        theoretical_memory_gib=theoretical_memory_gib,
    )
