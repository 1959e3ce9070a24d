"""Megatron's data-parallel side of the step-time model: what the gradient sync leaves exposed."""

from __future__ import annotations

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.rates import catalog_rates
from tuner.models.time.dp import (
    MEGATRON_BUCKET_PARAMS,
    MEGATRON_GRAD_BYTES,
    dp_megatron,
    megatron_bucket_params,
)

RATES = catalog_rates(get_gpu("h100-sxm-80gb"), "bf16")


def test_megatron_core_buckets_grow_with_the_data_parallel_size() -> None:
    assert megatron_bucket_params(8) == MEGATRON_BUCKET_PARAMS
    assert megatron_bucket_params(40) == MEGATRON_BUCKET_PARAMS
    assert megatron_bucket_params(512) == pytest.approx(512e6)


@pytest.mark.parametrize("dp", [8, 64, 512])
def test_the_last_bucket_stays_exposed_when_the_backward_hides_the_rest(dp: int) -> None:
    """Windows far longer than the whole sync: only the last bucket's reduce-scatter and
    all-gather show, and at DP 512 that bucket holds 512M parameters, not 40M."""
    config = ParallelConfig(tp=4, dp=dp, micro_batch_size=1, global_batch_size=4 * dp,
                            distributed_optimizer=True)  # fmt: skip
    bw, psi = 100e9, 4e9
    bucket = (dp - 1) / dp * megatron_bucket_params(dp) / bw
    expected = bucket * MEGATRON_GRAD_BYTES + bucket * RATES.elem
    assert dp_megatron(config, psi, RATES, bw, 0.0, (10.0, 10.0)) == pytest.approx(expected)
