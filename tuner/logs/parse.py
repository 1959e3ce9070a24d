"""The parsers' entry points, one linear pass over a run's log (:mod:`tuner.logs` says how):
the framework detected on the way, each line parser and failure signature fed the lines holding
its literal, and the outcome decided from them and the executor's exit codes. Its names are the
package's (``from tuner.logs import parse_log``), imported on first use."""

from __future__ import annotations

import codecs
import itertools
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from tuner.errors import ParseError
from tuner.logs import classify, deepspeed, lines, megatron, torchtitan
from tuner.logs.classify import FailureScan, decide
from tuner.logs.metrics import RunMetrics
from tuner.spec import frameworks

Framework = frameworks.Framework

#: The most of one log file that is read. Why: a trial of tens of iterations logs megabytes; a
#: bigger file is a runaway job (a loop printing warnings) and reading it all would stall the
#: study. Beyond this the first and the last half are read.
MAX_LOG_BYTES = 1 << 30

__all__ = [
    "MAX_LOG_BYTES",
    "Framework",
    "detect_framework",
    "file_chunks",
    "parse_chunks",
    "parse_deepspeed",
    "parse_log",
    "parse_log_file",
    "parse_log_files",
    "parse_megatron",
    "read_log",
]


def detect_framework(text: str) -> Framework:
    """``deepspeed`` when the log has a line only DeepSpeed prints, else ``megatron``."""
    return "deepspeed" if deepspeed.SIGNATURES.search(text) else "megatron"


class _Detector:
    """Passes chunks through and notes whether one holds a DeepSpeed-only line."""

    def __init__(self) -> None:
        self.deepspeed = False

    def tap(self, chunks: Iterable[str]) -> Iterator[str]:
        tail = ""  # the end of the previous chunk: a signature may straddle two chunks
        for chunk in chunks:
            if not self.deepspeed:
                self.deepspeed = deepspeed.SIGNATURES.search(tail + chunk[:64]) is not None
                self.deepspeed = self.deepspeed or bool(deepspeed.SIGNATURES.search(chunk))
                tail = chunk[-64:]
            yield chunk


def parse_chunks(
    chunks: Iterable[str],
    framework: Framework | None = None,
    warmup: int | None = None,
    *,
    exit_codes: Sequence[int | None] = (),
    timed_out: bool = False,
    global_batch_size: int | None = None,
    step_tokens: float | None = None,
) -> RunMetrics:
    """Parse one run's log arriving as text ``chunks`` (all ranks' output may be mixed in).

    ``framework`` None detects it. ``exit_codes`` (one per process or node, negative for a signal)
    and ``timed_out`` (killed at the trial limit) come from the executor and refine the outcome as
    :func:`tuner.logs.classify.decide` describes. ``global_batch_size`` lets a DeepSpeed log that
    logs only samples/s yield a step time; ``step_tokens`` (global tokens per step / ranks) lets
    a torchtitan log, which prints tokens/s per device, yield one.
    """
    detector = _Detector()
    found = deepspeed.DeepSpeedScan()  # holds the Megatron line parsers too
    titan = torchtitan.TitanScan()
    failures = FailureScan()
    markers = (*deepspeed.MARKERS, *torchtitan.MARKERS, *classify.MARKERS)
    for line in lines.clean_lines(lines.select_lines(detector.tap(chunks), markers)):
        found.feed(line)
        titan.feed(line)
        failures.feed(line)
    chosen = framework or _detected(detector, found, titan)
    # A DeepSpeed engine (deepspeed, megatron-deepspeed) prints its own throughput, timer and
    # memory lines beside the iteration lines: its summary reads both.
    if frameworks.traits(chosen).fsdp2:  # torchtitan logs the max reserved bytes only
        summary = torchtitan.summarise(titan, warmup, step_tokens)
        allocated, reserved = None, titan.reserved_peak()
    elif frameworks.traits(chosen).deepspeed_optimizer:
        summary = deepspeed.summarise(found, warmup, global_batch_size)
        allocated, reserved = found.peaks()
    else:
        summary = megatron.summarise(found.megatron.iterations, warmup)
        allocated, reserved = found.megatron.peaks()
    outcome, reason = decide(
        failures.result(), has_step_time=summary.step_time_s is not None,
        exit_codes=exit_codes, timed_out=timed_out, iterations=summary.iterations,
        diverged=summary.diverged, no_step_time=summary.no_step_time,
    )  # fmt: skip
    return RunMetrics(
        outcome=outcome, reason=reason, iterations=summary.iterations,
        step_times_s=summary.step_times_s, step_time_s=summary.step_time_s,
        tflops_per_gpu=summary.tflops_per_gpu,
        tflops_includes_recompute=summary.tflops_includes_recompute,
        samples_per_s=summary.samples_per_s, peak_memory_gib=allocated,
        peak_reserved_gib=reserved, theoretical_memory_gib=found.megatron.theoretical_gib,
        needs=summary.needs if summary.step_time_s is None else None,
    )  # fmt: skip


