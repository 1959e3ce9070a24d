"""The steady-state estimator (tuner.logs.steady): its coverage on synthetic iteration series.

Each series has a known steady mean: iteration times are ``1 + AR(1) noise + a spike every
``period`` iterations`` (garbage collection, logging), multiplied by a warm-up factor that decays
over the first iterations. The estimator is checked after every record and stopped at its first
crossing of the stated precision, as the study loop does; its final interval must hold the true
mean in at least 90 % of seeds in every regime. A plain interval over the iterations after
``warmup_iters``, stopped at its first crossing, must fail the same test in some regime.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from tuner.logs.steady import Record, autocorrelation_time, estimate, t_quantile

PRECISION = 0.02
MIN_BATCHES = 4
WARMUP_ITERS = 5
CAP = 240
SEEDS = 150
REGIMES = {
    "ar0.7, spike +50% every 10": dict(phi=0.7, sigma=0.02, period=10, spike=0.5),
    "ar0.7, spike +50% every 7": dict(phi=0.7, sigma=0.02, period=7, spike=0.5),
    "ar0.7, spike +100% every 13": dict(phi=0.7, sigma=0.02, period=13, spike=1.0),
    "ar0.7 1%, spike +30% every 20": dict(phi=0.7, sigma=0.01, period=20, spike=0.3),
}


def series(seed: int, *, phi: float, sigma: float, period: int, spike: float) -> tuple[
    list[float], float
]:  # fmt: skip
    """``CAP`` iteration times and their true steady mean."""
    rng = random.Random(seed)
    offset, x, out = rng.randrange(period), 0.0, []
    for i in range(1, CAP + 1):
        x = phi * x + rng.gauss(0.0, sigma)
        t = 1.0 + x + (spike if i % period == offset else 0.0)
        out.append(t * (1 + 2.0 * math.exp(-(i - 1) / 1.5)))  # compile, allocator, comms
    return out, 1.0 + spike / period


def ours(times: list[float]) -> tuple[float, float]:
    """(mean, half-width) where the estimator first says the step time is known, or at CAP."""
    records: list[Record] = []
    for i, t in enumerate(times, start=1):
        records.append(Record(iteration=i, step_s=t))
        found = estimate(records, warmup_iters=WARMUP_ITERS, precision=PRECISION,
                         min_batches=MIN_BATCHES)  # fmt: skip
        if found.precise:
            break
    assert found.mean_s is not None and found.half_width_s is not None
    return found.mean_s, found.half_width_s


def naive(times: list[float]) -> tuple[float, float]:
    """A plain t interval over the iterations after warmup_iters, at its first crossing."""
    for n in range(WARMUP_ITERS + 2, len(times) + 1):
        values = times[WARMUP_ITERS:n]
        mean = statistics.fmean(values)
        # the sample standard deviation in floats (statistics.stdev's exact fractions cost the
        # suite 15 s here; the stops and the coverage are the same)
        sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
        half = t_quantile(len(values) - 1) * sd / math.sqrt(len(values))
        if half <= PRECISION * mean:
            break
    return mean, half


def coverage(rule: object, regime: dict[str, float]) -> float:
    hits = 0
    for seed in range(SEEDS):
        times, true = series(seed, **regime)  # type: ignore[arg-type]
        mean, half = rule(times)  # type: ignore[operator]
        hits += abs(mean - true) <= half
    return hits / SEEDS


@pytest.mark.slow
def test_batch_means_hold_their_coverage_where_a_first_crossing_plain_interval_does_not() -> None:
    ours_cov = {name: coverage(ours, regime) for name, regime in REGIMES.items()}
    naive_cov = {name: coverage(naive, regime) for name, regime in REGIMES.items()}
    assert min(ours_cov.values()) >= 0.88, ours_cov
    assert min(naive_cov.values()) < 0.80, naive_cov


def test_a_clean_series_is_known_after_the_warm_up_and_min_batches() -> None:
    times = [3.0, 1.8, 1.2] + [1.0 + 0.002 * ((-1) ** i) for i in range(40)]
    records = [Record(iteration=i + 1, step_s=t) for i, t in enumerate(times)]
    found = estimate(records, warmup_iters=1, precision=PRECISION, min_batches=MIN_BATCHES)
    assert found.warmup_records == 3  # floor 1, then two detected from the times
    assert found.precise and found.batches >= MIN_BATCHES
    assert found.mean_s == pytest.approx(1.0, abs=0.002)


def test_too_few_batches_is_not_known_however_tight() -> None:
    records = [Record(iteration=i, step_s=1.0) for i in range(1, 4)]
    found = estimate(records, warmup_iters=0, precision=PRECISION, min_batches=MIN_BATCHES)
    assert not found.enough and not found.precise


def test_records_of_several_iterations_weigh_by_their_iterations() -> None:
    # a log-interval of 10: each record is one batch mean already
    records = [Record(iteration=10 * k, step_s=1.0 + 0.01 * (k % 2)) for k in range(1, 13)]
    found = estimate(records, warmup_iters=10, precision=PRECISION, min_batches=MIN_BATCHES)
    assert found.steady_iterations == 110
    assert found.precise


def test_autocorrelation_time_of_independent_and_correlated_series() -> None:
    rng = random.Random(1)
    iid = [rng.gauss(0, 1) for _ in range(600)]
    x, ar = 0.0, []
    for _ in range(600):
        x = 0.8 * x + rng.gauss(0, 1)
        ar.append(x)
    assert autocorrelation_time(iid) < 1.5
    assert autocorrelation_time(ar) > 4  # (1 + 0.8) / (1 - 0.8) = 9 in theory
