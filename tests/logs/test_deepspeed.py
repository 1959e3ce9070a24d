"""DeepSpeed log parsing: every ThroughputTimer generation, wall-clock timers, pipeline lines,
see_memory_usage, and the tuner-step line of our own workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.logs import detect_framework, parse_deepspeed, parse_log, parse_log_file
from tuner.outcome import Outcome

FIXTURES: dict[str, dict[str, object]] = {
    "deepspeed_2020_timers_deepspeedai-DeepSpeed-255.log": dict(
        # only per-micro-step timers (no GAS-boundary line) and one SamplesPerSec record
        outcome=Outcome.NO_METRICS,
        iterations=1,
        step_time_s=None,
        samples_per_s=7.458824487454903,
    ),
    "deepspeed_fp16_overflow_deepspeedai-DeepSpeed-5779.log": dict(
        outcome=Outcome.NO_METRICS, iterations=0, step_time_s=None, samples_per_s=None
    ),
    "deepspeed_old_timer_names_gptneox_EleutherAI-gpt-neox-965.log": dict(
        outcome=Outcome.NO_METRICS,
        iterations=0,
        step_time_s=None,  # micro-step timers only
    ),
    "deepspeed_old_tput_timer_huggingface-transformers-14531.log": dict(
        outcome=Outcome.NO_METRICS,
        iterations=1,
        step_time_s=None,
        samples_per_s=9.526738918021234,  # "0/2000, SamplesPerSec=" (<= v0.5)
    ),
    "deepspeed_rank0_timers_2021_deepspeedai-DeepSpeed-1436.log": dict(
        outcome=Outcome.OK,
        iterations=2,
        # boundary lines: forward + backward + step; the first (1726.90 ms) is warm-up
        step_time_s=(316.87 + 740.98 + 659.09) / 1000,
        peak_memory_gib=None,
    ),
    "deepspeed_tput_timer_and_timers_deepspeedai-DeepSpeed-3742.log": dict(
        outcome=Outcome.OK,
        iterations=1,
        step_time_s=4.6229,  # GPT-NeoX iteration line wins over the timers
        samples_per_s=6.922,  # "samples/sec" before "iteration" on that line
        tflops_per_gpu=100.2,  # "approx flops per GPU: 100.2TFLOPS"
        tflops_includes_recompute=True,
        peak_memory_gib=63.31,  # MaxMemAllocated=63.31GB
        peak_reserved_gib=None,
    ),
    "deepspeed_wall_clock_breakdown_huggingface-accelerate-1589.log": dict(
        outcome=Outcome.OK,
        iterations=2,
        step_time_s=(27.46 + 73.60 + 72.60) / 1000,  # first boundary line is warm-up
    ),
}


def test_every_deepspeed_fixture_has_expectations(fixtures_dir: Path) -> None:
    present = {p.name for p in fixtures_dir.glob("deepspeed_*.log")}
    assert present == set(FIXTURES), "add the new fixture's expected figures to FIXTURES"


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_figures(fixtures_dir: Path, name: str) -> None:
    assert detect_framework((fixtures_dir / name).read_text()) == "deepspeed"
    metrics = parse_log_file(fixtures_dir / name)
    for field, expected in FIXTURES[name].items():
        actual = getattr(metrics, field)
        if isinstance(expected, float):
            assert actual == pytest.approx(expected, rel=1e-9), field
        else:
            assert actual == expected, field


def test_samples_per_second_and_known_batch_give_a_step_time(fixtures_dir: Path) -> None:
    text = (
        fixtures_dir / "deepspeed_old_tput_timer_huggingface-transformers-14531.log"
    ).read_text()
    metrics = parse_deepspeed(text, global_batch_size=32)
    assert metrics.outcome is Outcome.OK
    assert metrics.step_time_s == pytest.approx(32 / 9.526738918021234)


def test_tuner_step_lines_from_two_ranks() -> None:
    lines = []
    for it, (t0, t1) in enumerate([(3.0, 3.1), (1.0, 1.2), (1.1, 1.0), (0.9, 1.05)], start=1):
        lines.append(
            f"tuner-step: iter={it} time_s={t0} samples_per_s={8 / t0:.3f} "
            f"max_allocated_gib=2.5 max_reserved_gib=3.0 rank=0"
        )
        lines.append(
            f"[rank1]: 2025-01-01 INFO tuner-step: iter={it} time_s={t1} "
            f"samples_per_s={8 / t1:.3f} max_allocated_gib=2.75 max_reserved_gib=3.25 rank=1"
        )
    metrics = parse_log("\n".join(lines))
    assert metrics.outcome is Outcome.OK
    assert metrics.iterations == 4
    assert metrics.step_times_s == (3.1, 1.2, 1.1, 1.05)  # slowest rank per step
    assert metrics.step_time_s == pytest.approx(1.1)  # drop step 1
    assert metrics.samples_per_s == pytest.approx(8 / 1.1, rel=1e-3)
    assert metrics.peak_memory_gib == pytest.approx(2.75)
    assert metrics.peak_reserved_gib == pytest.approx(3.25)


def test_tuner_step_memory_wins_over_deepspeeds_cpu_resident_memory() -> None:
    """On CPU DeepSpeed's MaxMemAllocated is the process's resident memory (0.55 GB here) while
    the workload's allocator peak is 0.12 GiB: the tuner-step figure is the one to report."""
    text = "\n".join([
        "tuner-step: iter=1 time_s=1.16 samples_per_s=6.9 max_allocated_gib=0.119541 "
        "max_reserved_gib=0.283203 rank=0",
        "[2026-11-30 03:15:50,619] [INFO] [timer.py:264:stop] epoch=0/micro_step=6/global_step=3,"
        " RunningAvgSamplesPerSec=10.56, CurrSamplesPerSec=10.56, MemAllocated=0.55GB, "
        "MaxMemAllocated=0.55GB",
        "tuner-step: iter=2 time_s=0.88 samples_per_s=9.1 max_allocated_gib=0.119541 rank=0",
    ])  # fmt: skip
    metrics = parse_log(text)
    assert metrics.peak_memory_gib == pytest.approx(0.119541)
    assert metrics.peak_reserved_gib == pytest.approx(0.283203)
    without = "\n".join(line for line in text.splitlines() if "tuner-step" not in line)
    assert parse_log(without, global_batch_size=8).peak_memory_gib == pytest.approx(0.55)


