"""Megatron-LM / Megatron-DeepSpeed log parsing, over the real fixtures and synthetic lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.logs import JSON_KEYS, parse_log, parse_log_file, parse_megatron, warmup_count
from tuner.logs.megatron import iteration_records, memory_reports
from tuner.outcome import Outcome

MB = 1024.0

# Expected figures, read off the files by hand. Step times: iterations sorted by number, the
# first max(1, n // 5) dropped (at least one kept), median of the rest.
FIXTURES: dict[str, dict[str, object]] = {
    "megatron_iter_NVIDIA-Megatron-LM-756.log": dict(
        outcome=Outcome.OK,
        iterations=5,
        # iterations 2, 3, 71, 72, 73; drop 2 (5630.1): median of 5410.6 5361.6 5470.7 5829.9
        step_time_s=(5410.6 + 5470.7) / 2 / 1000,
        # drop 231.9: median of 241.4 243.6 238.7 224.0
        tflops_per_gpu=(238.7 + 241.4) / 2,
        tflops_includes_recompute=False,
        peak_memory_gib=54250.98583984375 / MB,
        peak_reserved_gib=61480.0 / MB,
        samples_per_s=128 / ((5410.6 + 5470.7) / 2 / 1000),
    ),
    "megatron_iter_legacy_epfLLM-Megatron-LLM-11.log": dict(
        outcome=Outcome.OK,
        iterations=4,
        step_time_s=89.0752,  # drop 86545.2; median of 87871.6 89474.8 89075.2
        tflops_per_gpu=None,
        peak_memory_gib=None,
        samples_per_s=1024 / 89.0752,
    ),
    "megatron_iter_mem_us_timestamp_NVIDIA-Megatron-LM-PR5662.log": dict(
        outcome=Outcome.OK,
        iterations=1,
        step_time_s=0.744,  # a single record is kept
        peak_memory_gib=5670.39 / MB,
        peak_reserved_gib=6406.0 / MB,
        samples_per_s=16 / 0.744,
    ),
    "megatron_2020_legacy_NVIDIA-Megatron-LM-60.log": dict(
        outcome=Outcome.OK,
        iterations=2,
        step_time_s=1.9939,  # iteration 5 (16491.5) is warm-up
        peak_memory_gib=12606.06201171875 / MB,  # "after 5 iterations memory (MB)" form
        peak_reserved_gib=17482.0 / MB,
        samples_per_s=None,  # no global batch size field in 2020
    ),
    "megatron_startup_and_iter_2022_NVIDIA-nccl-743.log": dict(
        outcome=Outcome.OK,
        iterations=2,
        step_time_s=0.1234,  # iteration 10 (356.2, all skipped, no loss key) is warm-up
        peak_memory_gib=6245.0361328125 / MB,
        peak_reserved_gib=6554.0 / MB,
        samples_per_s=4 / 0.1234,
    ),
    "megatron_deepspeed_ds_new_timers_argonne-lcf-deprecated-notes.log": dict(
        outcome=Outcome.OK,
        iterations=2,
        step_time_s=20.2983,  # iteration 1 (25849.1) is warm-up
        tflops_per_gpu=49.17,
        tflops_includes_recompute=True,  # Megatron-DeepSpeed "TFLOPs:"
        samples_per_s=4.729,  # logged "samples per second"
        peak_memory_gib=41299.50146484375 / MB,
        peak_reserved_gib=46764.0 / MB,
    ),
    "megatron_deepspeed_see_memory_usage_bigscience-Megatron-DeepSpeed-356.log": dict(
        outcome=Outcome.NO_METRICS,
        iterations=0,
        step_time_s=None,
        peak_memory_gib=0.0,  # "Max_MA 0.0 GB" before the model is built
        peak_reserved_gib=0.0,
    ),
    "megatron_fork_theoretical_mem_prefixed_flagos-FlagScale-PR454.log": dict(
        outcome=Outcome.NO_METRICS,
        iterations=0,
        step_time_s=None,
        theoretical_memory_gib=55972.29 / MB,
    ),
    "megatron_num_params_NVIDIA-Megatron-LM-374.log": dict(
        outcome=Outcome.NO_METRICS, iterations=0, step_time_s=None, peak_memory_gib=None
    ),
}


def test_every_megatron_fixture_has_expectations(fixtures_dir: Path) -> None:
    present = {p.name for p in fixtures_dir.glob("megatron_*.log")}
    assert present == set(FIXTURES), "add the new fixture's expected figures to FIXTURES"


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_figures(fixtures_dir: Path, name: str) -> None:
    metrics = parse_log_file(fixtures_dir / name)
    for field, expected in FIXTURES[name].items():
        actual = getattr(metrics, field)
        if isinstance(expected, float):
            assert actual == pytest.approx(expected, rel=1e-9), field
        else:
            assert actual == expected, field


# see_memory_usage is a DeepSpeed line: the Megatron parser alone does not read it.
@pytest.mark.parametrize("name", sorted(n for n in FIXTURES if "see_memory_usage" not in n))
def test_fixture_same_figures_when_framework_forced(fixtures_dir: Path, name: str) -> None:
    text = (fixtures_dir / name).read_text()
    forced = parse_log(text, "megatron")
    assert forced.step_time_s == parse_log(text).step_time_s
    assert forced.peak_memory_gib == parse_log(text).peak_memory_gib


ITER_015 = (
    " [2025-01-02 03:04:05] iteration       {i}/      30 | consumed samples:         {c} |"
    " elapsed time per iteration (ms): {ms} | throughput per GPU (TFLOP/s/GPU): {tf} |"
    " learning rate: 1.000000E-04 | global batch size:    32 | lm loss: 7.1E+00 |"
    " loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 |"
    " number of nan iterations:   0 |"
)


def _iteration(i: int, ms: float, tf: float = 100.0) -> str:
    return ITER_015.format(i=i, c=i * 32, ms=ms, tf=tf)


def test_default_warmup_drops_twenty_percent() -> None:
    times = [9000.0, 5000.0] + [1000.0 + i for i in range(8)]
    text = "\n".join(_iteration(i + 1, ms) for i, ms in enumerate(times))
    metrics = parse_log(text)
    assert metrics.iterations == 10
    assert metrics.step_times_s == tuple(t / 1000 for t in times)
    # 10 records: drop 2 (9000, 5000), median of 1000..1007
    assert metrics.step_time_s == pytest.approx(1.0035)
    assert metrics.samples_per_s == pytest.approx(32 / 1.0035)
    assert metrics.tflops_includes_recompute is False


def test_explicit_warmup_and_at_least_one_kept() -> None:
    text = "\n".join(_iteration(i, ms) for i, ms in [(1, 5000.0), (2, 3000.0), (3, 1000.0)])
    assert parse_log(text, warmup=0).step_time_s == pytest.approx(3.0)
    assert parse_log(text, warmup=2).step_time_s == pytest.approx(1.0)
    assert parse_log(text, warmup=50).step_time_s == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("n", "warmup", "dropped"),
    [(0, None, 0), (1, None, 0), (2, None, 1), (9, None, 1), (10, None, 2), (30, 5, 5), (3, 9, 2)],
)
def test_warmup_count(n: int, warmup: int | None, dropped: int) -> None:
    assert warmup_count(n, warmup) == dropped


def test_rank_prefixes_and_microsecond_timestamp() -> None:
    text = "\n".join(
        [
            "[rank7]: " + _iteration(1, 2000.0).replace("03:04:05]", "03:04:05.123456]"),
            "[default7]:" + _iteration(2, 1500.0),
            "7: " + _iteration(3, 1400.0),
        ]
    )
    metrics = parse_log(text)
    assert metrics.iterations == 3
    assert metrics.step_time_s == pytest.approx(1.45)


def test_iteration_glued_to_memory_report_and_next_print() -> None:
    glued = (
        _iteration(1, 3000.0, 90.0)
        + "[Rank 0] (after 1 iterations) memory (MB) | allocated: 1024.5 | max allocated:"
        " 40960.0 | reserved: 45000.0 | max reserved: 46080.0building GPT model ..."
    )
    text = "\n".join(
        [
            glued,
            "[Rank 3] (after 1 iterations) memory (MB) | allocated: 900.00 | max allocated: "
            "51200.00 | reserved: 52000.00 | max reserved: 53248.00",
            _iteration(2, 2000.0, 120.0) + _iteration(3, 2200.0, 110.0),
        ]
    )
    records = iteration_records(glued)
    assert len(records) == 1
    assert "allocated" not in records[0].fields
    metrics = parse_log(text)
    assert metrics.iterations == 3
    assert metrics.step_time_s == pytest.approx(2.1)
    assert metrics.tflops_per_gpu == pytest.approx(115.0)
    assert metrics.peak_memory_gib == pytest.approx(50.0)  # max over ranks 0 and 3
    assert metrics.peak_reserved_gib == pytest.approx(52.0)


def test_an_iteration_printed_twice_is_one_step() -> None:
    """Two ranks' prints of the same iterations, spliced on one line or interleaved on lines
    of their own: "iters" said 10 for 5, and each step time counted twice."""
    times = [3000.0, 1000.0, 1010.0, 1020.0, 1030.0]
    prints = [_iteration(i + 1, ms) for i, ms in enumerate(times)]
    spliced = "\n".join(p + p for p in prints)
    interleaved = "\n".join(prints[:3] + prints[1:3] + prints[3:])
    for text in (spliced, interleaved):
        metrics = parse_log(text)
        assert metrics.iterations == 5
        assert metrics.step_times_s == tuple(t / 1000 for t in times)


@pytest.mark.parametrize("ms", ["nan", "-1500.0", "0.0", "inf"])
def test_a_step_time_that_is_no_number_above_zero_is_said(ms: str) -> None:
    """A broken timer's ``elapsed time per iteration (ms): nan`` (or negative, zero) read "no
    per-iteration step time in the log", as if the log printed none."""
    text = "\n".join(_iteration(i, 1000.0).replace("1000.0", ms, 1) for i in (1, 2, 3))
    assert f": {ms} |" in text
    metrics = parse_log(text)
    assert (metrics.outcome, metrics.iterations, metrics.step_time_s) == ("no_metrics", 3, None)
    said = f"elapsed time per iteration (ms) is '{ms}' at iteration 1: not a number above zero"
    assert metrics.reason == f"no per-iteration step time in the log: {said}"


