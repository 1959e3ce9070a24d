"""``tune parse-log FILE... [--framework megatron|deepspeed] [--format table|json]``.

``--format json`` (or ``--json``) prints ``{"logs": [...]}``, one object per file in the order
given (keys: :data:`tuner.logs.JSON_KEYS`).

A trial's own log (``node-<k>.log`` beside the ``result.json`` that lists it) is judged with the
executor's account of how the tuner ended it, as the study judged it: a trial the tuner killed
at its time limit or stopped once its measurement was complete (``JobResult.stopped``) is not
a crash, though torchrun's traceback of the SIGTERM (``SignalException``) ends its log.

The ``tune`` entry point registers this with :func:`add_parser` and dispatches to :func:`run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from tuner.cli.render import Column, Grid, console, render
from tuner.errors import ParseError
from tuner.spec.frameworks import Framework

if TYPE_CHECKING:
    from tuner.logs import RunMetrics
    from tuner.logs.metrics import Need


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``parse-log`` subcommand (its handler is ``args.func``, i.e. :func:`run`)."""
    from tuner.cli.options import STUDY_HELP, add_format_option, whole

    parser = subparsers.add_parser(
        "parse-log",
        help="read Megatron-LM, DeepSpeed, Megatron-DeepSpeed, Megatron-Bridge or torchtitan "
        "logs: outcome, step time, peak memory, TFLOP/s",
        description="Parse training logs and print the outcome, iterations seen, median "
        "steady-state step time, peak memory and TFLOP/s per GPU of each.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="log file(s) to read")
    parser.add_argument(
        "--framework",
        choices=get_args(Framework),
        default=None,
        metavar="NAME",
        help=f"log format: {', '.join(get_args(Framework))} (default: detected from the log)",
    )
    parser.add_argument(
        "--warmup",
        type=whole(0),
        default=None,
        metavar="N",
        help="step records to drop as warm-up (default: max(1, 20%%), at least one kept)",
    )
    parser.add_argument(
        "--study", default=None, metavar="NAME",
        help="judge each log as this study judges its trials: its framework, warm-up, global "
        f"batch, sequence length and GPUs ({STUDY_HELP})",
    )  # fmt: skip
    for flag, what in (("--global-batch", "global batch size (sequences per step)"),
                       ("--seq-len", "sequence length (tokens)"),
                       ("--gpus", "GPUs (ranks) the run used")):  # fmt: skip
        parser.add_argument(flag, type=whole(1), default=None, metavar="N",
                            help=f"the run's {what}, where --study does not say it")  # fmt: skip
    add_format_option(parser)
    parser.set_defaults(func=run)


@dataclasses.dataclass(frozen=True, slots=True)
class Known:
    """What the command was told of the run beside its log (``--study``, ``--global-batch``,
    ``--seq-len``, ``--gpus``): the figures a torchtitan log (tokens/s per GPU) and a DeepSpeed
    log with only throughput lines (samples/s) need for a step time, as a study gives them
    (:func:`tuner.study.record.parse_result`)."""

    framework: Framework | None = None
    warmup: int | None = None
    global_batch: int | None = None
    seq_len: int | None = None
    gpus: int | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> Known:
        """From the options; an option given wins over the study's figure."""
        from tuner.spec.file import load_study

        spec = load_study(args.study) if args.study is not None else None
        if spec is None:
            return cls(args.framework, args.warmup, args.global_batch, args.seq_len, args.gpus)
        return cls(
            args.framework or spec.framework,
            spec.launch.warmup_iters if args.warmup is None else args.warmup,
            args.global_batch or spec.training.global_batch_size,
            args.seq_len or spec.model.seq_length, args.gpus or spec.world_size,
        )  # fmt: skip

    @property
    def step_tokens(self) -> float | None:
        """The tokens of one step per GPU (None: a figure is missing)."""
        if self.global_batch and self.seq_len and self.gpus:
            return self.global_batch * self.seq_len / self.gpus
        return None

    def missing(self, need: Need) -> str:
        """The options that would give what a log needs, in words."""
        named = {"--global-batch N": self.global_batch, "--seq-len N": self.seq_len,
                 "--gpus N": self.gpus}  # fmt: skip
        if need == "global_batch_size":
            named = {"--global-batch N": self.global_batch}
        return " ".join(flag for flag, value in named.items() if not value)


NEEDS = {
    "step_tokens": "torchtitan logs tokens/s per GPU (tps), a step time only with the tokens of "
    "one step",
    "global_batch_size": "the log has only throughput lines (samples/s), a step time only with "
    "the global batch",
}
"""Why a log gave no step time on its own (:data:`tuner.logs.metrics.Need`), said by
:func:`_judged`."""


def _judged(metrics: RunMetrics, known: Known) -> RunMetrics:
    """``metrics`` with the reason of a log that needed more than itself said in one line:
    which options give it (a bare ``no_metrics`` where a study judged the same log ``ok``)."""
    from tuner.logs.classify import NO_STEP_TIME

    if metrics.step_time_s is not None or metrics.needs is None:
        return metrics
    if metrics.reason is not None and not metrics.reason.startswith(NO_STEP_TIME):
        return metrics  # another verdict decided (an OOM, a crash): it stays
    why = (f"{NEEDS[metrics.needs]}: give --study NAME (judged as that study judges its "
           f"trials) or {known.missing(metrics.needs)}")  # fmt: skip
    return dataclasses.replace(metrics, reason=why)


def run(args: argparse.Namespace) -> int:
    """Parse every file; 0 when all were read, 2 (one line on stderr) when one cannot be."""
    results: list[tuple[str, RunMetrics]] = []
    known = Known.of(args)
    for file in args.files:
        try:
            metrics = _judged(_parse(file, known), known)  # streamed, linear
            _check_warmup(file, metrics, args.warmup)
        except ParseError as exc:
            print(f"tune: error: {exc}", file=sys.stderr)  # as every command's bad input
            return 2
        results.append((file, metrics))
    if args.format == "json":
        # One object, as every command prints, however many files were given.
        from tuner.cli.tables import _emit_json

        _emit_json({"logs": [metrics.to_json(file) for file, metrics in results]})
    else:
        render(console(), _table(results))
    return 0


def _parse(file: str, known: Known) -> RunMetrics:
    """``file``'s metrics; a trial's log is judged as :func:`tuner.study.record.judge` judged
    it, with the executor's account (:func:`_account`): a lost node, the batch scheduler's
    verdict, a trial cancelled because the study stopped decide first
    (:func:`tuner.launch.request.ended_verdict`); else the log with its node's exit code, and
    killed at the limit is ``timeout``, not the ``launch_error`` of the kill's traceback. A
    trial stopped once its measurement was complete is ``ok`` with its step time, as the study
    recorded it (:func:`tuner.study.measure.measured_anyway`: the watch stops a trial only
    once its steady batches are enough)."""
    from tuner.launch.request import ended_verdict
    from tuner.logs import parse_log_file  # the parsers load with the command that uses them
    from tuner.outcome import Outcome

    framework, warmup = known.framework, known.warmup
    batch, tokens = known.global_batch, known.step_tokens
    account = _account(Path(file))
    if account is None:
        return parse_log_file(file, framework, warmup, global_batch_size=batch,
                              step_tokens=tokens)  # fmt: skip
    how, codes, node_errors, verdict = account
    metrics = parse_log_file(file, framework, warmup, exit_codes=codes,
                             timed_out=how is not None and how != "cancelled",
                             global_batch_size=batch, step_tokens=tokens)  # fmt: skip
    ended = ended_verdict(node_errors=node_errors, scheduler_verdict=verdict, how=how)
    if ended is not None:
        return dataclasses.replace(metrics, outcome=ended[0], reason=ended[1])
    if how not in (None, "limit") and metrics.outcome == Outcome.TIMEOUT and (
        metrics.step_time_s is not None
    ):  # fmt: skip
        why = f"ended by the tuner once its measurement was complete ({how})"
        return dataclasses.replace(metrics, outcome=Outcome.OK, reason=why)
    return metrics


Account = tuple[str | None, tuple[int | None, ...], list[list[str]], list[str] | None]
"""How the tuner ended a trial (:func:`tuner.launch.request.ended_how`), the exit code of the
log's node (none where unknown), the node errors and the batch scheduler's verdict."""


def _account(log: Path) -> Account | None:
    """The executor's account of the trial whose node log ``log`` is: from the ``result.json``
    that lists it, else from the line the executor ended the log with
    (:data:`tuner.launch.request.ENDED_MARK`: a log copied out alone); None for a plain log. An
    account this version cannot read in full still gives what it can (an older one has no
    ``stopped``)."""
    from tuner.layout import TrialPaths

    try:
        account = json.loads(TrialPaths(log.parent).result_json.read_text())
        names = [Path(p).name for p in account["logs"]]
        if log.name in names:
            return _read_account(account, names.index(log.name))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        pass  # a plain log, or an account this version cannot read: the log alone
    how = _marked(log)
    return None if how is None else (how, (), [], None)


def _read_account(account: dict[str, Any], node: int) -> Account:
    from tuner.launch.request import ended_how
    from tuner.outcome import Outcome

    stopped = account.get("stopped")
    how = ended_how(timed_out=account.get("timed_out") is True,
                    cancelled=account.get("cancelled") is True,
                    stopped=stopped if isinstance(stopped, str) else None)  # fmt: skip
    codes = account.get("exit_codes")
    code = codes[node] if isinstance(codes, list) and node < len(codes) else None
    known = (code,) if isinstance(code, int) and not isinstance(code, bool) else ()
    errors = [[str(e[0]), str(e[1])] for e in account.get("node_errors") or ()]
    verdict = account.get("scheduler_verdict")
    said = [str(v) for v in verdict] if verdict else None
    known_verdict = said if said and said[0] in {str(o) for o in Outcome} else None
    return how, known, errors, known_verdict


_MARK_TAIL = 4096
"""Bytes of a log's end searched for the executor's line (it is the last one written)."""


def _marked(log: Path) -> str | None:
    """The word of the line the executor ended ``log`` with when the tuner ended its trial, or
    None."""
    from tuner.launch.request import ENDED_MARK

    if not log.is_file():  # a FIFO would block here: the parser says what it is instead
        return None
    try:
        with log.open("rb") as f:
            f.seek(max(f.seek(0, 2) - _MARK_TAIL, 0))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = [line[len(ENDED_MARK):].strip() for line in tail.splitlines()
             if line.startswith(ENDED_MARK)]  # fmt: skip
    return found[-1] if found else None


def _check_warmup(file: str, metrics: RunMetrics, warmup: int | None) -> None:
    """An explicit ``--warmup`` must leave a step record to measure. Why: the parsers keep one
    record whatever the warm-up (a trial's short log still measures), so a warm-up longer than
    the log would report a warm-up step as the steady-state time."""
    records = len(metrics.step_times_s)
    if warmup is not None and records and warmup >= records:
        raise ParseError(
            f"--warmup {warmup}: {file} has {records} step record(s); drop at most {records - 1}"
        )


FIXED_WIDTH = 12
"""The longest figure written in fixed form; a longer one (a log's ``elapsed time per iteration
(ms): 1e+300``) is written in exponent form: in fixed form it took 300 digits of the table."""


def _fmt(value: float | None, digits: int) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return text if len(text) <= FIXED_WIDTH else f"{value:.4g}"


COLUMNS = (
    Column(name="file", header="file", right=False, wrap=3, path=True),
    Column(name="outcome", header="outcome", right=False),
    Column(name="iterations", header="iters"),
    Column(name="step_time_s", header="step s"),
    Column(name="peak_memory_gib", header="peak GiB"),
    Column(name="peak_reserved_gib", header="reserved\nGiB", minor=True),
    Column(name="tflops_per_gpu", header="TFLOP/s\n/GPU", minor=True),
    Column(name="samples_per_s", header="samples\n/s", minor=True),
)  # fmt: skip
"""The table's columns, in the order they give way to a narrow terminal (the JSON's keys); a
failed log's reason is a line of its own under the table (a column of it was the first thing a
narrow terminal left out)."""


def _table(results: list[tuple[str, RunMetrics]]) -> Grid:
    rows = tuple(
        (file, str(m.outcome), str(m.iterations), _fmt(m.step_time_s, 3),
         _fmt(m.peak_memory_gib, 2), _fmt(m.peak_reserved_gib, 2), _fmt(m.tflops_per_gpu, 1),
         _fmt(m.samples_per_s, 2))
        for file, m in results
    )  # fmt: skip
    reasons = tuple(f"{file}: {m.reason}" for file, m in results if m.reason)
    return Grid(title="parsed logs", columns=COLUMNS, rows=rows, choosable=False, notes=reasons)
