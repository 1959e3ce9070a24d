"""The cost of a study measured through proxies (tuner.space.proxy_cost), on the Llama-3-70B /
16 x 8 H100 scenario of issue 33."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from tests.test_cost import scenario
from tuner.outcome import Outcome
from tuner.search.sampler import ModelGuidedSampler
from tuner.space import proxy_cost
from tuner.space.cost import budget_cost, trial_cost
from tuner.space.enumerate import enumerate_space, study_gpu
from tuner.space.proxy_cost import (
    Costing,
    LaunchScale,
    launch_cost,
    launch_node_hours,
    proxy_budget,
)
from tuner.space.shorten import shorten
from tuner.spec.file import study_from_mapping
from tuner.study.budget import node_hour_refusal


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


def test_a_proxy_launch_costs_its_own_iterations_on_its_own_nodes() -> None:
    # a limit far past the cap: the worst case is start-up plus train_iters at the launch's step
    spec = study_from_mapping(scenario(proxy=True, trial_timeout_min=10_000))
    scale = LaunchScale(nodes=4, step_ratio=0.5, dp=2)
    cost = launch_cost(spec, 60.0, scale)
    startup, iters = spec.search.startup_min, spec.launch.train_iters
    assert cost.nodes == 4 and cost.limit_minutes == trial_cost(spec, 60.0).limit_minutes
    assert cost.worst_node_hours == pytest.approx((startup + iters * 30.0 / 60) * 4 / 60)
    useful = trial_cost(spec, 30.0).minutes  # the shortest useful trial at the proxy's step
    assert cost.node_hours == pytest.approx(useful * 4 / 60)
    # the model sampler's many-at-once form is the same figure; a full-scale launch is trial_cost
    many = launch_node_hours(spec, np.array([60.0, 60.0]), np.array([4, 16]), np.array([0.5, 1]))
    assert many == pytest.approx([cost.node_hours, trial_cost(spec, 60.0).node_hours])
    assert launch_cost(spec, 60.0, None) == trial_cost(spec, 60.0)


def test_the_budget_check_judges_a_proxy_launch_by_its_own_worst_case() -> None:
    spec = study_from_mapping(scenario(proxy=True, trial_timeout_min=10_000, max_node_hours=10))
    scale = LaunchScale(nodes=4, step_ratio=0.5, dp=2)
    worst = (spec.search.startup_min + spec.launch.train_iters * 30.0 / 60) * 4 / 60
    attrs = {"predicted_step_s": 60.0}
    assert node_hour_refusal(spec, 10 - worst * 1.01, attrs, "k", scale) is None
    assert node_hour_refusal(spec, 10 - worst * 0.99, attrs, "k", scale) is not None


@pytest.mark.parametrize("proxy", [True, False])
def test_the_sampler_prices_a_launch_as_the_preview_does(proxy: bool) -> None:
    # Its expected improvement per node-hour and stop rule 2's cost read what the launch will
    # cost: a proxy's nodes and iterations where the config runs as one, not a full trial.
    spec = study_from_mapping(scenario(proxy=proxy))
    sampler = ModelGuidedSampler(spec, seed=0)
    belief = sampler.belief([])
    assert belief is not None
    price = sampler.launch_node_hours(belief)
    full = sampler.trial_node_hours(belief.mu)
    costing, configs = Costing(spec, study_gpu(spec)), sampler._candidates()
    proxied = 0
    for j, i in enumerate(belief.open_):
        k = costing(configs[i], math.exp(belief.mu[j]))
        assert price[j] == pytest.approx(k.launch.node_hours)
        assert full[j] == pytest.approx(k.full.node_hours)
        proxied += k.proxy is not None
    assert (price < full).sum() == proxied and (proxied > 0) == proxy


def test_stop_rule_2_weighs_a_proxy_launch_against_what_it_will_cost() -> None:
    # three configs measured, one 10 % slower than predicted: rule 2's most valuable launch
    # (a proxied config) is charged its proxy's trial at its believed step, as the preview
    # prices it, not a full trial on all 16 nodes
    from tests.test_sampler import ask

    spec = study_from_mapping(scenario(proxy=True))
    sampler = ModelGuidedSampler(spec, seed=0)
    study = optuna.create_study(sampler=sampler)
    steps = {c.config.key(): c.time.step for c in enumerate_space(spec).ranked() if c.time}
    for factor in (1.0, 1.1, 1.0):
        trial, config = ask(study, spec)
        trial.set_user_attr("outcome", str(Outcome.OK))
        study.tell(trial, factor * steps[config.key()])
    trials = study.get_trials()
    found = sampler.next_launch_worth(trials)
    belief = sampler.belief(trials)
    assert found is not None and belief is not None
    worth, config = found
    scale = Costing(spec, study_gpu(spec)).proxy_launch(config, steps[config.key()])  # the model's
    assert scale is not None and scale.nodes < spec.nodes_per_trial
    believed = math.exp(belief.mu[worth.index])  # the corrected step: the proxy's moves with it
    assert worth.cost_node_hours == pytest.approx(launch_cost(spec, believed, scale).node_hours)
    assert worth.cost_node_hours < trial_cost(spec, believed).node_hours


@pytest.mark.parametrize("proxy", [True, False])
def test_the_sampler_prices_a_config_too_slow_for_the_limit_at_its_fewer_microbatches(
    proxy: bool,
) -> None:
    # Under a 20-minute limit the scenario's configs are measured at fewer micro-batches per
    # step (their proxies at as many): a launch costs the trial that runs, at the shortened
    # step the time model predicts (moved with the believed step), not the full step's trial.
    spec = study_from_mapping(scenario(proxy=proxy, trial_timeout_min=20))
    sampler = ModelGuidedSampler(spec, seed=0)
    belief = sampler.belief([])
    assert belief is not None
    price = sampler.launch_node_hours(belief)
    full = sampler.trial_node_hours(belief.mu)
    configs, gpu = sampler._candidates(), study_gpu(spec)
    rates, terms = sampler._shared.rates, sampler._shared.terms
    shortened = 0
    for j, i in enumerate(belief.open_):
        predicted = math.exp(sampler._log_pred[i])
        shorter = shorten(spec, configs[i], gpu, rates, terms)
        if trial_cost(spec, predicted).fits or shorter is None:
            continue
        shortened += 1
        believed = math.exp(belief.mu[j])
        scale = Costing(spec, gpu, rates, terms, {configs[i].key(): shorter}).proxy_launch(
            configs[i], predicted
        )
        if scale is None:  # the config itself at fewer micro-batches, on all its nodes
            runs = trial_cost(spec, believed * shorter.step_s / predicted)
        else:  # its proxy at the same fewer micro-batches
            runs = launch_cost(spec, believed, scale)
            assert scale.nodes < spec.nodes_per_trial
        assert price[j] == pytest.approx(runs.node_hours) and price[j] < full[j]
    assert shortened > 0