def test_truncated_last_field_is_not_read() -> None:
    line = " iteration        4/     100 | consumed samples:          256 | elapsed time per it"
    assert iteration_records(line)[0].step_time_s is None
    assert parse_log(line).outcome is Outcome.NO_METRICS


def test_memory_report_forms() -> None:
    old = "after 5 iterations memory (MB) | allocated: 1.0 | max allocated: 2048.0 | reserved: 3"
    nemo = (
        "[Rank 0] (after 1 iterations) memory (GB) | mem-allocated-gigabytes: 51.072 |"
        " mem-max-allocated-gigabytes: 194.41 | mem-max-reserved-gigabytes: 196.0"
    )
    assert memory_reports(old)[0].max_allocated_gib == pytest.approx(2.0)
    assert memory_reports(old)[0].rank is None
    # GB here is 1e9 bytes (Megatron-Bridge v0.6.0 train_utils.py report_memory: bytes / 1.0e9)
    assert memory_reports(nemo)[0].max_allocated_gib == pytest.approx(194.41e9 / 2**30)
    assert memory_reports(nemo)[0].max_reserved_gib == pytest.approx(196.0e9 / 2**30)


def test_theoretical_memory_weight_only_and_full() -> None:
    weight_only = "Theoretical memory footprints: weight and optimizer=57438.81 MB"
    full = (
        "Theoretical memory footprints: weight and optimizer=35695.42 MB, "
        "activation=86554.12 MB, total=122249.54 MB"
    )
    assert parse_megatron(weight_only).theoretical_memory_gib == pytest.approx(57438.81 / MB)
    assert parse_megatron(full).theoretical_memory_gib == pytest.approx(122249.54 / MB)


