"""torchtitan's metric line: real excerpts, with and without colours, GC steps, failures."""

from __future__ import annotations

import pytest

from tuner.logs import parse_log
from tuner.outcome import Outcome

# Real torchtitan output, rank prefix and all (pytorch/torchtitan pull request #3393, 2026-05).
REAL = """\
[rank0]:[titan] 2026-05-18 16:04:46,338 - root - INFO - step: 14  loss:  3.24405  grad_norm:  0.8319  memory:  9.46GiB(64.99%)  tps: 7,282  tflops: 0.52  mfu: 0.17%
[rank0]:[titan] 2026-05-18 16:04:47,456 - root - INFO - step: 15  loss:  3.10680  grad_norm:  0.8587  memory:  9.46GiB(64.99%)  tps: 7,334  tflops: 0.53  mfu: 0.17%
[rank0]:[titan] 2026-05-18 16:04:48,577 - root - INFO - step: 16  loss:  3.05047  grad_norm:  0.5443  memory:  9.46GiB(64.99%)  tps: 7,313  tflops: 0.52  mfu: 0.17%
[rank0]:[titan] 2026-05-18 16:04:49,702 - root - INFO - step: 17  loss:  3.14459  grad_norm:  0.5303  memory:  9.46GiB(64.99%)  tps: 7,282  tflops: 0.52  mfu: 0.17%
[rank0]:[titan] 2026-05-18 16:04:50,821 - root - INFO - step: 18  loss:  3.54399  grad_norm:  0.7675  memory:  9.46GiB(64.99%)  tps: 7,322  tflops: 0.52  mfu: 0.17%
"""  # noqa: E501
COLOURED = (
    "[titan] 2026-02-24 19:46:17,508 - root - INFO - \x1b[31mstep:  4  \x1b[32mloss:  7.62585  "
    "\x1b[33mgrad_norm: 26.6250  \x1b[36mmemory: 66.91GiB(37.51%)  \x1b[34mtps: 10,050  "
    "\x1b[96mtflops: 314.71  \x1b[35mmfu: 13.99%\x1b[39m\n"
)


def test_real_lines_give_step_time_from_tps() -> None:
    # With 8192 tokens per rank per step a step took 8192 / tps seconds; the median of steps
    # 15-18 is the middle of 8192/7313 and 8192/7322, and the log's own timestamps, 1.118 to
    # 1.125 s apart, agree with it.
    m = parse_log(REAL, "torchtitan", warmup=1, step_tokens=8192.0)
    assert m.outcome == Outcome.OK and m.iterations == 5
    assert m.step_time_s == pytest.approx((8192 / 7313 + 8192 / 7322) / 2)
    assert m.step_time_s == pytest.approx(1.12, abs=0.005)
    assert m.peak_reserved_gib == 9.46 and m.peak_memory_gib is None  # max reserved only
    assert m.tflops_per_gpu == pytest.approx(0.52)


def test_colours_change_nothing() -> None:
    plain = COLOURED.replace("\x1b[31m", "")
    for text in (COLOURED, plain):
        m = parse_log(text, "torchtitan", step_tokens=10_050.0)
        assert m.step_time_s == pytest.approx(1.0) and m.peak_reserved_gib == 66.91


def line(step: int, tps: int, loss: str = "3.00000") -> str:
    return (
        f"[titan] 2026-05-18 16:04:46,338 - root - INFO - step: {step:2}  loss: {loss}  "
        f"grad_norm:  0.8319  memory:  9.46GiB(64.99%)  tps: {tps:,}  tflops: 0.52  mfu: 0.17%\n"
    )


def test_the_periodic_gc_step_is_left_out() -> None:
    # torchtitan collects garbage at step 50 (gc_freq 50), inside that step's time
    text = "".join(line(s, 500 if s == 50 else 1000) for s in range(1, 56))
    m = parse_log(text, "torchtitan", step_tokens=1000.0)
    assert m.iterations == 55 and len(m.step_times_s) == 54
    assert max(m.step_times_s) == pytest.approx(1.0)


def test_validation_lines_are_not_steps_and_nan_loss_diverges() -> None:
    validation = (
        "[titan] 2026-05-18 16:04:46,338 - root - INFO - validate step:  5  loss:  3.1000  "
        "memory:  9.46GiB(64.99%)  tps: 99\n"
    )
    m = parse_log(line(1, 1000) + validation + line(2, 1000), "torchtitan", step_tokens=1.0)
    assert m.iterations == 2
    bad = parse_log(line(1, 1000) + line(2, 1000, "nan"), "torchtitan", step_tokens=1.0)
    assert bad.outcome == Outcome.DIVERGED


def test_no_tokens_no_step_time() -> None:
    m = parse_log(REAL, "torchtitan")
    assert m.step_time_s is None and m.outcome == Outcome.NO_METRICS


