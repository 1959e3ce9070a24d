"""Proxy trials: the extrapolation (tuner.models.time.proxy) and the choice of a config's proxy
(tuner.space.proxy), on the Llama-3-70B / 16 x 8 H100 study the README shows."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.config.parallel import ParallelConfig
from tuner.models.memory.breakdown import GIB
from tuner.models.memory.estimate import estimate_memory
from tuner.models.time.estimate import estimate_time
from tuner.models.time.proxy import MIN_SCALE, extrapolate
from tuner.space.enumerate import study_gpu
from tuner.space.proxy import (
    choose_proxy,
    dp_crosses_nodes,
    proxy_config,
    proxy_spec,
    study_proxy,
)
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec


def spec(nodes: int = 16, proxy: Any = True, model: str = "llama3-70b") -> StudySpec:
    return study_from_mapping({
        "name": "p", "model": {"preset": model}, "training": {"global_batch_size": 512},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": nodes,
                    "executor": "local"},
        "framework": "megatron", "launch": {"template": "megatron_gpt", "megatron_path": "/m"},
        "search": {"proxy": proxy},
    })  # fmt: skip


TP8_DP16 = ParallelConfig(
    tp=8, dp=16, sequence_parallel=True, micro_batch_size=1, global_batch_size=512,
    distributed_optimizer=True, recompute="full", recompute_method="uniform",
    recompute_num_layers=1,
)  # fmt: skip


def _extrapolate(s: StudySpec, full: ParallelConfig, proxy: ParallelConfig, step: float) -> Any:
    gpu = study_gpu(s)
    return extrapolate(s.model, s.training, full, proxy, step, gpu, 8)


def test_a_proxy_measured_as_predicted_extrapolates_to_the_full_prediction() -> None:
    s = spec()
    proxy = proxy_config(TP8_DP16, 6)
    gpu = study_gpu(s)
    at_proxy = estimate_time(s.model, s.training, proxy, gpu, 8).step
    at_full = estimate_time(s.model, s.training, TP8_DP16, gpu, 8).step
    found = _extrapolate(s, TP8_DP16, proxy, at_proxy)
    assert found.scale == pytest.approx(1.0, rel=1e-9) and not found.clamped
    assert found.step_s == pytest.approx(at_full, rel=1e-9)
    # the distributed optimizer's states shard over 16 ranks, not 6: a shorter optimizer step
    assert found.optimizer[1] < found.optimizer[0]
    assert found.to_dict()["step_s"] == found.step_s


def test_the_difference_is_not_additive_the_measured_windows_hide_dp_traffic() -> None:
    """A proxy measured faster than the model says has shorter backward windows: more of the
    larger group's gradient traffic is exposed at full scale. A slower one hides it all."""
    s = spec()
    proxy = proxy_config(TP8_DP16, 6)
    gpu = study_gpu(s)
    predicted = estimate_time(s.model, s.training, proxy, gpu, 8).step
    fast = _extrapolate(s, TP8_DP16, proxy, 0.8 * predicted)
    slow = _extrapolate(s, TP8_DP16, proxy, 1.3 * predicted)
    assert fast.scale < 1 < slow.scale
    assert fast.dp_comm[1] - fast.dp_comm[0] > 10 * (slow.dp_comm[1] - slow.dp_comm[0])
    assert fast.difference_s > slow.difference_s + 0.05
    # an additive correction (model's full minus model's proxy at its own rates) misses it
    additive = estimate_time(s.model, s.training, TP8_DP16, gpu, 8).step - predicted
    assert abs(fast.difference_s - additive) > 0.05


def test_a_measurement_no_rescale_explains_is_clamped_and_kept() -> None:
    s = spec()
    proxy = proxy_config(TP8_DP16, 6)
    found = _extrapolate(s, TP8_DP16, proxy, 1e-4)
    assert found.clamped and found.scale == MIN_SCALE
    assert found.measured_proxy_s == 1e-4
    with pytest.raises(ValueError):
        _extrapolate(s, TP8_DP16, proxy, 0.0)


