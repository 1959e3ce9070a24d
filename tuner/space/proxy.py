"""Which proxy measures a config: the same per-rank work at a smaller data-parallel size.

A proxy keeps tp, pp, cp, vp, ep, the micro-batch and the micro-batches per step; its DP size is
smaller and its global batch scales with it. It runs on whole nodes, fewer than the full run's,
and keeps the full run's communication hierarchy: when the full run's DP group crosses nodes
(Megatron's rank order tp-cp-dp-pp puts a DP group's ranks ``tp x cp`` apart, so it spans
``tp x cp x dp`` consecutive ranks) the proxy's crosses nodes too, with at least 2 ranks, so its
gradient reduction runs over the network as the full run's does and the measured step holds the
network's cost; a DP group inside one node stays inside one node. For MoE, EP is carved from the
proxy's own dp x cp (the framework's rules, ``tuner.config.rules``, are checked at the proxy's
world size). A proxy shards the distributed optimizer's (ZeRO's, FSDP's) states over fewer ranks,
so it may not fit where the full run fits: the proxy is the smallest node count whose predicted
peak fits ``search.memory_headroom`` (``tuner.models.memory``).

``search.proxy`` decides whether a config is measured through a proxy (:func:`study_proxy`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.config.rules import validate
from tuner.models.memory.breakdown import GIB
from tuner.models.memory.estimate import estimate_memory
from tuner.space.shorten import batch_spec
from tuner.spec.study import StudySpec

AUTO_MIN_NODES = 4
"""``search.proxy: auto`` measures through proxies only when a trial takes at least this many
nodes (below it, a proxy's start-up and the confirmations cost what it saves)."""
AUTO_MAX_SHARE = 0.5
"""``auto``: a proxy must take at most this share of a trial's nodes to be worth it."""


@dataclass(frozen=True, slots=True)
class Proxy:
    """A config's proxy: what runs, on how many nodes, and its predicted peak."""

    config: ParallelConfig
    """The full config at the proxy's DP size and global batch."""
    nodes: int
    """Nodes the proxy runs on."""
    full_nodes: int
    """Nodes the full-scale trial runs on."""
    peak_gib: float
    """The memory model's peak of the proxy (GiB)."""


def proxy_config(full: ParallelConfig, dp: int) -> ParallelConfig:
    """``full`` at data-parallel size ``dp``: the same micro-batches per step, so the global
    batch scales with DP."""
    gbs = full.num_microbatches * full.micro_batch_size * dp
    return dataclasses.replace(full, dp=dp, global_batch_size=gbs)


def dp_crosses_nodes(config: ParallelConfig, gpus_per_node: int) -> bool:
    """Whether ``config``'s DP group spans more than one node (rank order tp-cp-dp-pp)."""
    return config.dp > 1 and config.tp * config.cp * config.dp > gpus_per_node


def choose_proxy(spec: StudySpec, full: ParallelConfig, gpu: GPUSpec) -> Proxy | None:
    """The proxy on the fewest nodes that keeps ``full``'s per-rank work and hierarchy, passes
    the framework's rules and fits in memory; None when no smaller run does."""
    gpn, nodes = spec.cluster.gpus_per_node, spec.nodes_per_trial
    crosses = dp_crosses_nodes(full, gpn)
    limit = spec.search.memory_headroom * gpu.memory_gib
    for k in range(1, nodes):
        world = k * gpn
        if world % full.model_parallel_size:
            continue
        dp = world // full.model_parallel_size
        if not 2 <= dp < full.dp or full.dp_replicate > 1 and dp % full.dp_replicate:
            continue
        proxy = proxy_config(full, dp)
        if dp_crosses_nodes(proxy, gpn) != crosses:
            continue
        if validate(proxy, spec.model, world, spec.framework, spec.training, gpn):
            continue
        peak = estimate_memory(spec.model, proxy, gpu, spec.framework,
                               spec.training.precision).peak / GIB  # fmt: skip
        if peak <= limit:
            return Proxy(proxy, k, nodes, peak)
    return None


def study_proxy(spec: StudySpec, full: ParallelConfig, gpu: GPUSpec) -> Proxy | None:
    """The proxy that measures ``full`` under ``search.proxy`` (None: it runs at full scale)."""
    mode = spec.search.proxy
    if mode is False:
        return None
    if mode == "auto" and spec.nodes_per_trial < AUTO_MIN_NODES:
        return None
    proxy = choose_proxy(spec, full, gpu)
    if proxy is None or mode is True:
        return proxy
    return proxy if proxy.nodes <= AUTO_MAX_SHARE * spec.nodes_per_trial else None


def proxy_spec(spec: StudySpec, proxy: Proxy) -> StudySpec:
    """``spec`` as the proxy runs it: its nodes per trial and global batch (what the launch
    template renders and the log parser reads)."""
    ran = batch_spec(spec, proxy.config)
    return dataclasses.replace(
        ran, search=dataclasses.replace(spec.search, nodes_per_trial=proxy.nodes)
    )