def test_to_json_has_exactly_the_contract_keys() -> None:
    metrics = parse_log(_iteration(1, 1000.0))
    obj = metrics.to_json("run.log")
    assert tuple(obj) == JSON_KEYS
    assert obj["file"] == "run.log"
    assert obj["outcome"] == "ok"
    assert json.loads(json.dumps(obj)) == obj


def _line(
    i: int, loss: str = "2.0E+00", scale: str = "1.0", skipped: int = 0, nan: int = 0
) -> str:
    return (
        f" iteration {i:8d}/      10 | elapsed time per iteration (ms): 1000.0 | "
        f"lm loss: {loss} | loss scale: {scale} | number of skipped iterations: {skipped:3d} | "
        f"number of nan iterations: {nan:3d} |"
    )


@pytest.mark.parametrize(
    ("changed", "reason"),
    [
        ({"loss": "NAN"}, "lm loss is NAN at iteration 4"),
        ({"loss": "INF"}, "lm loss is INF at iteration 4"),
        ({"nan": 2}, "2 nan iteration(s) logged at iteration 4"),
        (
            {"skipped": 1},
            "1 skipped iteration(s) logged at iteration 4, loss scale 1: inf/NaN gradients",
        ),
    ],
)
def test_a_diverged_run_is_not_a_measurement(changed: dict[str, object], reason: str) -> None:
    text = "\n".join(_line(i, **changed) if i == 4 else _line(i) for i in range(1, 6))  # type: ignore[arg-type]
    for metrics in (parse_log(text), parse_megatron(text), parse_log(text, "deepspeed")):
        assert (metrics.outcome, metrics.reason) == (Outcome.DIVERGED, reason)
        assert metrics.step_time_s == 1.0  # the figures stay, the outcome says they mean nothing
    assert Outcome.DIVERGED.launched


def test_fp16_loss_scale_backoff_and_warmup_nans_are_not_divergence() -> None:
    # fp16: the dynamic loss scaler skips steps while it backs off (real: nccl-743 fixture)
    text = "\n".join(_line(i, scale="16384.0", skipped=1) for i in range(1, 6))
    assert parse_log(text).outcome is Outcome.OK
    # nan/skipped counts in the warm-up records are dropped with them
    text = "\n".join(_line(i, nan=int(i == 1), skipped=int(i == 1)) for i in range(1, 6))
    assert parse_log(text).outcome is Outcome.OK
    # Megatron's NaN check (--check-for-nan-in-loss-and-grad) ending the run
    check = (
        "Traceback (most recent call last):\n"
        "AssertionError: Rank 3: found NaN in local grad norm in backward pass before "
        "data-parallel communication collective. Device: 3, node: gpu001"
    )
    metrics = parse_log(_line(1) + "\n" + check, exit_codes=[1])
    assert metrics.outcome is Outcome.DIVERGED
    assert metrics.reason is not None and metrics.reason.startswith("found NaN in local grad norm")