def test_tuner_step_without_optional_fields() -> None:
    text = "tuner-step: iter=1 time_s=0.5\ntuner-step: iter=2 time_s=0.25 extra=x\n"
    metrics = parse_log(text)
    assert metrics.step_time_s == pytest.approx(0.25)
    assert metrics.peak_memory_gib is None
    assert parse_log("tuner-step: time_s=0.5 rank=0").outcome is Outcome.NO_METRICS


def test_pipeline_engine_lines() -> None:
    text = "\n".join(
        f"steps: {n} loss: 10.{n}123 iter time (s): {t:.3f} samples/sec: {64 / t:.3f}"
        for n, t in [(10, 2.5), (20, 1.25), (30, 1.3), (40, 1.2)]
    )
    metrics = parse_log(text)
    assert detect_framework(text) == "deepspeed"
    assert metrics.iterations == 4
    assert metrics.step_time_s == pytest.approx(1.25)
    assert metrics.samples_per_s == pytest.approx(64 / 1.25, rel=1e-3)


def test_new_timer_names_at_the_boundary() -> None:
    prefix = "[2024-04-04 09:09:53,313] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | "
    text = "\n".join(
        [
            prefix + "fwd_microstep: 10.0 | bwd_microstep: 20.0 | step_microstep: 5.0",
            prefix
            + "fwd: 100.0 | bwd: 200.0 | bwd_inner: 150.0 | bwd_allreduce: 50.0 | step: 50.0",
            prefix
            + "fwd: 60.0 | bwd: 120.0 | bwd_inner: 100.0 | bwd_allreduce: 20.0 | step: 20.0",
            prefix + "optimizer_allgather: 8.0 | optimizer_gradients: 0.02 | optimizer_step: 6.0",
        ]
    )
    metrics = parse_log(text)
    assert metrics.iterations == 2
    assert metrics.step_times_s == pytest.approx((0.35, 0.2))
    assert metrics.step_time_s == pytest.approx(0.2)


