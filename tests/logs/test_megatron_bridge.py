"""Megatron-Bridge's log lines: real excerpts, parsed by the Megatron parser.

``REAL_2025`` is the training output pasted in NVIDIA-NeMo/Megatron-Bridge pull request #841
("fix: exit profiler context", 2025-10-02; the PR body wraps it at 80 columns, the lines are
rejoined here): the iteration line, the Megatron-LM-style MB memory report Bridge printed then,
and the ``Step Time`` line. ``V060`` is the v0.6.0 shape of the same lines, laid out by the format
strings of src/megatron/bridge/training/utils/train_utils.py at tag v0.6.0 (51885cf1):
``training_log`` (the ``Step Time : ...MODEL_TFLOP/s/GPU`` print_rank_0, the iteration line, the
``[Rank N] (after K iterations) memory (GB)`` line) and ``report_memory`` (``mem-*-gigabytes``,
bytes / 1e9, five significant digits); the same keys Bridge's own
scripts/performance/utils/evaluate.py reads (``mem-max-allocated-gigabytes``, ``Step Time``,
``GPU utilization``).
"""

from __future__ import annotations

import pytest

from tuner.logs import parse_log
from tuner.outcome import Outcome

REAL_2025 = """\
 [2025-10-02 22:52:07] iteration       10/      50 | consumed samples:         5120 | \
elapsed time per iteration (ms): 13212.7 | learning rate: 3.000000E-04 | global batch \
size:   512 | lm loss: 4.474437E+00 | loss scale: 1.0 | grad norm: 0.704 | number of s\
kipped iterations:   0 | number of nan iterations:   0 |
[Rank 0] (after 10 iterations) memory (MB) | allocated: 11908.05029296875 | max alloca\
ted: 12712.43603515625 | reserved: 12954.0 | max reserved: 12954.0
Step Time : 14.26s GPU utilization: 58.2TFLOP/s/GPU
 [2025-10-02 22:54:30] iteration       20/      50 | consumed samples:        10240 | \
elapsed time per iteration (ms): 14260.3 | learning rate: 2.604594E-04 | global batch \
size:   512 | lm loss: 8.797448E-02 | loss scale: 1.0 | grad norm: 0.170 | number of s\
kipped iterations:   0 | number of nan iterations:   0 |
"""


def _v060(iteration: int, step_s: float, tflops: float, *, throughput: bool) -> str:
    line = (
        f" [2026-08-20 10:00:{iteration:02d}] iteration {iteration:8d}/{20:8d} |"
        f" consumed samples: {iteration * 128:12d} |"
        f" elapsed time per iteration (ms): {step_s * 1000:.1f} |"
    )
    if throughput:
        line += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    line += (
        " learning rate: 2.999999E-04 | global batch size:   128 | lm loss: 7.123456E+00 |"
        " loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 |"
        " number of nan iterations:   0 |"
    )
    step = f"Step Time : {step_s:.2f}s GPU utilization: {tflops:.1f}MODEL_TFLOP/s/GPU"
    return f"{step}\n{line}\n"


MEMORY_V060 = (
    "[Rank 0] (after 1 iterations) memory (GB) | mem-allocated-gigabytes: 41.37 |"
    " mem-active-gigabytes: 41.37 | mem-inactive-gigabytes: 1.2204 |"
    " mem-reserved-gigabytes: 72.142 | mem-max-allocated-gigabytes: 66.713 |"
    " mem-max-active-gigabytes: 66.713 | mem-max-inactive-gigabytes: 9.8713 |"
    " mem-max-reserved-gigabytes: 72.142 | mem-alloc-retires: 0 | mem-allocated-count: 4210\n"
)


def test_the_2025_excerpt_parses() -> None:
    metrics = parse_log(REAL_2025, "megatron-bridge", warmup=0)
    assert metrics.outcome is Outcome.OK
    assert metrics.iterations == 2
    assert metrics.step_times_s == pytest.approx((13.2127, 14.2603))
    assert metrics.peak_memory_gib == pytest.approx(12712.43603515625 / 1024)
    assert metrics.peak_reserved_gib == pytest.approx(12954.0 / 1024)
    # the Step Time line stands in for the throughput the iteration line leaves out; it came
    # before iteration 20, so only iteration 20 has one
    assert metrics.tflops_per_gpu == pytest.approx(58.2)


def test_v060_lines_memory_in_decimal_gigabytes() -> None:
    text = "".join(_v060(i, 1.5 + 0.01 * i, 400.0 - i, throughput=True) for i in range(1, 6))
    metrics = parse_log(text + MEMORY_V060, "megatron-bridge", warmup=1)
    assert metrics.outcome is Outcome.OK
    assert metrics.iterations == 5
    assert metrics.step_time_s == pytest.approx(1.535)  # median of iterations 2..5
    assert metrics.tflops_per_gpu == pytest.approx(396.5)  # the iteration line's own figure
    assert metrics.peak_memory_gib == pytest.approx(66.713e9 / 2**30)
    assert metrics.peak_reserved_gib == pytest.approx(72.142e9 / 2**30)


def test_step_time_line_gives_the_throughput_when_the_iteration_line_has_none() -> None:
    text = "".join(_v060(i, 2.0, 300.0 + i, throughput=False) for i in range(1, 4))
    metrics = parse_log(text, "megatron-bridge", warmup=1)
    assert metrics.tflops_per_gpu == pytest.approx(302.5)
    assert parse_log(text, "megatron-bridge").step_time_s == pytest.approx(2.0)