def test_the_proxy_keeps_per_replica_work_and_scales_the_global_batch() -> None:
    proxy = proxy_config(TP8_DP16, 4)
    assert proxy.num_microbatches == TP8_DP16.num_microbatches == 32
    assert (proxy.dp, proxy.global_batch_size) == (4, 128)
    assert proxy.key().replace("dp=4", "dp=16").replace("gbs=128", "gbs=512") == TP8_DP16.key()


def test_the_proxy_keeps_the_hierarchy_never_dp_inside_one_node_for_a_cross_node_run() -> None:
    s = spec(nodes=4, model="llama3-8b")
    gpu = study_gpu(s)
    full = ParallelConfig(tp=4, dp=8, micro_batch_size=1, global_batch_size=512,
                          distributed_optimizer=True)  # fmt: skip
    assert dp_crosses_nodes(full, 8)
    proxy = choose_proxy(s, full, gpu)
    assert proxy is not None
    # one node would hold dp 2 inside the node (its gradients over NVLink): two are needed
    assert (proxy.nodes, proxy.config.dp) == (2, 4) and dp_crosses_nodes(proxy.config, 8)
    # tp 8 on 2 nodes: the only smaller run is dp 1, which is no proxy
    two = spec(nodes=2, model="llama3-8b")
    assert choose_proxy(two, ParallelConfig(tp=8, dp=2, global_batch_size=512), gpu) is None
    # a DP group inside one node (pipeline across nodes) stays inside one node
    inside = ParallelConfig(tp=2, pp=4, dp=4, micro_batch_size=1, global_batch_size=512)
    assert not dp_crosses_nodes(inside, 8)
    found = choose_proxy(s, inside, gpu)
    assert found is not None and found.config.dp == 2 and not dp_crosses_nodes(found.config, 8)


def test_a_proxy_whose_less_sharded_states_do_not_fit_runs_at_the_smallest_dp_that_fits() -> None:
    s = spec()
    gpu = study_gpu(s)
    proxy = choose_proxy(s, TP8_DP16, gpu)
    assert proxy is not None
    limit = s.search.memory_headroom * gpu.memory_gib
    assert proxy.peak_gib <= limit and proxy.config.dp == proxy.nodes
    # every smaller DP that keeps the hierarchy (dp >= 2: it crosses nodes at tp 8) does not fit
    assert proxy.nodes > 2
    for dp in range(2, proxy.config.dp):
        smaller = proxy_config(TP8_DP16, dp)
        assert estimate_memory(s.model, smaller, gpu).peak / GIB > limit
    assert proxy_spec(s, proxy).world_size == proxy.nodes * 8
    assert proxy_spec(s, proxy).training.global_batch_size == proxy.config.global_batch_size


def test_auto_uses_a_proxy_only_where_it_saves_node_hours() -> None:
    gpu = study_gpu(spec())
    assert study_proxy(spec(proxy=False), TP8_DP16, gpu) is None
    on = study_proxy(spec(proxy=True), TP8_DP16, gpu)
    assert on is not None and on.nodes <= 8
    assert study_proxy(spec(proxy="auto"), TP8_DP16, gpu) == on
    # the pipeline-heavy config's proxy needs 12 of 16 nodes: not worth it under auto
    deep = ParallelConfig(tp=4, pp=8, dp=4, sequence_parallel=True, micro_batch_size=1,
                          global_batch_size=512, distributed_optimizer=True)  # fmt: skip
    big = study_proxy(spec(proxy=True), deep, gpu)
    assert big is not None and big.nodes == 12
    assert study_proxy(spec(proxy="auto"), deep, gpu) is None
    # a 2-node study: auto never proxies, on does
    small = ParallelConfig(tp=4, dp=4, micro_batch_size=1, global_batch_size=512)
    assert study_proxy(spec(nodes=2, proxy="auto", model="llama3-8b"), small, gpu) is None


