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
