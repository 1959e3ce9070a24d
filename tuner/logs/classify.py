"""Outcome classification from real failure signatures (never "a line containing error").

Signatures (interfaces reference §5 and the fixtures):

* ``oom``: the CUDA caching allocator's message in all its generations: ``CUDA out of memory.
  Tried to allocate X (GPU 0; Y total capacity; ...)`` (torch < 2.1, raised as
  ``torch.cuda.OutOfMemoryError`` or, in torch 1.8, as plain ``RuntimeError``), ``... GPU 0 has a
  total capacty of ...`` (torch 2.1, sic), ``... GPU 0 has a total capacity of ...`` (torch >= 2.2,
  ``torch.OutOfMemoryError`` from 2.5).
* ``nccl_timeout``: the ProcessGroupNCCL watchdog (``Watchdog caught collective operation
  timeout``, ``Exception (either an error or timeout) detected by watchdog``, ``Process group
  watchdog thread terminated``, ``c10::DistBackendError``) and gloo's ``Timed out waiting``.
* ``launch_error``: argparse (``prog: error: unrecognized arguments: ...``, ``error: argument
  --x: ...``), ``ModuleNotFoundError`` / ``ImportError`` ending a traceback, Megatron's
  argument-validation texts and DeepSpeed's batch-size check, a missing script or command.
  A worker crash with no more specific signature (an exception ending a traceback, torchrun's
  ``ChildFailedError`` summary, a fatal signal) is also reported as ``launch_error``; its reason
  names the exception or the signal (exit code -9 is SIGKILL: usually the host's OOM killer).

* ``diverged``: Megatron's NaN checks (``--check-for-nan-in-loss-and-grad``, on by default):
  ``found NaN in local grad norm ...``, ``found Inf in local forward loss calculation``.

Precedence: oom > diverged > nccl_timeout > launch_error > crash; an OOM followed by NCCL aborts
on the other ranks is an OOM. See :func:`decide` for how exit codes and the time limit combine
with it.

Scanning is linear in the log: every pattern is tried only on lines holding a literal it needs,
and none can backtrack quadratically (no unanchored pattern starts with a repeat that could span
the rest of the line; later repeats are bounded).
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Iterable, Sequence

from tuner.logs import lines
from tuner.outcome import Outcome

NO_STEP_TIME = "no per-iteration step time in the log"
"""The start of the reason of a log that measured no step (``no_metrics``)."""
_MAX_REASON = 300

_OOM = re.compile(
    r"(?:(?:torch\.(?:cuda\.)?OutOfMemoryError|RuntimeError)\s*:\s*)?"
    r"(?:CUDA|HIP) out of memory\b.*"
)
_OOM_CLASS = re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError\b.*")
# (literal every match holds, pattern); "[PG ...]" tags are at most 80 characters.
_NCCL = (
    (
        "Watchdog caught",
        re.compile(r"(?:\[Rank \d+\] )?Watchdog caught collective operation timeout.*"),
    ),
    (
        "watchdog thread terminated",
        re.compile(
            r"\[PG [^\]]{0,80}Rank \d+\] Process group watchdog thread terminated with exception.*"
        ),
    ),
    (
        "detected by watchdog",
        re.compile(
            r"(?:\[PG [^\]]{0,80}\] )?"
            r"Exception \(either an error or timeout\) detected by watchdog.*"
        ),
    ),
    (
        "Timed out waiting",
        re.compile(r"Timed out waiting \d+ms for (?:send|recv) operation to complete"),
    ),
    (
        "DistBackendError",
        re.compile(r"terminate called after throwing an instance of 'c10::DistBackendError'"),
    ),
)
_GLOO = "gloo"
_DIVERGED = re.compile(r"found (?:NaN|Inf) in local .*")
# ``prog: error: ...``: the lookbehind starts the program name at a word start, so the \S+ is
# tried once per word, not once per character (a 50 kB line without spaces took 47 s).
_ARGPARSE = re.compile(
    r"(?<!\S)(\S+): error: (?:unrecognized arguments: |the following arguments are required: |"
    r"argument \S+|one of the arguments |not allowed with argument ).*"
)
_TYRO = re.compile(r"(?:Unrecognized options|Error parsing \S+): [^│|]*")
_IMPORT = re.compile(r"^(?:ModuleNotFoundError|ImportError): .*")
# Megatron-LM argument/config validation (core_v0.15 arguments.py, transformer_config.py,
# num_microbatches_calculator.py, parallel_state.py) and DeepSpeed's batch-size check.
_VALIDATION_PHRASES = (
    "is not divisible by total_model_size",
    "must be a multiple of tensor_model_parallel_size",
    "Number of layers should be divisible by the pipeline-model-parallel size",
    "number of layers of the model must be divisible pipeline model parallel size",
    "number of layers per pipeline stage must be divisible number of layers per virtual",
    "When interleaved schedule is used",
    "No more than one of the following arguments can be set at the same time",
    "is not divisible by micro batch size",
    "seq-length should be a multiple of 2 * context-parallel-size",
    "must be greater than or equal to seq_length",
    "require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS",
    "recompute method is not yet supported for selective recomputing granularity",
    "so recompute_method must be",
    "recompute_num_layers must be",
    "Invalid choices for recompute_modules",
    "in recompute_modules is only supported with",
    "recompute cannot work with --moe-shared-expert-overlap",
    "and layernorm recompute for fp8",
    "with full recompute granularity",
    "only supported with distributed optimizer",
    "Must use --overlap-param-gather with --overlap-grad-reduce",
    "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism",
    # TE initialize_ub without CUDA multicast (tuner.models.time.tp_overlap; UB_SKIPMC=1 uses CUDA
    # IPC)
    "does not support comm+GEMM overlap with CUDA Multicast",
    "argument is None",
    "A single data source must be provided",
    "num_experts must be non None",
    "Number of experts should be a multiple of expert model parallel_size",
    "Expert parallelism is not supported with fp16",
    "Cannot use sequence parallelism without tensor parallelism",
    "First dimension of the tensor should be divisible by tensor parallel size",
    "Check batch related parameters",
    "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided",
    "incompatible with pipeline parallelism",
)
# The exception a validation message is raised with; the phrases are then looked up with `in`
# (one alternation of 27 phrases tried at every position of a long line is slow).
_VALIDATION = re.compile(r"^(?:AssertionError|ValueError|RuntimeError|TypeError)\s*: ")
_DIVIDE = re.compile(r"^AssertionError: \d+ is not divisible by \d+$")
_CANT_OPEN = "can't open file "
_MISSING = (
    re.compile(
        r"^(?:\S*/)?(?:ba|da|z)?sh: (?:line \d+: |\d+: )?.*: "
        r"(?:No such file or directory|command not found|not found|Permission denied)\s*$"
    ),
    re.compile(r"^(?:\S*/)?env: .*No such file or directory\s*$"),
    re.compile(r"^FileNotFoundError: .*"),
)
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+, in (\S+)')
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt))(?:: .*|\s*)$")
_CHILD_FAILED = "ChildFailedError"
_EXITCODE = re.compile(r"(?:failed \(exitcode: |exitcode\s*: )(-?\d+)")
_HOST_OOM_HINT = "host out of memory likely (kernel OOM killer)"


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """A failure signature found in a log."""

    outcome: Outcome
    reason: str
    specific: bool = True
    """False for a bare crash (traceback, torchrun summary): a time limit or a clean exit wins."""


def _reason(text: str) -> str:
    text = text.strip()
    for quote in "\"'":  # an unbalanced quote around a pasted message is not part of it
        if text.count(quote) % 2 and text.endswith(quote):
            text = text[:-1]
        if text.count(quote) % 2 and text.startswith(quote):
            text = text[1:]
    cut = text.find(" If reserved")
    if cut > 0:
        text = text[:cut]
    text = text.strip()
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


def signal_reason(exit_code: int) -> str:
    """``-9`` / ``137`` -> "exit code -9 (SIGKILL): killed by SIGKILL: host out of memory ..."."""
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else 0
    if number == 0:
        return f"exited with code {exit_code}"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    hint = f": {_HOST_OOM_HINT}" if number == signal.SIGKILL else ""
    return f"exit code {exit_code} ({name}){hint}"


# Categories, in precedence order, and the rank of a signature inside its category.
_OOM_RANK, _DIVERGED_RANK, _NCCL_RANK, _LAUNCH_RANK, _CRASH_RANK = range(5)


#: Every line :meth:`FailureScan.feed` acts on holds one of these (the gates in ``feed``); the
#: parser hands it no other line.
MARKERS = (
    "Traceback", 'File "', "out of memory", "rror", "xception", "Interrupt", "atchdog",
    "Timed out waiting", "found NaN in local", "found Inf in local", "exitcode",
    "Unrecognized options",
    _CANT_OPEN, "No such file", "not found", "Permission denied",
)  # fmt: skip


@dataclasses.dataclass(slots=True)
class FailureScan:
    """Failure signatures of a log fed line by line (prefix-stripped): the state carried from
    line to line (tracebacks seen, the innermost frame) and the best hit of each category."""

    in_traceback: bool = False
    last_frame: str = ""
    best: dict[int, tuple[int, Failure]] = dataclasses.field(default_factory=dict)

    def result(self) -> Failure | None:
        """The signature that explains the lines fed so far best, or None."""
        return self.best[min(self.best)][1] if self.best else None

    def hit(self, category: int, sub: int, failure: Failure) -> None:
        current = self.best.get(category)
        if current is None or sub < current[0]:
            self.best[category] = (sub, failure)

    def feed(self, line: str) -> None:
        if _TRACEBACK in line:
            self.in_traceback = True
        if 'File "' in line and (frame := _FRAME.match(line)):
            self.last_frame = frame.group(1)
        if "out of memory" in line or "OutOfMemoryError" in line:
            self._memory(line)
        if "found NaN in local" in line or "found Inf in local" in line:
            self._diverged(line)
        if "atchdog" in line or "Timed out waiting" in line or "DistBackendError" in line:
            self._nccl(line)
        if "Unrecognized options" in line or "Error parsing " in line:
            self._tyro(line)
        # Lines an exception ends a traceback with; all launch and crash signatures hold one of
        # these words or a missing-file phrase.
        exception = "Error" in line or "Exception" in line or "Interrupt" in line
        if exception or "error" in line or "exitcode" in line or _CANT_OPEN in line:
            self._launch(line)
            self._crash(line, exception)
        elif "No such file" in line or "not found" in line or "Permission denied" in line:
            self._launch(line)

    def _memory(self, line: str) -> None:
        match = _OOM.search(line) or _OOM_CLASS.search(line)
        if match:
            self.hit(_OOM_RANK, 0, Failure(Outcome.OOM, _reason(match.group())))

    def _diverged(self, line: str) -> None:
        if match := _DIVERGED.search(line):
            self.hit(_DIVERGED_RANK, 0, Failure(Outcome.DIVERGED, _reason(match.group())))

    def _nccl(self, line: str) -> None:
        for sub, (literal, pattern) in enumerate(_NCCL):
            if literal not in line or not (match := pattern.search(line)):
                continue
            if literal == "Timed out waiting":  # gloo's message: starts at "gloo" before it
                start = line.find(_GLOO, 0, match.start())
                if start < 0:
                    continue
                text = line[start:]
            else:
                text = match.group()
            self.hit(_NCCL_RANK, sub, Failure(Outcome.NCCL_TIMEOUT, _reason(text)))
            return

    def _tyro(self, line: str) -> None:
        """tyro's parse errors (torchtitan's command line), printed in a box on stderr:
        ``Unrecognized options: --x`` and ``Error parsing Config: <the config's ValueError>``."""
        if match := _TYRO.search(line):
            text = f"tyro: {match.group().strip(' │|')}"
            self.hit(_LAUNCH_RANK, 0, Failure(Outcome.LAUNCH_ERROR, _reason(text)))

    def _launch(self, line: str) -> None:
        stripped = line.strip()
        found = _ARGPARSE.search(line) if ": error: " in line else None
        if found is None and self.in_traceback:
            found = _IMPORT.match(stripped) or _DIVIDE.match(stripped)
            if found is None and _validation(stripped):
                found = _WHOLE_LINE.match(stripped)
        text = found.group() if found is not None else _missing(stripped)
        if text is not None:
            self.hit(_LAUNCH_RANK, 0, Failure(Outcome.LAUNCH_ERROR, _reason(text)))
        elif (
            self.in_traceback
            and stripped == "AssertionError"
            and self.last_frame
            in (
                "validate_args",
                "__post_init__",
            )
        ):
            reason = f"AssertionError in {self.last_frame} (argument validation)"
            self.hit(_LAUNCH_RANK, 1, Failure(Outcome.LAUNCH_ERROR, reason))

    def _crash(self, line: str, exception: bool) -> None:
        stripped = line.strip()
        if self.in_traceback and exception and (match := _EXCEPTION.match(stripped)):
            sub = 2 if _CHILD_FAILED in match.group(1) else 0
            self.hit(_CRASH_RANK, sub, _crash(_reason(stripped)))
        elif "exitcode" in line and (code := _EXITCODE.search(line)) and int(code.group(1)) != 0:
            self.hit(
                _CRASH_RANK,
                1,
                _crash(f"torchrun: worker failed, {signal_reason(int(code.group(1)))}"),
            )


