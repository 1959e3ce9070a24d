"""Uncertainty from where each term came (tuner.models.uncertainty): catalog terms carry their
held-out error, measured ones their spread, combined over the terms of a figure."""

from __future__ import annotations

import math

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.breakdown import MemoryBreakdown, phase_sigma
from tuner.models.memory.estimate import estimate_memory
from tuner.models.time.estimate import estimate_time
from tuner.models.uncertainty import (
    CATALOG_MEMORY_SIGMA,
    CATALOG_TIME_SIGMA,
    CATALOG_TIME_STACK_SIGMA,
    MEMORY_SIGMA_FLOORS,
    TIME_SIGMA_FLOORS,
    Z_BAND,
    TermSource,
    band,
    combined_sigma,
    inside,
    max_memory_sigma,
)
from tuner.space.probes import RISK_LEVEL, at_risk, fit_probability
from tuner.spec.study import ModelSpec, TrainingSpec

MODEL = ModelSpec(
    num_layers=32, hidden_size=4096, ffn_hidden_size=11008, num_attention_heads=32,
    vocab_size=32000, seq_length=4096, swiglu=True,
)  # fmt: skip
A100 = get_gpu("a100-80gb")
CONFIG = ParallelConfig(tp=2, pp=2, dp=2, micro_batch_size=1, global_batch_size=16,
                        sequence_parallel=True, distributed_optimizer=True)  # fmt: skip


def test_relative_terms_add_as_independent_errors() -> None:
    a, b = TermSource("catalog", 0.1), TermSource("catalog", 0.2)
    got = combined_sigma({"a": 30.0, "b": 10.0}, {"a": a, "b": b})
    assert got == pytest.approx(math.hypot(3.0, 2.0) / 40.0)
    assert combined_sigma({"a": 0.0}, {"a": a}) == 0.0


def test_a_whole_figure_group_counts_once_and_only_where_held() -> None:
    """The fixed memory outside the allocator moves the whole figure by a share, not its own
    bytes: its sd is added once per figure, and not at all where none of its terms is held
    (CPU ranks)."""
    ctx = TermSource("catalog", 0.0, whole=0.1, group="fixed")
    nccl = TermSource("catalog", 0.0, whole=0.1, group="fixed")
    state = TermSource("catalog", 0.0)
    sources = {"ctx": ctx, "nccl": nccl, "w": state}
    assert combined_sigma({"ctx": 1.0, "nccl": 1.0, "w": 98.0}, sources) == pytest.approx(0.1)
    assert combined_sigma({"ctx": 0.0, "nccl": 0.0, "w": 98.0}, sources) == 0.0


def test_the_band_is_log_symmetric_at_the_stated_level() -> None:
    low, high = band(100.0, 0.1)
    assert low == pytest.approx(100 * math.exp(-Z_BAND * 0.1))
    assert high == pytest.approx(100 * math.exp(Z_BAND * 0.1))
    assert low * high == pytest.approx(100.0**2)
    assert inside(high * 0.999, 100.0, 0.1) and not inside(high * 1.001, 100.0, 0.1)


def test_the_catalogs_figures_are_never_under_their_floors() -> None:
    assert all(CATALOG_MEMORY_SIGMA[g] >= f for g, f in MEMORY_SIGMA_FLOORS.items())
    assert all(CATALOG_TIME_SIGMA[g] >= f for g, f in TIME_SIGMA_FLOORS.items())


def test_a_memory_estimate_carries_every_terms_source() -> None:
    m = estimate_memory(MODEL, CONFIG, A100)
    assert m.sigma == pytest.approx(phase_sigma(m.worst, "device"))
    sources = m.to_dict()["sources"]
    assert set(sources) >= {"weights", "activations", "slack", "cuda_context"}
    assert all(s["source"] == "catalog" for s in sources.values())
    # the peak's sd is at least the fixed memory's share of the whole figure
    assert m.sigma >= CATALOG_MEMORY_SIGMA["fixed"]


def test_measured_terms_narrow_the_band() -> None:
    """A term measured on this stack (h35p's framework probe composes them) replaces the
    catalog's held-out error with its own spread: the stated sd shrinks."""
    m = estimate_memory(MODEL, CONFIG, A100)
    measured = TermSource("measured", 0.02, "3 probe runs", whole=0.005, group="fixed")
    probed = MemoryBreakdown(m.stages, (("cuda_context", measured), ("comm_buffers", measured),
                                        ("slack", TermSource("measured", 0.05))))  # fmt: skip
    assert probed.peak == m.peak
    assert probed.sigma < m.sigma / 2
    out = probed.to_dict()
    assert out["sources"]["cuda_context"]["source"] == "measured"
    assert out["sources"]["weights"]["source"] == "catalog"
    assert probed.band_gib()[1] - probed.band_gib()[0] < m.band_gib()[1] - m.band_gib()[0]


