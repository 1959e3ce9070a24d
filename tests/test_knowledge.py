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


def _one_launch_at_a_time(value: np.ndarray, cov: np.ndarray, launches: np.ndarray, noise: float,
                          scale: float, dof: int | None) -> np.ndarray:  # fmt: skip
    """The definition knowledge_gradient computes for every launch at once: per launch, each
    line's bound worked out in full, the kept lines' envelope_mean."""
    out = []
    lead = int(np.argmax(value))
    top = float(value[lead])
    for x in launches:
        b = scale * cov[:, x] / np.sqrt(cov[x, x] + noise**2)
        bound = improvement(top - value, np.maximum(np.abs(b - b[lead]), 1e-12), 0.0, dof)
        kept = bound > knowledge.NEGLIGIBLE_GAIN / len(value)
        kept[lead] = True
        out.append(max(envelope_mean(value[kept], b[kept], dof) - top, 0.0))
    return np.array(out)


@pytest.mark.parametrize("dof", [None, 3, 5, 60, 410])
def test_every_launch_at_once_equals_one_launch_at_a_time(dof: int | None) -> None:
    """Random beliefs (some lines far behind, a measured incumbent without doubt, equal
    values, a scale as small as a settled study's): the same values as the definition, each
    launch alone, to rounding; and some launches are worth something."""
    rng = np.random.default_rng(7)
    for n, scale in ((2, 1.0), (40, 1.3), (150, 0.05)):
        rows = rng.normal(size=(n, 12))
        cov = rows @ rows.T / 12 * 0.004
        cov[:, -1] = cov[-1, :] = 0.0
        value = -np.abs(rng.normal(size=n)) * rng.choice([0.02, 0.2], size=n)
        value[n // 2] = value[0]
        launches = rng.choice(n - 1, size=max(1, n // 2), replace=False)
        fast = knowledge_gradient(value, cov, launches, 0.03, scale, dof)
        slow = _one_launch_at_a_time(value, cov, launches, 0.03, scale, dof)
        assert fast == pytest.approx(slow, rel=1e-9, abs=1e-15)
        assert (slow > 0).any()


@pytest.mark.parametrize("dof", [None, 5, 60, 410])
def test_the_moment_screen_never_rules_out_a_line_the_bound_keeps(dof: int | None) -> None:
    """Wherever the expected improvement of the gap exceeds what is needed, the screen leaves
    the line open; and it rules out most of the lines far behind (else it buys nothing)."""
    rng = np.random.default_rng(11)
    gap = np.abs(rng.normal(size=20_000)) * 10.0 ** rng.uniform(-4, 0, 20_000)
    spread = 10.0 ** rng.uniform(-6, -1, 20_000)
    need = 1e-7 / 200
    exact = improvement(gap, spread, 0.0, dof) > need
    open_ = knowledge._may_exceed(gap, spread, dof, need)
    assert open_[exact].all()
    assert (~open_).sum() > 0.5 * (~exact).sum()
