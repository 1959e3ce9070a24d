"""Emulations of the field's search strategies, for ``search_efficiency.py``.

Each returns the order in which the strategy would launch the configs of a space, stopping where
it stops by itself, given what each launch measures (a :class:`Space`: the valid configs, which
really run out of memory, and the true step time of the others). They run in-process: nothing is
launched, the benchmark charges each launch its start-up and the iterations it runs.

Written from reading the upstream code (no code copied); each function names the file and commit
it follows. What the emulations leave out, on purpose: none of them uses our time model; knobs a
strategy searches that this space does not hold (NeMo's context and expert sizes, FlagScale's
recompute layer counts, DeepSpeed's ZeRO stages) are taken at the space's only value.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.config.parallel import ParallelConfig

RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}
"""Recomputation from least to most memory saved (and most time spent)."""


@dataclass(frozen=True)
class Space:
    """What the emulations may know before a launch, and what a launch reveals."""

    configs: dict[str, ParallelConfig]
    """Every valid config (the frameworks' rules), by key, in the study's enumeration order."""
    peak_gib: dict[str, float]
    """Predicted peak memory of each (our memory model, standing in for each tool's own)."""
    admitted: set[str]
    """The configs our memory model admits (for the strategies that screen memory first)."""
    gpu_gib: float
    step: dict[str, float]
    """True step time of every config that really fits."""

    def measure(self, key: str) -> float | None:
        """What launching ``key`` gives: its step time, or None (out of memory)."""
        return self.step.get(key)


Strategy = Callable[[Space, random.Random], list[str]]


def _grid_key(c: ParallelConfig) -> tuple[int, int, int, int, int, int]:
    return (c.tp, c.pp, c.cp, c.ep, RECOMPUTE_ORDER[c.recompute],
            c.micro_batch_size)  # fmt: skip


def nemo(space: Space, rng: random.Random) -> list[str]:
    """NeMo Auto Configurator: every candidate of its grid, in the order it generates them, no
    early stop (it launches all candidates, then reports the fastest).

    Follows NVIDIA/NeMo ``nemo/collections/llm/tools/auto_configurator/core/training_config.py``
    (commit 25a148a9a6efe5479481325936a0ca51274c6e5a, ``generate_grid_search_configs``): nested
    loops ``for tp: for pp: for cp: for ep: for mbs`` over ascending lists, each candidate kept
    when the sizes divide the GPUs and the layers; no memory model filters them (a candidate that
    runs out of memory is launched and fails). Activation checkpointing, which the NeMo-Framework
    -Launcher's autoconfig loops over between ``pp`` and ``mbs``, takes that place here."""
    del rng
    return sorted(space.configs, key=lambda k: _grid_key(space.configs[k]))


def _recompute_more_memory(a: ParallelConfig, b: ParallelConfig) -> bool:
    """FlagScale's ``compare_by_recompute``: ``a`` keeps at least ``b``'s activations."""
    return RECOMPUTE_ORDER[a.recompute] <= RECOMPUTE_ORDER[b.recompute]


def _beside(a: ParallelConfig, b: ParallelConfig, free: set[str]) -> bool:
    """FlagScale's ``beside``: equal in every searched dimension but those in ``free``."""
    dims = {"tp": (a.tp, b.tp), "pp": (a.pp, b.pp), "dp": (a.dp, b.dp),
            "mbs": (a.micro_batch_size, b.micro_batch_size),
            "recompute": (a.recompute_setting, b.recompute_setting)}  # fmt: skip
    return all(x == y for name, (x, y) in dims.items() if name not in free)


def _flagscale_pruned(c: ParallelConfig, history: Sequence[tuple[ParallelConfig, bool]]) -> bool:
    """Whether one of FlagScale's history rules prunes ``c`` (``ran``: the past launch fit)."""
    for h, ran in history:
        if _beside(c, h, {"mbs"}):
            if h.micro_batch_size > c.micro_batch_size and ran:
                return True  # performance: a larger micro-batch ran, so this one is slower
            if h.micro_batch_size < c.micro_batch_size and not ran:
                return True  # memory: a smaller micro-batch ran out of memory
        if _beside(c, h, {"recompute"}):
            if h.recompute == "none" and c.recompute != "none" and ran:
                return True  # performance: it ran without recomputation
            if c.recompute == "none" and h.recompute != "none" and not ran:
                return True  # memory: even with recomputation it ran out
        if (_beside(c, h, {"mbs", "recompute"}) and h.micro_batch_size < c.micro_batch_size
                and _recompute_more_memory(c, h) and not ran):  # fmt: skip
            return True
        if (_beside(c, h, {"tp", "pp"}) and c.tp * c.pp == h.tp * h.pp and c.tp < h.tp
                and not ran):  # fmt: skip
            return True
    return False


def flagscale(space: Space, rng: random.Random) -> list[str]:
    """FlagScale AutoTuner: its grid sorted by modelled memory, largest first, the configs its
    memory model puts over the GPU pruned, then its history rules before each launch.

    Follows FlagOpen/FlagScale ``flagscale/runner/auto_tuner/search/algorithm.py`` (commit
    65fc2de3a889f0b7b2221093b89a0265c3116999: ``GridAlgo`` sorts by ``sort_by_memory_model``,
    reverse), ``prune/memory.py`` (commit 3be238e58b7ac8ccc4baa75bb7ff7e7b3e663cf7: modelled
    memory over the GPU's) and ``prune/history.py`` (commit
    82fbef706fe4d6abf914e6510a4d5e3d0327b849: ``prune_by_micro_batch_size``,
    ``prune_by_recompute``, ``prune_by_mbs_recompute``, ``prune_by_tp_pp``, with ``beside`` and
    ``compare_by_recompute`` from ``utils.py``, commit 39b01524b08cb26045627849d16eea0c94007416).
    No early stop: every strategy not pruned runs. Our memory model stands in for its
    ``default_model``."""
    del rng
    order = sorted((k for k in space.configs if space.peak_gib[k] <= space.gpu_gib),
                   key=lambda k: -space.peak_gib[k])  # fmt: skip
    history: list[tuple[ParallelConfig, bool]] = []
    launched = []
    for key in order:
        config = space.configs[key]
        if _flagscale_pruned(config, history):
            continue
        launched.append(key)
        history.append((config, space.measure(key) is not None))
    return launched


def _features(c: ParallelConfig) -> list[float]:
    return [c.tp, c.pp, c.dp, c.micro_batch_size, RECOMPUTE_ORDER[c.recompute]]


def _boosted_stumps(x: np.ndarray, y: np.ndarray, rounds: int = 50, rate: float = 0.3
                    ) -> Callable[[np.ndarray], np.ndarray]:  # fmt: skip
    """A small gradient-boosted ensemble of one-split trees (squared loss): the stand-in for
    DeepSpeed's XGBoost cost model (xgboost is not a dependency here)."""
    base = float(np.mean(y))
    stumps: list[tuple[int, float, float, float]] = []
    residual = y - base
    for _ in range(rounds):
        best: tuple[float, int, float, float, float] | None = None
        for j in range(x.shape[1]):
            for cut in np.unique(x[:, j])[:-1]:
                left = x[:, j] <= cut
                lv, rv = float(residual[left].mean()), float(residual[~left].mean())
                err = float(np.sum((residual - np.where(left, lv, rv)) ** 2))
                if best is None or err < best[0]:
                    best = (err, j, float(cut), lv, rv)
        if best is None:
            break
        _, j, cut, lv, rv = best
        stumps.append((j, cut, rate * lv, rate * rv))
        residual = residual - np.where(x[:, j] <= cut, rate * lv, rate * rv)

    def predict(z: np.ndarray) -> np.ndarray:
        out = np.full(len(z), base)
        for j, cut, lv, rv in stumps:
            out += np.where(z[:, j] <= cut, lv, rv)
        return out

    return predict


EARLY_STOP = 5
"""DeepSpeed Autotuning's default ``tuner_early_stopping``."""


def deepspeed(space: Space, rng: random.Random, first: str | None = None) -> list[str]:
    """DeepSpeed Autotuning's model-based tuner, early stop after 5.

    Follows microsoft/DeepSpeed ``deepspeed/autotuning/tuner/model_based_tuner.py`` (commit
    3aebde21337a9060a5825aa2221b718cc12c2008) and ``tuner/base_tuner.py`` (commit
    0bb3516d154d27c1c5730742ca73a9b00680c184): the first experiment is the first of its list
    (its second initial pick, a random one, is replaced when ``update`` re-ranks after the first
    run); after each run a cost model fitted to the numeric config values and the measured
    throughput (0 for a failed run) ranks every config, highest predicted throughput first (ties
    in reverse list order, as ``argsort`` reversed gives), and the best-ranked one not run yet is
    next (its 20 % "random exploration" branch leaves the choice unchanged in that code, so it
    is left out); ``tune`` stops once ``len(run) >= best_iter + early_stopping`` (default 5,
    ``constants.py``), ``best_iter`` the 0-based index of the best run. The experiments are
    the configs that pass its memory check (our screen stands in), in grid order. ``first``
    replaces the first experiment (to see how much the grid's start decides)."""
    exps = sorted(space.admitted, key=lambda k: _grid_key(space.configs[k]))
    x_all = np.array([_features(space.configs[k]) for k in exps], dtype=float)
    visited: list[int] = [0 if first is None else exps.index(first)]
    throughput: list[float] = []
    best, best_at = -1.0, 0
    while len(throughput) < len(visited):
        step = space.measure(exps[visited[-1]])
        value = 0.0 if step is None else 1.0 / step * (1 + rng.gauss(0.0, 0.01))
        if value > best:
            best, best_at = value, len(throughput)
        throughput.append(value)
        if len(throughput) >= best_at + EARLY_STOP or len(visited) == len(exps):
            break
        model = _boosted_stumps(x_all[visited], np.array(throughput))
        ranked = np.argsort(model(x_all), kind="stable")[::-1]  # highest throughput first
        visited.append(next(int(j) for j in ranked if int(j) not in visited))
    return [exps[j] for j in visited]


def random_search(space: Space, rng: random.Random) -> list[str]:
    """Random search over the configs our memory model admits (Optuna's ``RandomSampler`` with
    the study loop's screen and duplicate skipping amounts to this), until every one ran."""
    order = sorted(space.admitted)
    rng.shuffle(order)
    return order


def shuffled_grid(space: Space, rng: random.Random) -> list[str]:
    """Every valid config in a random order, no memory model: the plain grid a user runs."""
    order = list(space.configs)
    rng.shuffle(order)
    return order


ANCHORS: dict[str, Strategy] = {
    "nemo-autoconfig": nemo, "flagscale-autotuner": flagscale,
    "deepspeed-autotuning": deepspeed, "random": random_search, "shuffled-grid": shuffled_grid,
}  # fmt: skip
