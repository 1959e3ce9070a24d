"""The cost of a study measured through proxies (tuner.space.proxy_cost), on the Llama-3-70B /
16 x 8 H100 scenario of issue 33."""

from __future__ import annotations

import pytest

from tests.test_cost import scenario
from tuner.space import proxy_cost
from tuner.space.cost import budget_cost, trial_cost
from tuner.space.enumerate import enumerate_space, study_gpu
from tuner.space.proxy_cost import Costing, proxy_budget
from tuner.spec.file import study_from_mapping


def _budget(proxy: object, n_trials: int = 8) -> proxy_cost.ProxyBudget:
    spec = study_from_mapping(scenario(proxy=proxy))
    ranked = enumerate_space(spec).ranked()
    steps = [c.time.step if c.time else None for c in ranked]
    cost = Costing(spec, study_gpu(spec))
    return proxy_budget(spec, [c.config for c in ranked], steps, cost, n_trials)


def test_without_proxies_the_budget_is_the_plain_one() -> None:
    spec = study_from_mapping(scenario(proxy=False))
    ranked = enumerate_space(spec).ranked()
    plain = budget_cost([trial_cost(spec, c.time.step if c.time else None) for c in ranked], 8)
    found = _budget(False)
    assert found.as_proxy == found.confirmations == found.worst_confirmations == 0
    assert found.expected_node_hours == pytest.approx(plain.expected_node_hours)
    assert found.worst_node_hours == pytest.approx(plain.worst_node_hours)


def test_past_the_walk_the_full_scale_worst_bounds_the_proxies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    walked = _budget(True)
    assert walked.as_proxy == 8 and walked.confirmations == 2
    assert walked.worst_confirmations == 4
    monkeypatch.setattr(proxy_cost, "WORST_WALK", 0)  # no proxy worked out for the worst case
    bound = _budget(True)
    assert bound.launches.worst_node_hours >= walked.launches.worst_node_hours
    assert bound.launches.worst_node_hours == pytest.approx(_budget(False).worst_node_hours)
    assert bound.expected_node_hours == pytest.approx(walked.expected_node_hours)
    assert bound.confirm_worst_node_hours >= walked.confirm_worst_node_hours  # an upper bound


def test_a_proxy_trial_has_the_full_configs_limit_and_fewer_nodes() -> None:
    spec = study_from_mapping(scenario(proxy=True))
    first = enumerate_space(spec).ranked()[0]
    step = first.time.step if first.time else None
    k = Costing(spec, study_gpu(spec))(first.config, step)
    assert k.proxy is not None and k.proxy.nodes < k.full.nodes == 16
    assert k.proxy.limit_minutes == k.full.limit_minutes and k.launch is k.proxy
    assert (
        Costing(study_from_mapping(scenario()), study_gpu(spec))(first.config, step).proxy is None
    )