def test_an_moe_proxy_carves_ep_from_its_own_dp() -> None:
    s = spec(nodes=8, model="mixtral-8x7b")
    gpu = study_gpu(s)
    for ep in (4, 8):
        full = ParallelConfig(tp=2, pp=2, dp=16, ep=ep, sequence_parallel=True,
                              micro_batch_size=1, global_batch_size=512,
                              distributed_optimizer=True)  # fmt: skip
        proxy = choose_proxy(s, full, gpu)
        assert proxy is not None and proxy.nodes < 8 and proxy.config.ep == ep
        assert (proxy.config.dp * proxy.config.cp) % ep == 0  # dp 10 would not hold ep 4 or 8
        assert proxy.config.dp == 8


def _trial(number: int, key: str, value: float, **attrs: Any) -> Any:
    import optuna
    from optuna.distributions import IntDistribution

    t = optuna.trial.create_trial(
        params={"x": 1}, distributions={"x": IntDistribution(1, 2)}, value=value,
        user_attrs={"key": key, "outcome": "ok", "launched": True, **attrs},
    )  # fmt: skip
    t.number = number
    return t


def test_the_best_proxies_are_confirmed_once_each_and_the_best_is_full_scale() -> None:
    from tuner.study.proxy import Proxies, full_scale_first

    s = spec()
    proxies = Proxies(s, study_gpu(s), None)
    trials = [_trial(0, "a", 1.0, proxy=True), _trial(1, "b", 1.1, proxy=True),
              _trial(2, "c", 1.2, proxy=True), _trial(3, "d", 1.5)]  # fmt: skip
    assert [t.number for t in proxies.due(trials)] == [0, 1]  # proxy_confirm: 2
    # a's confirmation came out slower than b and c's figures: c is due in turn, a never again
    trials.append(_trial(4, "a", 1.3, confirms=0))
    assert [t.number for t in proxies.due(trials)] == [1, 2]
    trials.append(_trial(5, "b", 1.25, confirms=1))
    assert [t.number for t in proxies.due(trials)] == [2]
    assert [t.number for t in full_scale_first(trials)] == [3, 4, 5]
    # at most twice proxy_confirm confirmations
    trials += [_trial(6, "c", 1.4, confirms=2), _trial(7, "e", 0.9, proxy=True),
               _trial(8, "f", 0.8, proxy=True), _trial(9, "e", 1.6, confirms=7)]  # fmt: skip
    assert proxies.due(trials) == []
    assert Proxies(spec(proxy=False), study_gpu(s), None).due(trials[:3]) == []


def test_a_recorded_proxy_verdict_carries_both_figures() -> None:
    from tuner.outcome import Outcome
    from tuner.study.proxy import extrapolated, recorded_proxy
    from tuner.study.record import Verdict

    s = spec()
    gpu = study_gpu(s)
    attrs = {"proxy": True, "proxy_dp": 6, "proxy_nodes": 6, "proxy_predicted_peak_gib": 70.0}
    proxy = recorded_proxy(s, attrs, TP8_DP16)
    assert proxy is not None and proxy.config == proxy_config(TP8_DP16, 6) and proxy.nodes == 6
    assert recorded_proxy(s, {}, TP8_DP16) is None
    measured = {"step_time_s": 40.0, "tokens_per_s": 1.0, "mfu": 0.5, "steady_step_s": 40.0,
                "steady_halfwidth_s": 0.4, "peak_memory_gib": 60.0}  # fmt: skip
    ok = Verdict(Outcome.OK, None, measured)
    got = extrapolated(s, gpu, None, proxy, TP8_DP16, ok).metrics
    full = _extrapolate(s, TP8_DP16, proxy.config, 40.0).step_s
    assert got["step_time_s"] == pytest.approx(full) and got["proxy_step_s"] == 40.0
    assert got["proxy_tokens_per_s"] == 1.0 and got["proxy_mfu"] == 0.5
    assert got["tokens_per_s"] == pytest.approx(512 * s.model.seq_length / full)
    # the interval through the same map: its upper end, what other trials are raced against
    upper = _extrapolate(s, TP8_DP16, proxy.config, 40.4).step_s
    assert got["steady_step_s"] == pytest.approx(full)
    assert got["steady_step_s"] + got["steady_halfwidth_s"] == pytest.approx(upper)
    assert got["peak_memory_gib"] == 60.0 and got["proxy_extrapolation"]["step_s"] == full
    assert extrapolated(s, gpu, None, None, TP8_DP16, ok) is ok  # a full-scale trial
    oom = Verdict(Outcome.OOM, "out of memory", {})
    assert extrapolated(s, gpu, None, proxy, TP8_DP16, oom) is oom