def test_pipeline_train_batch_timer() -> None:
    text = "time (ms) | train_batch: 1500.00 | batch_input: 2.0\n" * 2
    assert parse_log(text, "deepspeed").step_time_s == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("line", "samples", "peak"),
    [
        (
            "[INFO] [timer.py:181:stop] 0/10, SamplesPerSec=12.5, MemAllocated=1.5GB, "
            "MaxMemAllocated=2.25GB",
            12.5,
            2.25,
        ),
        (
            "[INFO] [timer.py:197:stop] 0/10, RunningAvgSamplesPerSec=11.0, "
            "CurrSamplesPerSec=12.5, MemAllocated=1.5GB, MaxMemAllocated=2.25GB",
            12.5,
            2.25,
        ),
        (
            "[INFO] [timer.py:215:stop] epoch=0/micro_step=10/global_step=10, "
            "RunningAvgSamplesPerSec=11.0, CurrSamplesPerSec=12.5, MemAllocated=1.5GB, "
            "MaxMemAllocated=2.25GB",
            12.5,
            2.25,
        ),
    ],
)
def test_throughput_timer_generations(line: str, samples: float, peak: float) -> None:
    metrics = parse_log(line)
    assert metrics.samples_per_s == pytest.approx(samples)
    assert metrics.peak_memory_gib == pytest.approx(peak)
    assert parse_deepspeed(line, global_batch_size=25).step_time_s == pytest.approx(2.0)


def test_see_memory_usage_takes_the_max() -> None:
    text = "\n".join(
        [
            "[INFO] [utils.py:828:see_memory_usage] MA 1.5 GB         Max_MA 3.25 GB         "
            "CA 4.0 GB         Max_CA 5 GB ",
            "[INFO] [utils.py:828:see_memory_usage] MA 1.0 GB         Max_MA 2.0 GB         "
            "CA 4.0 GB         Max_CA 6 GB ",
        ]
    )
    metrics = parse_log(text)
    assert metrics.peak_memory_gib == pytest.approx(3.25)
    assert metrics.peak_reserved_gib == pytest.approx(6.0)


def test_detection_defaults_to_megatron() -> None:
    assert detect_framework(" iteration 1/ 10 | elapsed time per iteration (ms): 5.0 |") == (
        "megatron"
    )
    assert detect_framework("") == "megatron"


def test_nan_loss_in_deepspeed_lines_is_divergence() -> None:
    text = "\n".join(
        f"steps: {n} loss: {loss} iter time (s): 1.000 samples/sec: 64.000"
        for n, loss in [(10, "10.1"), (20, "nan"), (30, "nan")]
    )
    metrics = parse_log(text)
    assert (metrics.outcome, metrics.reason) == (Outcome.DIVERGED, "loss is nan at step 20")
    text = "tuner-step: iter=1 time_s=0.5 loss=7.1\ntuner-step: iter=2 time_s=0.5 loss=inf\n"
    metrics = parse_log(text)
    assert (metrics.outcome, metrics.reason) == (Outcome.DIVERGED, "loss is inf at iter 2")
    fp16 = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to"
    text = f"{fp16} 32768\ntuner-step: iter=1 time_s=0.5\ntuner-step: iter=2 time_s=0.5\n"
    assert parse_log(text).outcome is Outcome.OK


# One line of each source that gives a DeepSpeed step time, its time written as {t} seconds.
TIME_SOURCES = {
    "tuner-step": ("tuner-step: iter={n} time_s={t} rank=0", "time_s is '{t}' at iter 1"),
    "pipeline": (
        "steps: {n} loss: 8.1 iter time (s): {t} samples/sec: 64.0",
        "iter time (s) is '{t}' at step 1",
    ),
    "timers": (
        "[Rank 0] time (ms) | fwd: {t} | bwd: 0 | step: 0",
        "fwd + bwd + step is '{t:g}' ms at boundary timer line 1",
    ),
}