def test_tyro_parse_errors_are_launch_errors() -> None:
    # what torchtitan 0.3.0's command line prints (tyro's box on stderr), then torchrun's report
    for box, reason in (
        ("│ Unrecognized options: --training.bogus      │",
         "Unrecognized options: --training.bogus"),
        ("│ Error parsing Config: CUDA graphs do not support pipeline parallelism yet.   │",
         "Error parsing Config: CUDA graphs do not support pipeline parallelism yet."),
    ):  # fmt: skip
        text = f"╭─ Parsing error ─╮\n{box}\n╰─────╯\n  exitcode  : 2 (pid: 5390)\n"
        m = parse_log(text, "torchtitan", exit_codes=[1], step_tokens=1.0)
        assert m.outcome == Outcome.LAUNCH_ERROR
        assert m.reason == f"tyro: {reason}"


def _with(step: str = "3", memory: str = "9.46", tps: str = "1,000", tflops: str = "0.52") -> str:
    return (
        f"[titan] 2026-05-18 16:04:46,338 - root - INFO - step: {step}  loss: 3.0  grad_norm: "
        f" 0.8319  memory: {memory}GiB(64.99%)  tps: {tps}  tflops: {tflops}  mfu: 0.17%\n"
    )


@pytest.mark.parametrize(
    "bad",
    [
        _with(memory="."), _with(memory="12..34"), _with(memory="9.469.46"),  # two prints spliced
        _with(tps=","), _with(tflops="."), _with(tflops="1.2.3"), _with(step="9" * 5000),
        _with(step="9" * 400),
    ],
    ids=["memory-dot", "memory-two-dots", "memory-spliced", "tps-comma", "tflops-dot",
         "tflops-two-dots", "step-5000-digits", "step-400-digits"],
)  # fmt: skip
@pytest.mark.parametrize("framework", ["torchtitan", "megatron", "deepspeed"])
def test_a_garbled_metric_line_is_no_figure_not_a_crash(bad: str, framework: str) -> None:
    """A metric line whose figure is no number (two ranks' prints spliced mid-figure, a line
    cut short) was a ValueError or OverflowError out of the parser, in every framework's parse
    (the torchtitan lines are looked for in each): ``tune parse-log`` a traceback, and a study
    stopped at the trial whose log held it, on every resume again."""
    text = line(1, 1000) + bad + line(2, 1000)
    m = parse_log(text, framework, step_tokens=1000.0)  # type: ignore[arg-type]
    if framework == "torchtitan":
        assert m.outcome == Outcome.OK and m.step_time_s == pytest.approx(1.0)
        assert m.peak_reserved_gib == 9.46


def test_a_step_printed_twice_is_one_step_its_slowest() -> None:
    """Every rank prints the metric line (the template filters none), and a log two runs
    appended to holds each step twice: "iterations" said 2x the steps and the median mixed the
    prints. A step is one, its slowest print (the lowest tps) and largest memory."""
    first = "".join(line(s, 1000) for s in range(1, 6))
    second = "".join(line(s, 500).replace("9.46GiB", "12.5GiB") for s in range(1, 6))
    for text in (first + second, "".join(a + b for a, b in zip(
            first.splitlines(True), second.splitlines(True), strict=True))):  # fmt: skip
        m = parse_log(text, "torchtitan", warmup=1, step_tokens=1000.0)
        assert m.iterations == 5
        assert m.step_times_s == (2.0,) * 5
        assert m.peak_reserved_gib == 12.5


@pytest.mark.parametrize("tps", ["0", "nan", "inf"])
def test_a_tps_that_is_no_number_above_zero_is_said(tps: str) -> None:
    """``tps: 0`` (a broken timer's, or no token counted) read "no per-iteration step time in
    the log", as if the log printed none; NaN or an infinity dropped the line as if it was none."""
    m = parse_log("".join(_with(str(s), tps=tps) for s in (1, 2)), "torchtitan", step_tokens=1.0)
    assert (m.outcome, m.iterations) == (Outcome.NO_METRICS, 2)
    said = f"tps is '{tps}' at step 1: not a number above zero"
    assert m.reason == f"no per-iteration step time in the log: {said}"


def test_without_the_tokens_per_step_the_reason_says_so() -> None:
    """``tune parse-log`` of a good torchtitan log said "no per-iteration step time in the
    log", as of a broken one: the log prints tokens per second, which gives a step time only
    with the study's tokens per step."""
    m = parse_log(REAL, "torchtitan")
    assert m.reason is not None and "tokens per second" in m.reason


def test_two_metric_lines_glued_on_one_line_are_two_steps() -> None:
    """Two ranks' (or a cut-short and the next) metric lines without a break between them: the
    second's step was lost."""
    glued = line(2, 500).rstrip("\n") + line(3, 1000)
    m = parse_log(line(1, 1000) + glued + line(4, 1000), "torchtitan", step_tokens=1000.0)
    assert m.iterations == 4
    assert m.step_times_s == (1.0, 2.0, 1.0, 1.0)