def _megatron_log(path: Any, step_s: float, iterations: int = 30) -> None:
    line = (" iteration {i:8d}/{n:8d} | elapsed time per iteration (ms): {ms:.1f} |"
            " lm loss: 7.0E+00 | loss scale: 1.0 | number of skipped iterations:   0 |"
            " number of nan iterations:   0 |")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    ms = [step_s * 1000 * (1 + 0.002 * (i % 3)) for i in range(1, iterations + 1)]
    path.write_text("\n".join(line.format(i=i + 1, n=iterations, ms=m)
                              for i, m in enumerate(ms)) + "\n")  # fmt: skip


def test_a_recovered_proxy_is_extrapolated_as_the_live_path_with_the_profile_rates(
    tmp_path: Any,
) -> None:
    # A worker died after its proxy's job finished but before it recorded it: the next worker
    # recovers the result from the trial folder. It must price the full scale with the same
    # cluster profile as the live path, not with the catalog's rates.
    import dataclasses
    import json

    import optuna

    from tuner.launch import JobResult
    from tuner.layout import ResultsLayout
    from tuner.models.rates import Link, catalog_rates
    from tuner.space.enumerate import expand_axes
    from tuner.space.trials import config_params, distributions
    from tuner.study.leases import open_leases
    from tuner.study.proxy import Proxies, extrapolated
    from tuner.study.record import judge
    from tuner.study.recovery import Recovery

    s = spec()  # a space that holds TP8_DP16
    s = dataclasses.replace(s, space=dataclasses.replace(
        s.space, tp=(8,), pp=(1,), micro_batch_size=(1,), recompute=("full",),
        sequence_parallel=(True,), distributed_optimizer=(True,)))  # fmt: skip
    gpu = study_gpu(s)
    full = TP8_DP16
    proxy = choose_proxy(s, full, gpu)
    assert proxy is not None
    catalog = catalog_rates(gpu, s.training.precision)
    profile = dataclasses.replace(  # a measured network 8x slower than the datasheet's
        catalog, inter=Link(catalog.inter.bandwidth / 8, catalog.inter.latency * 4)
    )
    layout = ResultsLayout(tmp_path / "results", s.name)
    paths = layout.trial(0)
    _megatron_log(paths.node_log(0), 30.0)
    hosts = s.node_names[: proxy.nodes]
    result = JobResult(trial=0, hosts=tuple(hosts), exit_codes=(0,) * proxy.nodes,
                       timed_out=False, cancelled=False, node_errors=(), duration_s=900.0,
                       logs=(paths.node_log(0),))  # fmt: skip
    paths.result_json.write_text(json.dumps(result.to_json()))
    attrs = {"launched": True, "hosts": list(hosts), "key": full.key(),
             "config": dataclasses.asdict(full), "proxy": True, "proxy_dp": proxy.config.dp,
             "proxy_nodes": proxy.nodes, "proxy_predicted_peak_gib": proxy.peak_gib}  # fmt: skip
    # the live path: the loop's Proxies with the profile's rates
    live = (
        Proxies(s, gpu, profile)
        .judge(type("T", (), {"number": 0, "user_attrs": attrs})(), full, result)
        .metrics["step_time_s"]
    )
    ran = proxy_spec(s, proxy)
    raw = judge(ran, gpu, result)
    with_catalog = extrapolated(s, gpu, None, proxy, full, raw).metrics["step_time_s"]
    assert live != pytest.approx(with_catalog, rel=1e-3)  # the profile matters here
    # the recovery, on a real SQLite storage, as a worker's start runs it
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name=s.name, storage=url)
    study.add_trial(optuna.trial.create_trial(
        params=config_params(full, expand_axes(s)), distributions=distributions(s),
        user_attrs=attrs, state=optuna.trial.TrialState.FAIL,
    ))  # fmt: skip
    storage = study._storage
    recovery = Recovery(s, study, storage, open_leases(url, layout), None, layout, gpu,
                        study_id=storage.get_study_id_from_name(s.name), worker="w",
                        heartbeat_s=30.0, rerun=frozenset(), rates=profile)  # fmt: skip
    recovery.run(lambda: study.get_trials(deepcopy=False))
    got = [t for t in study.get_trials() if t.user_attrs.get("recovered_from") == 0]
    assert len(got) == 1 and got[0].value == pytest.approx(live, rel=1e-12)
    assert got[0].user_attrs["proxy_step_s"] == pytest.approx(raw.metrics["step_time_s"])
    # its metrics.json, once written, holds the full-scale figure: never extrapolated twice
    paths.metrics_json.write_text(json.dumps(
        {**got[0].user_attrs, "outcome": "ok", "reason": None}, default=str
    ))  # fmt: skip
    again = Recovery(s, study, storage, open_leases(url, layout), None, layout, gpu,
                     study_id=storage.get_study_id_from_name(s.name), worker="w",
                     heartbeat_s=30.0, rerun=frozenset(), rates=profile)  # fmt: skip
    assert again._recovered(study.get_trials()[0])  # the lost trial, read from metrics.json now
    assert study.get_trials()[-1].value == pytest.approx(live, rel=1e-12)