@pytest.mark.parametrize("value", ["-0.8", "0", "0.000", "nan", "inf", "-inf"])
@pytest.mark.parametrize("source", sorted(TIME_SOURCES))
def test_a_step_time_that_is_no_number_above_zero_is_said(source: str, value: str) -> None:
    """A broken timer's ``time_s=-0.8`` (or 0) was the log's step time, ``ok``: parse-log said
    -0.8 s/step; NaN or an infinity dropped the line, "no per-iteration step time in the log"
    as if none was printed. Each is no measurement, said as such, as Megatron's lines are."""
    line, said = TIME_SOURCES[source]
    text = "\n".join(line.format(n=n, t=value) for n in (1, 2, 3))
    metrics = parse_log(text, "deepspeed")
    assert (metrics.outcome, metrics.step_time_s) == (Outcome.NO_METRICS, None)
    reason = (
        f"{said.format(t=float(value) if source == 'timers' else value)}: not a number above zero"
    )
    assert metrics.reason == f"no per-iteration step time in the log: {reason}"


@pytest.mark.parametrize("source", sorted(TIME_SOURCES))
def test_a_step_time_not_above_zero_is_left_out_of_the_median(source: str) -> None:
    line = TIME_SOURCES[source][0]
    times = ["9", "1", "-5", "0", "-7", "2", "3"]  # the first is the warm-up
    metrics = parse_log("\n".join(line.format(n=n, t=t) for n, t in enumerate(times)), "deepspeed")
    assert metrics.outcome is Outcome.OK
    assert metrics.step_time_s == pytest.approx(2.0 / (1000 if source == "timers" else 1))


def test_two_runs_of_pipeline_lines_are_one_step_each() -> None:
    """A log two runs appended to (logs are opened for appending) held each ``steps: N`` line
    twice: "iterations" said 10 for 5 and the median mixed the two runs. A step printed twice is
    one step, its slowest print (as ``tuner-step`` lines of several ranks)."""
    first = [(n, 1.0) for n in range(1, 6)]
    second = [(n, 3.0) for n in range(1, 6)]
    text = "\n".join(
        f"steps: {n} loss: 8.1 iter time (s): {t} samples/sec: {64 / t}" for n, t in first + second
    )
    metrics = parse_log(text, "deepspeed")
    assert metrics.iterations == 5
    assert metrics.step_times_s == (3.0,) * 5
    assert metrics.samples_per_s == pytest.approx(64 / 3.0)


def test_a_throughput_not_above_zero_gives_no_step_time() -> None:
    """``CurrSamplesPerSec=-64`` gave samples/s -64 and, with the batch known, a step time of
    -0.5 s."""
    text = "\n".join(
        f"epoch=0/micro_step={n}/global_step={n}, RunningAvgSamplesPerSec=-64.0, "
        f"CurrSamplesPerSec={v}, MemAllocated=1.2GB, MaxMemAllocated=3.4GB"
        for n, v in enumerate(["-64.0", "0", "-64.0"], start=1)
    )
    metrics = parse_deepspeed(text, global_batch_size=32)
    assert (metrics.step_time_s, metrics.samples_per_s) == (None, None)


def test_two_prints_glued_on_one_line_are_two_steps() -> None:
    """Two ranks' prints written without a line break between them (or a print cut short and
    the next glued to it) read as one record, the first's step lost: the key=value tokens ran on
    into the second print and its ``iter=`` overwrote the first's."""
    tuner = (
        "tuner-step: iter=1 time_s=9 rank=0\n"
        "tuner-step: iter=2 time_s=0.5 rank=0tuner-step: iter=3 time_s=0.7 rank=0\n"
        "tuner-step: iter=4 time_s=0.6 ratuner-step: iter=5 time_s=0.5 rank=0\n"
    )
    metrics = parse_log(tuner, "deepspeed")
    assert metrics.iterations == 5
    assert metrics.step_times_s == (9.0, 0.5, 0.7, 0.6, 0.5)
    pipeline = (
        "steps: 1 loss: 8.1 iter time (s): 9.0 samples/sec: 7.1\n"
        "steps: 2 loss: 8.1 iter time (s): 0.5 samples/sec: 128.0steps: 3 loss: 8.1 iter time "
        "(s): 0.6 samples/sec: 100.0\n"
    )
    metrics = parse_log(pipeline, "deepspeed")
    assert metrics.iterations == 3
    assert metrics.step_times_s == (9.0, 0.5, 0.6)
