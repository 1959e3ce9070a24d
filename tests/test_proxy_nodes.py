"""A proxy trial holds, and is counted at, its own nodes, not a full trial's: a worker that takes
over a dead worker's running proxies watches each on the proxy's nodes (on a study whose nodes
run two proxies at once, neither is cancelled for want of a slot), and ``max_node_hours`` judges
a proxy launch by its worst case on those nodes. Real study loop, SQLite storage, leases and
scheduler; the batch executor (Slurm's ``attach``) is a stand-in that knows every job."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.config.parallel import ParallelConfig
from tuner.launch import LaunchRequest
from tuner.space.cost import trial_cost
from tuner.space.enumerate import expand_axes, study_gpu
from tuner.space.proxy import study_proxy
from tuner.space.trials import config_params, distributions
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec
from tuner.study import loop as study_loop
from tuner.study.budget import pending_node_hours
from tuner.study.build import build_loop

LIMIT_S = 600.0


class _Job:
    """A batch job still running under the batch scheduler."""

    def __init__(self, request: LaunchRequest, token: str, cancelled: list[int]) -> None:
        self.request, self.token, self.paths = request, token, request.paths
        self.job_id = f"job-{request.trial}"
        self._cancelled = cancelled

    def poll(self) -> None:
        return None

    def result(self) -> None:
        return None

    def cancel(self) -> None:
        self._cancelled.append(self.request.trial)


class _Batch:
    """The parts of a batch executor the worker's take-over uses; every job is still known."""

    def __init__(self) -> None:
        self.cancelled: list[int] = []

    def attach(self, request: LaunchRequest, token: str, job_id: str | None = None) -> _Job:
        return _Job(request, token, self.cancelled)

    def master_port(self, hosts: Any, port: int) -> int:
        return port

    def master_addr(self, hosts: Any) -> str:
        return "batch"

    def study_jobs(self, trial_dirs: Any) -> list[tuple[str, int, str]]:
        return []

    def reap_lost(self, request: LaunchRequest, token: str) -> list[str]:
        return []

    def close(self) -> None:
        pass


def _spec(tp: list[int], **search: Any) -> StudySpec:
    """4 nodes of 2 GPUs, one trial on all 4; each config's proxy takes 2 of them."""
    return study_from_mapping({
        "name": "adopt", "model": {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024,
                                   "num_attention_heads": 8, "vocab_size": 1024,
                                   "seq_length": 128},
        "training": {"global_batch_size": 64},
        "cluster": {"gpu": "a100-80gb", "gpus_per_node": 2, "num_nodes": 4, "executor": "local"},
        "framework": "megatron", "launch": {"template": "megatron_gpt", "megatron_path": "/m"},
        "space": {"tp": tp, "pp": [1], "micro_batch_size": [1], "recompute": ["none"],
                  "sequence_parallel": [False], "distributed_optimizer": [True]},
        "search": {"nodes_per_trial": 4, "proxy": True, **search},
    })  # fmt: skip


def _taking_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tps: tuple[int, ...],
                 **search: Any) -> tuple[Any, _Batch]:  # fmt: skip
    """A new worker's loop on a study whose dead worker left the proxies of the configs of
    tensor-parallel sizes ``tps`` running, 2 nodes each."""
    spec = _spec([1, 2], **search)
    names = (f"worker-{k}" for k in itertools.count())
    monkeypatch.setattr(study_loop, "worker_name", lambda: next(names))
    batch = _Batch()
    loop = build_loop(spec, results=str(tmp_path / "results"), executor=batch)
    hosts = iter(spec.node_names)
    for tp in tps:
        full = ParallelConfig(tp=tp, dp=8 // tp, micro_batch_size=1, global_batch_size=64,
                              distributed_optimizer=True)  # fmt: skip
        proxy = study_proxy(spec, full, study_gpu(spec))
        assert proxy is not None and proxy.nodes == 2
        loop.study.add_trial(optuna.trial.create_trial(
            params=config_params(full, expand_axes(spec)), distributions=distributions(spec),
            state=optuna.trial.TrialState.RUNNING,
            user_attrs={"key": full.key(), "config": dataclasses.asdict(full),
                        "launched": True, "token": f"t{tp}", "worker": "gone:1:x",
                        "hosts": list(itertools.islice(hosts, proxy.nodes)),
                        "limit_s": LIMIT_S, "proxy": True, "proxy_dp": proxy.config.dp,
                        "proxy_nodes": proxy.nodes, "proxy_global_batch":
                        proxy.config.global_batch_size},
        ))  # fmt: skip
    return loop, batch


def test_a_dead_workers_running_proxies_are_watched_on_their_own_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the dead worker ran both configs' proxies at once, on 2 of the 4 nodes each
    loop, batch = _taking_over(tmp_path, monkeypatch, (1, 2))
    try:
        loop.recover()
        assert batch.cancelled == []  # a full trial's 4 nodes for the first left none for the next
        assert sorted(r.job.token for r in loop.running.values()) == ["t1", "t2"]
        assert [len(r.group.hosts) for r in loop.running.values()] == [2, 2]
        held = [x.resource for x in loop.leases.held() if x.holder == loop.worker]
        assert sorted(r for r in held if r.startswith("host:")) == sorted(
            f"host:{h}" for h in loop.spec.node_names
        )
        # what the budget counts them at: their limits on their own nodes
        pending = pending_node_hours(loop.running, loop.clock())
        assert pending == pytest.approx(LIMIT_S * 4 / 3600, rel=0.01)
    finally:
        loop.executor.close()


def test_the_nodes_a_taken_over_proxy_leaves_free_run_the_next_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one proxy of the dead worker's still runs on 2 of the 4 nodes: the other 2 run the next
    # config's proxy at once (the worker waited for 4 free nodes, a full trial's, until the
    # taken-over one ended)
    loop, _ = _taking_over(tmp_path, monkeypatch, (1,), n_trials=2)
    launched: list[int] = []
    loop.launch = lambda trial, config, placement: launched.append(  # type: ignore[method-assign]
        len(placement.group.hosts)
    )
    try:
        loop.recover()
        loop.step()
        assert [len(r.group.hosts) for r in loop.running.values()] == [2] and launched == [2]
    finally:
        loop.executor.close()


def test_the_node_hour_budget_judges_a_proxy_launch_on_the_proxys_nodes(tmp_path: Path) -> None:
    # A budget that one full trial's worst case would pass but its proxy's does not: the proxy
    # runs (it was refused as if it took all 4 nodes).
    full = ParallelConfig(tp=1, dp=8, micro_batch_size=1, global_batch_size=64,
                          distributed_optimizer=True)  # fmt: skip
    plain = _spec([1])
    proxy = study_proxy(plain, full, study_gpu(plain))
    assert proxy is not None and proxy.nodes == 2
    # a full trial's worst case: its limit on 4 nodes (a tiny model's trial is its start-up)
    worst = trial_cost(plain, None).worst_node_hours
    budget = 0.75 * worst  # between the proxy's worst case (half of it) and the full trial's
    spec = _spec([1], max_node_hours=round(budget, 4), n_trials=1)
    loop = build_loop(spec, results=str(tmp_path / "results"))
    launched: list[int] = []
    loop.launch = lambda trial, config, placement: launched.append(  # type: ignore[method-assign]
        len(placement.group.hosts)
    )
    try:
        loop.step()
        reason = loop.budget_reason(loop.trials()) or ""
        assert launched == [proxy.nodes] and not reason.startswith("node-hour"), reason
    finally:
        loop.executor.close()