def _proxied_study(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, workers: int,
                   **search: Any) -> list[Any]:  # fmt: skip
    """``workers`` study loops (distinct worker names) on one SQLite storage, 8 nodes (room for
    two full-scale trials), holding two measured proxies: trial 0 the faster."""
    import dataclasses
    import itertools

    import optuna

    from tuner.space.enumerate import expand_axes
    from tuner.space.trials import config_params, distributions
    from tuner.study import loop as study_loop
    from tuner.study.build import build_loop

    names = (f"worker-{k}" for k in itertools.count())
    monkeypatch.setattr(study_loop, "worker_name", lambda: next(names))
    s = study_from_mapping({
        "name": "two", "model": {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024,
                                 "num_attention_heads": 8, "vocab_size": 1024,
                                 "seq_length": 128},
        "training": {"global_batch_size": 64},
        "cluster": {"gpu": "a100-80gb", "gpus_per_node": 2, "num_nodes": 8, "executor": "local"},
        "framework": "megatron", "launch": {"template": "megatron_gpt", "megatron_path": "/m"},
        "space": {"tp": [1, 2], "pp": [1], "micro_batch_size": [1], "recompute": ["none"],
                  "sequence_parallel": [False], "distributed_optimizer": [True]},
        "search": {"n_trials": 2, "nodes_per_trial": 4, "proxy": True, "proxy_confirm": 1,
                   **search},
    })  # fmt: skip
    results = str(tmp_path / "results")
    loops = [build_loop(s, results=results) for _ in range(workers)]
    for k, (tp, step) in enumerate(((1, 1.0), (2, 1.2))):  # two proxies, measured
        full = ParallelConfig(tp=tp, dp=8 // tp, micro_batch_size=1, global_batch_size=64,
                              distributed_optimizer=True)  # fmt: skip
        loops[0].study.add_trial(optuna.trial.create_trial(
            params=config_params(full, expand_axes(s)), distributions=distributions(s),
            value=step, user_attrs={"key": full.key(), "config": dataclasses.asdict(full),
                                    "outcome": "ok", "launched": True, "proxy": True,
                                    "proxy_dp": full.dp // 2, "proxy_nodes": 2,
                                    "step_time_s": step, "predicted_step_s": step,
                                    "hosts": [f"n{k}"]},
        ))  # fmt: skip
    return loops