def test_the_step_time_carries_its_terms_sources() -> None:
    t = estimate_time(MODEL, TrainingSpec(global_batch_size=16), CONFIG, A100, 8)
    low, high = min(CATALOG_TIME_SIGMA.values()), max(CATALOG_TIME_SIGMA.values())
    # shares of independent groups (under the largest sd) and an unseen stack's own bias
    assert math.hypot(low / 2, CATALOG_TIME_STACK_SIGMA) <= t.sigma
    assert t.sigma <= math.hypot(high, CATALOG_TIME_STACK_SIGMA)
    assert "provenance" not in t.to_dict()
    import dataclasses

    faster = dataclasses.replace(t, provenance=(("compute", TermSource("measured", 0.01)),))
    assert faster.sigma < t.sigma


def test_a_stacks_own_bias_counts_on_the_catalogs_share_only() -> None:
    """A stack's bias moves every catalog term of a step as one (a whole-figure sd on their
    share); terms measured on the stack (the framework probe) already carry it."""
    cat = TermSource("catalog", 0.1)
    sources = {"a": cat, "b": cat}
    assert combined_sigma({"a": 3.0, "b": 1.0}, sources, 0.2) == pytest.approx(
        math.hypot(math.hypot(0.3, 0.1) / 4, 0.2)
    )
    probed = {"a": TermSource("measured", 0.05), "b": cat}
    assert combined_sigma({"a": 3.0, "b": 1.0}, probed, 0.2) == pytest.approx(
        math.hypot(math.hypot(0.15, 0.1) / 4, 0.2 / 4)
    )
    measured = {n: TermSource("measured", 0.05) for n in "ab"}
    assert combined_sigma({"a": 3.0, "b": 1.0}, measured, 0.2) == pytest.approx(
        combined_sigma({"a": 3.0, "b": 1.0}, measured)
    )


def test_probes_and_the_risk_flag_read_the_breakdowns_sd() -> None:
    """A config the fit check passes is still at risk where its own sd leaves at least 1% chance
    of exceeding the GPU: the issue's case, 60.5 GiB predicted on 80 with an unseen stack's sd."""
    assert not at_risk(60.5, 80.0, 0.08)  # the former fixed 8%: a sure fit
    assert at_risk(60.5, 80.0, 0.13)  # a catalog device figure's held-out sd there
    assert 1 - fit_probability(60.5, 80.0, 0.13) >= RISK_LEVEL
    assert not at_risk(30.0, 80.0, 0.13)


def test_the_bound_only_verdicts_sd_bounds_every_breakdown() -> None:
    """MemoryJudge settles a config on bounds with max_memory_sigma: no breakdown states a
    larger sd."""
    for mbs in (1, 2, 4, 8):
        for tp in (1, 2):
            c = ParallelConfig(tp=tp, pp=1, dp=8 // tp, micro_batch_size=mbs,
                               global_batch_size=64)  # fmt: skip
            assert estimate_memory(MODEL, c, A100).sigma <= max_memory_sigma()


def test_a_bounded_slack_share_bounds_the_sd_of_every_figure() -> None:
    """max_memory_sigma(slack_share=r) holds every device figure whose slack is at most r of
    it, whatever the other terms: random figures, figures all in one term, and the shares at
    and just under the bound (where the convex worst case sits)."""
    import random

    from tuner.models.memory.breakdown import PARTS, memory_sources

    sources = memory_sources()
    rng = random.Random(36)
    assert max_memory_sigma(slack_share=1.0) == max_memory_sigma()
    for r in (0.0, 0.01, 0.05, 0.1, 0.12, 0.2, 0.5, 0.9, 1.0):
        bound = max_memory_sigma(slack_share=r)
        assert bound <= max_memory_sigma()
        cases = []
        for _ in range(400):
            parts = {n: rng.random() ** rng.choice((1, 4, 12)) for n in PARTS if n != "slack"}
            rest = sum(parts.values())
            s = r * rng.choice((1.0, rng.random()))  # the slack's share of the figure
            parts["slack"] = s * rest / (1 - s) if s < 1 else 1.0
            cases.append(parts)
        for name in (n for n in PARTS if n != "slack"):  # one term and the most slack allowed
            one = dict.fromkeys(PARTS, 0.0) | {name: 1.0}
            one["slack"] = r / (1 - r) if r < 1 else 1.0
            cases.append(one)
        for parts in cases:
            assert combined_sigma(parts, sources) <= bound * (1 + 1e-12)
    # tight where the slack's share is small: a figure of counted bytes alone sits at the bound
    counted = dict.fromkeys(PARTS, 0.0) | {"weights": 1.0, "cuda_context": 1e-9}
    assert combined_sigma(counted, sources) == pytest.approx(max_memory_sigma(slack_share=0.0))
