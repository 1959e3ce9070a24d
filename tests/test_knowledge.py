"""The knowledge gradient of correlated beliefs (tuner.search.knowledge), on small fakes."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.search import knowledge
from tuner.search.knowledge import envelope_mean, knowledge_gradient
from tuner.search.value import improvement, pick


@pytest.mark.parametrize("dof", [None, 3, 5])
def test_two_lines_give_the_expected_improvement_of_their_gap(dof: int | None) -> None:
    """A config and the incumbent alone: the value of measuring the config is the expected
    improvement of the gap, what stop rule 2 reads (tuner.search.value.improvement)."""
    for gap, spread in ((0.1, 0.2), (0.5, 0.1), (-0.2, 0.3)):
        mean = envelope_mean(np.array([0.0, -gap]), np.array([0.0, spread]), dof)
        ei = float(improvement(np.array([gap]), np.array([spread]), 0.0, dof)[0])
        assert mean == pytest.approx(ei, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("dof", [None, 4])
def test_the_envelope_mean_equals_a_large_sample(dof: int | None) -> None:
    """Six lines, some never on top, two of equal slope: the segments' sum against the mean of
    the maximum over half a million seeded draws."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=6)
    b = np.append(rng.normal(size=5), 0.0)
    b[3] = b[1]  # equal slopes: the higher line wins
    draws = rng.standard_normal(500_000) if dof is None else rng.standard_t(dof, 500_000)
    sampled = float(np.max(a[:, None] + b[:, None] * draws[None, :], axis=0).mean())
    assert envelope_mean(a, b, dof) == pytest.approx(sampled, abs=0.006)


def test_a_launch_that_also_settles_a_likelier_config_is_worth_more() -> None:
    """Configs x and z alike (the same belief, its own figure's expected improvement the same)
    but x shares its doubt with y, a config believed closer to the incumbent: measuring x also
    says whether y beats it, so it is worth more, and the sampler's choice takes x where
    ranking by the figure's own expected improvement cannot tell them apart."""
    value = np.array([0.0, -0.10, -0.02, -0.10])  # incumbent, x, y, z (minus log step)
    cov = np.array([
        [0.0, 0.0, 0.0, 0.0],
        [0.0, 0.010, 0.009, 0.0],
        [0.0, 0.009, 0.010, 0.0],
        [0.0, 0.0, 0.0, 0.010],
    ])  # fmt: skip
    kg = knowledge_gradient(value, cov, np.array([1, 3]), noise=0.03, scale=1.0, dof=None)
    assert kg[0] > 1.5 * kg[1] > 0
    mu, sd = -value[1:], np.sqrt(np.diag(cov)[1:])  # x, y, z as the sampler holds them
    own = improvement(mu, sd, 0.0, None)
    assert own[0] == own[2]
    cost = np.array([1.0, 50.0, 1.0])  # y costs too much to be the launch
    gain = np.zeros(3)
    gain[[0, 2]] = kg
    gain[1] = float(knowledge_gradient(value, cov, np.array([2]), 0.03, 1.0, None)[0])
    chosen, _ = pick(mu, sd, sd, cost, 0.0, None, gain)
    assert chosen.index == 0
    _, ties = pick(mu, sd, sd, cost, 0.0, None)
    assert list(ties) == [0, 2]


@pytest.mark.parametrize("dof", [None, 4])
def test_leaving_out_the_lines_that_cannot_matter_changes_nothing(
    dof: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """120 correlated alternatives, some far behind: the value with the lines whose bound is
    negligible left out equals the value over every line, to that bound."""
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(120, 30))
    cov = rows @ rows.T / 30 * 0.004
    value = -np.abs(rng.normal(size=120)) * 0.2
    pruned = knowledge_gradient(value, cov, np.arange(120), 0.03, 1.2, dof)
    monkeypatch.setattr(knowledge, "NEGLIGIBLE_GAIN", 0.0)
    whole = knowledge_gradient(value, cov, np.arange(120), 0.03, 1.2, dof)
    assert np.abs(pruned - whole).max() <= knowledge.NEGLIGIBLE_GAIN + 1e-7
    assert (whole > 0).all()