def test_two_workers_on_one_storage_confirm_a_proxy_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two workers of one study read the trials at the same moment, both before any
    # confirmation exists, and both would confirm the best proxy. The claim goes through the
    # storage: one confirmation in all.
    workers = _proxied_study(tmp_path, monkeypatch, 2)
    first = workers[0]
    launched: list[tuple[str, int]] = []
    seen = [w.trials() for w in workers]  # both read before either confirms
    for w, trials in zip(workers, seen, strict=True):
        w.launch = lambda trial, config, placement, w=w: launched.append(  # type: ignore[method-assign]
            (w.worker, trial.user_attrs["confirms"])
        )
        w.summary.stop_reason = "ran 2 trials (n_trials)"
        w.proxies.confirm(w, trials)
    try:
        assert launched == [("worker-0", 0)]  # the best proxy (trial 0), by one worker only
        stored = [t for t in first.trials() if "confirms" in t.user_attrs]
        assert [t.user_attrs["confirms"] for t in stored] == [0]
        # the first worker waits for its confirmation; the second has nothing left to confirm
        assert first.summary.stop_reason == "" and workers[1].summary.stop_reason != ""
    finally:
        for w in workers:
            w.executor.close()


def test_a_confirmation_that_could_pass_the_node_hour_budget_is_not_launched(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (worker,) = _proxied_study(tmp_path, monkeypatch, 1, max_node_hours=0.05)
    launched: list[int] = []
    worker.launch = lambda trial, config, placement: launched.append(  # type: ignore[method-assign]
        trial.number
    )
    worker.summary.stop_reason = "ran 2 trials (n_trials)"
    try:
        worker.proxies.confirm(worker, worker.trials())
        assert launched == [] and worker.summary.stop_reason.startswith("node-hour budget")
        assert "confirming" in worker.summary.stop_reason
        assert not [t for t in worker.trials() if "confirms" in t.user_attrs]
    finally:
        worker.executor.close()


def test_a_confirmation_runs_as_its_own_trial_past_a_queued_rerun(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The recovery queued a re-run of trial 1's config, and the search stops (a stop rule)
    # before it runs. The confirmation of trial 0 must run as its own trial: an ask would pop
    # the older re-run, measure trial 0's config under trial 1's parameters and leave the
    # confirmation waiting for ever (counted as attempted: trial 0 never confirmed).
    from optuna.trial import TrialState

    from tuner.space.trials import config_from_params

    (worker,) = _proxied_study(tmp_path, monkeypatch, 1)
    rerun = dict(worker.trials()[1].params)
    worker.study.enqueue_trial(rerun)
    launched: list[tuple[int, str, str]] = []
    worker.launch = lambda trial, config, placement: launched.append(  # type: ignore[method-assign]
        (trial.user_attrs.get("confirms"), config_from_params(worker.spec, trial.params).key(),
         config.key())
    )  # fmt: skip
    worker.summary.stop_reason = "no untried config can still win"
    try:
        worker.proxies.confirm(worker, worker.trials())
        first = worker.trials()[0].user_attrs["key"]
        assert launched == [(0, first, first)]
        waiting = [t for t in worker.trials() if t.state == TrialState.WAITING]
        assert [t.system_attrs["fixed_params"] for t in waiting] == [rerun]
        assert "confirms" not in waiting[0].user_attrs
    finally:
        worker.executor.close()