def _crash(reason: str) -> Failure:
    return Failure(Outcome.LAUNCH_ERROR, reason, specific=False)


_WHOLE_LINE = re.compile(r".*")


def _validation(stripped: str) -> bool:
    """A framework's argument-validation message (the exception, then a known phrase)."""
    head = _VALIDATION.match(stripped)
    return head is not None and any(p in stripped[head.end() :] for p in _VALIDATION_PHRASES)


def _missing(stripped: str) -> str | None:
    """A missing script, command or file: the message, or None."""
    start = stripped.find(_CANT_OPEN)  # python: can't open file '...': [Errno 2] No such file
    if start >= 0 and "No such file or directory" in stripped[start:]:
        return stripped[start:]
    match = next((m for p in _MISSING if (m := p.search(stripped))), None)
    return match.group() if match is not None else None


def find_failure(text: str | Iterable[str]) -> Failure | None:
    """The failure signature that explains this log best, or None.

    ``text`` is the whole log or its lines (already prefix-stripped lines work too).
    """
    scan = FailureScan()
    for line in lines.log_lines(text) if isinstance(text, str) else text:
        scan.feed(line)
    return scan.result()


def decide(
    failure: Failure | None,
    *,
    has_step_time: bool,
    exit_codes: Sequence[int | None] = (),
    timed_out: bool = False,
    iterations: int = 0,
    diverged: str | None = None,
    no_step_time: str | None = None,
) -> tuple[Outcome, str | None]:
    """Combine a log's failure signature with how the processes ended.

    ``exit_codes`` holds one code per process or node the executor waited for (None: unknown;
    negative: killed by that signal, as :mod:`subprocess` reports it). ``timed_out`` says the
    executor killed the job at the trial limit; ``iterations`` counts the per-step records the
    log had; ``diverged`` is the parser's reason when the loss went NaN/inf. Rules, in order:

    1. a specific signature (OOM, NaN check, NCCL timeout, launch error) decides;
    2. a diverged loss is ``diverged`` (whatever ended the run, its step times measure nothing);
    3. a time-out is ``timeout`` when an iteration line had arrived, else ``hang`` (the kill is
       what ended it; a bare crash trace is its echo);
    4. a crash trace decides unless every exit code is known and 0;
    5. a non-zero exit code is ``launch_error`` naming the code or signal;
    6. ``ok`` with a steady-state step time, else ``no_metrics`` (saying why where the parser
       found a step time that is no number above zero: ``no_step_time``).
    """
    if failure is not None and failure.specific:
        return failure.outcome, failure.reason
    if diverged is not None:
        return Outcome.DIVERGED, diverged
    if timed_out:
        if iterations or has_step_time:
            return Outcome.TIMEOUT, (
                f"killed at the trial time limit after {iterations} iteration line(s)"
            )
        return Outcome.HANG, (
            "killed at the trial time limit before any iteration line (hung at start-up or in "
            "the first step)"
        )
    known = [code for code in exit_codes if code is not None]
    clean_exit = bool(exit_codes) and len(known) == len(exit_codes) and not any(known)
    if failure is not None and not clean_exit:
        return failure.outcome, failure.reason
    bad = [code for code in known if code != 0]
    if bad:
        return Outcome.LAUNCH_ERROR, signal_reason(bad[0])
    if has_step_time:
        return Outcome.OK, None
    if no_step_time is not None:
        return Outcome.NO_METRICS, f"{NO_STEP_TIME}: {no_step_time}"
    return Outcome.NO_METRICS, NO_STEP_TIME