def _detected(
    detector: _Detector, found: deepspeed.DeepSpeedScan, titan: torchtitan.TitanScan
) -> Framework:
    """The framework a log is of, where the caller did not say: DeepSpeed by its engine's
    lines, torchtitan by its metric lines (``step: N ... tps: ...``) where no Megatron
    iteration line is there, else Megatron (``tune parse-log`` of a torchtitan log without
    ``--framework`` read it as Megatron's and found no step)."""
    if detector.deepspeed:
        return "deepspeed"
    return "torchtitan" if titan.steps and not found.megatron.iterations else "megatron"


def parse_log(
    text: str,
    framework: Framework | None = None,
    warmup: int | None = None,
    *,
    exit_codes: Sequence[int | None] = (),
    timed_out: bool = False,
    global_batch_size: int | None = None,
    step_tokens: float | None = None,
) -> RunMetrics:
    """:func:`parse_chunks` over one log's text."""
    return parse_chunks(
        lines.text_chunks(text), framework, warmup, exit_codes=exit_codes,
        timed_out=timed_out, global_batch_size=global_batch_size, step_tokens=step_tokens,
    )  # fmt: skip


def parse_megatron(
    text: str,
    warmup: int | None = None,
    *,
    exit_codes: Sequence[int | None] = (),
    timed_out: bool = False,
) -> RunMetrics:
    """Parse a Megatron-LM or Megatron-DeepSpeed log into :class:`RunMetrics`."""
    return parse_log(text, "megatron", warmup, exit_codes=exit_codes, timed_out=timed_out)


def parse_deepspeed(
    text: str,
    warmup: int | None = None,
    *,
    global_batch_size: int | None = None,
    exit_codes: Sequence[int | None] = (),
    timed_out: bool = False,
) -> RunMetrics:
    """Parse a DeepSpeed (or Megatron-DeepSpeed) log into :class:`RunMetrics`.

    ``global_batch_size`` lets a log with only throughput lines yield a step time.
    """
    return parse_log(
        text, "deepspeed", warmup, exit_codes=exit_codes, timed_out=timed_out,
        global_batch_size=global_batch_size,
    )  # fmt: skip


def _open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for reading when it is a regular file; :class:`ParseError` otherwise.

    Why: a FIFO blocks the reader until a writer comes (forever, for a stray ``mkfifo``) and a
    device (``/dev/zero``) never ends; a log is always a regular file. The open does not block
    (``O_NONBLOCK``) and the type is checked on the open file, so nothing swapped in between a
    check and the open is read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise ParseError(f"{path}: cannot read log: {kind}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_chunks(path: str | Path) -> Iterator[str]:
    """A log file's text in chunks (undecodable bytes replaced); only its first and last
    ``MAX_LOG_BYTES / 2`` when it is larger. :class:`ParseError` when it cannot be read or is
    not a regular file (a FIFO, a device, a folder)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    half = MAX_LOG_BYTES // 2
    try:
        with _open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            budget = half if size > MAX_LOG_BYTES else MAX_LOG_BYTES
            while budget > 0 and (data := f.read(min(lines.CHUNK_CHARS, budget))):
                budget -= len(data)
                yield decoder.decode(data)
            if size > MAX_LOG_BYTES:
                f.seek(size - half)
                decoder.reset()
                yield "\n"  # the line cut in the middle ends here
                while data := f.read(lines.CHUNK_CHARS):
                    yield decoder.decode(data)
            yield decoder.decode(b"", final=True)
    except OSError as exc:
        raise ParseError(f"{path}: cannot read log: {exc.strerror or exc}") from exc


def read_log(path: str | Path) -> str:
    """A log file's text as the parsers see it: undecodable bytes replaced, lines longer than
    :data:`~tuner.logs.lines.MAX_LINE_CHARS` cut; :class:`ParseError` when unreadable."""
    return "\n".join(lines.split_lines(file_chunks(path)))


def parse_log_files(
    paths: Sequence[str | Path],
    framework: Framework | None = None,
    warmup: int | None = None,
    *,
    exit_codes: Sequence[int | None] = (),
    timed_out: bool = False,
    global_batch_size: int | None = None,
    step_tokens: float | None = None,
) -> RunMetrics:
    """:func:`parse_chunks` over several logs of one run (one per node), read in turn."""
    chunks = itertools.chain.from_iterable(itertools.chain(file_chunks(p), ["\n"]) for p in paths)
    return parse_chunks(
        chunks, framework, warmup, exit_codes=exit_codes, timed_out=timed_out,
        global_batch_size=global_batch_size, step_tokens=step_tokens,
    )  # fmt: skip


def parse_log_file(
    path: str | Path,
    framework: Framework | None = None,
    warmup: int | None = None,
    *,
    exit_codes: Sequence[int | None] = (),
    timed_out: bool = False,
    global_batch_size: int | None = None,
    step_tokens: float | None = None,
) -> RunMetrics:
    """:func:`parse_log` on a file's contents; :class:`ParseError` when it cannot be read."""
    return parse_log_files(
        [path], framework, warmup, exit_codes=exit_codes, timed_out=timed_out,
        global_batch_size=global_batch_size, step_tokens=step_tokens,
    )  # fmt: skip
