"""Search efficiency: real runs until a config within 2 % of the true best is measured.

    python benchmarks/search_efficiency.py [--seeds 10] [--surfaces high_tp,pipeline,micro_batch]
                                           [--methods tune,random,grid] [--json FILE]

A 13B GPT on 2 nodes x 8 H100 (world 16), global batch 128, SP and the distributed optimizer on.
Two spaces: ``full``, TP {1,2,4,8} x PP {1,2,4} x micro-batch {1,2,4} x recompute {none,
selective, full}: 99 valid configs (Megatron's rules); ``small``, TP {1,2,4} and recompute {none,
full}: 54. The stand-in's own memory formula makes about a quarter of them OOM. Three response
surfaces of different shape (``benchmarks/surfaces.py``): large TP wins, PP wins, micro-batch
matters; and two held out, on which the sampler was never tuned: ``rugged`` (random factors per
knob value and pair) and ``builtin`` (the stand-in's own default surface).

Every method is the real study loop (``tuner.study.build.build_loop``: Optuna with SQLite storage,
the local executor, the memory screen, the Megatron log parser) launching the Megatron stand-in as
a real process per trial, with the flags the ``megatron_gpt`` template renders; only ``torchrun``
is left out (one process plays every rank) so a trial takes a fraction of a second. Trials run one
at a time (``nodes_per_trial: all``, the default), so "runs" is the count of launched trials up to
and including the first whose true step time is within 2 % of the best that really fits.

* ``tune``: default search settings (the model sampler: expected improvement per node-hour on
  the corrected time model; it stops when the untried configs together have no real chance of
  a 1 % gain, when another launch is worth less than its node-hours, or after 10 trials without
  a 1 % gain); only
  ``n_trials`` is raised to the space size so the count is not cut. A study that stops before
  reaching 2 % counts as a miss, charged the whole space's size.
* ``tune-no-early-stop``: the same without either stop rule, to tell search from stopping apart.
* ``tune-count-rule``: tune with only the count rule (``stop_chance: null``), to show what the
  "answer is known" rule saves in launches.
* ``tpe``: tune with Optuna's TPE sampler instead of the model sampler, other settings default.
* ``random``: Optuna's RandomSampler through the same loop, nothing enqueued, no early stop.
* ``grid``: Optuna's GridSampler (it visits the grid in a random order per seed), the same way.
* ``second`` / ``second-calibrated``: a second tune study on the same surface (other sampler and
  noise seeds), without and with the calibration (``tuner.calibrate.store``) that a first tune
  study of the same seed saved for the cluster; a table over seeds compares their runs to within 2
  %.

``tune``, ``tune-count-rule`` and ``tpe`` run on until their own stop rules end them:
``launches`` is every launch they paid for (runs to the best plus the launches spent making
sure), ``known-stop`` how many searches ended because no untried config had a 10 % chance of a
1 % gain (``tuner.search.stopping``) rather than by the count rule or the budget.

The baselines get the memory screen and duplicate skipping too, so the table isolates the search
strategy; ``grid (no model)`` is the expected count for a shuffled grid that launches every
valid config, OOM or not: ``(valid + 1) / (good + 1)``.

Targets (issue 5): tune's mean at most 25 % of the grid's and at most 8 runs on a 50-config space.

**Node-hours** (issue 33), ``--node-hours``::

    python benchmarks/search_efficiency.py --node-hours [--seeds 5] [--spaces full]

per method and surface, the median over seeds of the node-hours to a config within 2 % of the
best and of the node-hours in all. Every launch is charged ``search.startup_min`` (3 minutes,
once per launch) plus the iterations a user's trial runs with the tool's defaults (the warm-up of 5
and the estimator's minimum of 4 batches of 2 records: 13 iterations, where the study loop ends a
trial whose step time is known to 2 %) at the surface's true step time, on the trial's 2 nodes; a
launch that runs out of memory is charged its start-up. The stand-in runs its 30 iterations at
once (no sleeping), so ``tune``'s figures come from the steady iterations of the whole log
(half-widths of 0.2-0.3 % where a trial ended at 13 would state about 0.7 %). ``tune`` is the
real study loop, default settings, run until its own stop rules end it. Beside it, emulations
of the field's strategies on the same truth (``benchmarks/anchors.py``, each citing the upstream
file and commit it follows):

* ``nemo-autoconfig``: NeMo Auto Configurator, every candidate of its grid in its order, no
  memory model, no early stop;
* ``flagscale-autotuner``: FlagScale AutoTuner, its grid sorted by modelled memory (largest
  first), memory-model and history pruning, no early stop;
* ``deepspeed-autotuning``: DeepSpeed Autotuning's model-based tuner, early stop after 5;
* ``random``: random search over the configs the memory model admits, to the end;
* ``shuffled-grid``: every valid config in a random order, to the end.

**Replays of measured clusters**, ``--surfaces replays`` (or a replay's name): the same methods on
searches over configs measured on a real cluster, each study the measured run's (model, GPU,
framework, batch, nodes), its space the measured configs alone, each config's true step its
published figure (``benchmarks/replays.py``); shown as space ``replay``, once whatever
``--spaces`` says.

The targets printed under the table: tune's node-hours in all at most its node-hours to the best
plus 1.5 median launches, and its node-hours to the best below every anchor's, on every surface
(the exit status is 1 when one fails).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import replays  # noqa: E402
from benchmarks.anchors import ANCHORS, Space  # noqa: E402
from tests.standins import pretrain_gpt as standin  # noqa: E402
from tuner.calibrate.store import record_study  # noqa: E402
from tuner.config.parallel import ParallelConfig  # noqa: E402
from tuner.launch import LaunchRequest, render_launch  # noqa: E402
from tuner.models.memory.estimate import GIB  # noqa: E402
from tuner.profile.run import ClusterProfile  # noqa: E402
from tuner.space.cost import trial_cost  # noqa: E402
from tuner.space.enumerate import enumerate_space, study_gpu  # noqa: E402
from tuner.spec.file import study_from_mapping  # noqa: E402
from tuner.spec.study import StudySpec  # noqa: E402
from tuner.study.build import build_loop  # noqa: E402
from tuner.study.loop import StudyLoop  # noqa: E402

SURFACES_PY = REPO / "benchmarks" / "surfaces.py"
STANDIN = REPO / "tests" / "standins" / "pretrain_gpt.py"
WITHIN = 0.02
SHAPES = ("high_tp", "pipeline", "micro_batch")  # the shapes issue 5 asks for
HELD_OUT = ("rugged", "builtin")  # the sampler was never tuned on these


SPACES: dict[str, dict[str, Any]] = {
    "full": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2, 4],
             "recompute": ["none", "selective", "full"]},
    "small": {"tp": [1, 2, 4], "pp": [1, 2, 4], "micro_batch_size": [1, 2, 4],
              "recompute": ["none", "full"]},
}  # fmt: skip


def study_data(
    surface: str, method: str, seed: int, space_size: int, space: str = "full"
) -> dict[str, Any]:
    """The benchmark study; ``method`` picks the search settings."""
    # No trial_timeout_min: each config's limit is the tool's default (1.5 x its predicted
    # trial), as a user who sets none gets. A 1-minute limit under the 3-minute start-up made
    # every launch cost its limit (tuner.space.cost.TrialCost.node_hours stops there), so the
    # charges and the sampler's trial costs were one flat minute whatever the step time.
    # No train_iters or warmup_iters either: a trial runs as a user's does with the tool's
    # defaults (a warm-up of 5, a cap of 30), so its log reaches the steady-state estimator's
    # minimum batches and its figure is the steady mean the tool stops on, not a median of 3
    # iterations that states no precision; every method's launch is charged that trial's
    # shortest useful length (start-up, warm-up and the estimator's minimum: 13 iterations).
    search = search_settings(method, seed, space_size)
    if surface in replays.REPLAYS:  # a measured cluster: its own model, nodes and configs
        data = replays.study_mapping(surface, search, seed)
        data["name"] = f"eff-{surface}-{method}-{seed}"
        return data
    env = {"TUNER_STANDIN_TIME_SCALE": "0", "TUNER_STANDIN_NOISE_SEED": str(seed)}
    model = {"num_layers": 40, "hidden_size": 5120, "ffn_hidden_size": 13824,
             "num_attention_heads": 40, "vocab_size": 32000, "seq_length": 4096,
             "swiglu": True, "normalization": "rmsnorm", "position_embedding": "rope",
             "add_bias_linear": False, "tied_embeddings": False, "dropout": False}  # fmt: skip
    if surface != "builtin":
        env["TUNER_STANDIN_SURFACE"] = f"{SURFACES_PY}:{surface}"
    else:  # the stand-in's own surface keeps the attention scores: no flash attention
        model["flash_attention"] = False
    return {
        "name": f"eff-{surface}-{method}-{seed}",
        "model": model,
        "training": {"global_batch_size": 128, "precision": "bf16"},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 2,
                    "executor": "local"},
        "framework": "megatron",
        "launch": {"template": "megatron_gpt", "megatron_path": str(STANDIN.parent),
                   "python": sys.executable, "env": env},
        "space": {**SPACES[space], "sequence_parallel": [True], "distributed_optimizer": [True]},
        "search": search,
    }  # fmt: skip


def search_settings(method: str, seed: int, space_size: int) -> dict[str, Any]:
    """The study's ``search`` section for ``method``."""
    search: dict[str, Any] = {"seed": seed, "n_trials": space_size}
    if method in ("tpe", "gp"):  # tune with another of its samplers, other settings default
        search |= {"sampler": method}
    elif method == "tune-no-early-stop":
        search |= {"early_stop_trials": None, "stop_chance": None}
    elif method == "tune-count-rule":
        search |= {"stop_chance": None}
    elif method != "tune":
        search |= {"sampler": method, "enqueue_top": 0, "early_stop_trials": None}
    return search


def standin_args(spec: StudySpec, config: ParallelConfig) -> list[str]:
    """The Megatron flags the study's template renders for ``config`` (its ``args=(...)``)."""
    import shlex

    script = render_launch(
        spec, config, hosts=("n0",), master_addr="n0", master_port=29500, trial_dir="/nonexistent"
    ).scripts[0]
    body = script.split("args=(", 1)[1].split("\n)\n", 1)[0]
    return shlex.split(body)


def fast_launcher(
    spec: StudySpec, config: ParallelConfig, number: int, group: Any, paths: Any, master: str
) -> LaunchRequest:
    """The template's script, ``torchrun`` swapped for one stand-in process playing all ranks
    (the stand-in of the template's ``megatron_path``), with the template's extra files."""
    rendered = render_launch(
        spec, config, hosts=group.hosts, master_addr=master, master_port=group.master_port,
        trial_dir=str(paths.dir.resolve()),
    )  # fmt: skip
    head = rendered.scripts[0].split("exec torchrun", 1)[0]
    standin_py = Path(str(spec.launch.megatron_path)) / "pretrain_gpt.py"
    run = f'WORLD_SIZE={spec.world_size} exec {sys.executable} {standin_py} "${{args[@]}}"\n'
    node0 = head + run
    scripts = (node0,) + ("exit 0\n",) * (len(group.hosts) - 1)
    return LaunchRequest(
        trial=number, hosts=tuple(group.hosts), scripts=scripts, paths=paths,
        files=rendered.files, timeout_s=None,  # the loop sets the study's limit
    )  # fmt: skip


@dataclass(frozen=True)
class Truth:
    """What the surface really gives for every valid config of the space.

    The target is the best config that really fits *and* that the memory screen admits (every
    method shares the screen, so none can reach a config it prunes); ``true_best`` is the best that
    really fits, to show what the screen's headroom costs.
    """

    step: dict[str, float]  # config key -> true step time, for the configs the screen admits
    oom: set[str]  # really OOM (launching them fails)
    falsely_pruned: set[str]  # really fit, but the memory model prunes them
    valid: int
    best_key: str
    best_step: float
    true_best_step: float
    space: Space
    """Every valid config, its predicted peak and its true step time: what the anchors see."""
    keep: frozenset[str] | None = None
    """The configs a study may launch (a replay's measured configs); None, the whole space."""
    profile: ClusterProfile | None = None
    """The cluster profile every search of a replay starts with (``replays.measured_profile``);
    None: the catalog's figures."""

    def good(self, key: str) -> bool:
        """Within 2 % of the best (a config the screen prunes counts too, for the anchors that
        have no screen)."""
        step = self.space.step.get(key)
        return step is not None and step <= self.best_step * (1 + WITHIN)

    @property
    def n_good(self) -> int:
        return sum(self.good(k) for k in self.step)


def truth(spec: StudySpec, surface: str, network: str = "profile") -> Truth:
    """Evaluate the surface in-process for every valid config (a replay: its measured rows, its
    cluster stated as ``network`` says: :data:`replays.NETWORKS`)."""
    import importlib.util

    if surface in replays.REPLAYS:
        return replay_truth(spec, surface, network)

    module_spec = importlib.util.spec_from_file_location("surfaces", SURFACES_PY)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    function = standin.default_point if surface == "builtin" else module.SURFACES[surface]
    report = enumerate_space(spec, keep_oom=True, with_time=False)
    admitted = {c.config.key() for c in report.viable}
    steps: dict[str, float] = {}
    oom: set[str] = set()
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # the stand-in checks it, as Megatron does
    for cand in [*report.viable, *report.oom]:
        args = standin.build_parser().parse_args(standin_args(spec, cand.config))
        with contextlib.redirect_stdout(io.StringIO()):  # its "using world size ..." lines
            topo = standin.validate_args(args, spec.world_size, None)
        point = function(standin.surface_variables(args, topo, standin.padded_vocab_size(args)))
        if point["memory_gib"] > 80.0:
            oom.add(cand.config.key())
        else:
            steps[cand.config.key()] = point["step_s"]
    reachable = {k: v for k, v in steps.items() if k in admitted}
    best_key = min(reachable, key=reachable.__getitem__)
    every = [*report.viable, *report.oom]
    space = Space(
        configs={c.config.key(): c.config for c in every},
        peak_gib={c.config.key(): c.memory.peak / GIB for c in every},
        admitted=admitted, gpu_gib=80.0, step=steps,
    )  # fmt: skip
    return Truth(
        step=reachable, oom=oom, falsely_pruned=set(steps) - admitted,
        valid=len(report.viable) + len(report.oom), best_key=best_key,
        best_step=reachable[best_key], true_best_step=min(steps.values()), space=space,
    )  # fmt: skip


def replay_truth(spec: StudySpec, name: str, network: str = "profile") -> Truth:
    """A replay's truth: its measured configs and OOM rows alone make the space
    (:mod:`benchmarks.replays`); under ``network="profile"`` its searches start from the profile
    of the cluster's measured link, where the rows cite one."""
    m = replays.measured(spec, name)
    reachable = {k: v for k, v in m.step.items() if k in m.admitted}
    best_key = min(reachable, key=reachable.__getitem__)
    space = Space(configs=dict(m.configs), peak_gib=dict(m.peak_gib), admitted=set(m.admitted),
                  gpu_gib=study_gpu(spec).memory_gib, step=dict(m.step))  # fmt: skip
    return Truth(
        step=reachable, oom=set(m.oom), falsely_pruned=set(m.step) - m.admitted,
        valid=len(m.configs), best_key=best_key, best_step=reachable[best_key],
        true_best_step=min(m.step.values()), space=space, keep=frozenset(m.configs),
        profile=replays.measured_profile(spec, name) if network == "profile" else None,
    )  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    runs: int
    found: bool
    oom_launches: int
    wall_s: float
    launches: int | None = None
    """Every launch until the study stopped by itself; None when cut at the target."""
    stop: str = ""
    keys: tuple[str, ...] = ()
    """The configs launched, in launch order."""
    values: tuple[float | None, ...] = ()
    """Each launch's measured step time (None: it measured none), in launch order."""


def search(spec: StudySpec, t: Truth, results: Path, until_stop: bool = False) -> Outcome:
    """Drive the real study loop until a good config is measured or the loop stops; with
    ``until_stop``, on until it stops by itself (its stop rules), counting every launch, and
    its trials are saved to the cluster's calibration as ``tune run`` does at its end."""
    start = time.perf_counter()
    loop = open_loop(spec, t, results)
    loop.poll_s = 0.0
    first: tuple[int, bool] | None = None
    try:
        loop.seed()
        while True:
            alive = loop.step()
            runs, found, ooms = tally(loop, t)
            if found and first is None:
                first = (runs, found)
            if (found and not until_stop) or not alive:
                break
            time.sleep(0.01)
        stop = loop.summary.stop_reason  # before the benchmark's own stop replaces it
        loop.request_stop("benchmark: target reached")
        loop.step()
        trials = loop.trials()
        if until_stop:
            record_study(spec, trials, loop.gpu.memory_gib, results)
    finally:
        loop.executor.close()
    runs, found = first or (t.valid, False)
    order = sorted((x for x in trials if x.user_attrs.get("launched")), key=lambda x: x.number)
    keys = tuple(str(x.user_attrs.get("key")) for x in order)
    values = tuple(float(x.value) if x.values else None for x in order)
    return Outcome(runs, found, ooms, time.perf_counter() - start,
                   len(keys) if until_stop else None, stop, keys, values)  # fmt: skip


def open_loop(spec: StudySpec, t: Truth, results: Path) -> StudyLoop:
    """The real study loop on ``t``'s configs, with the fast launcher; a replay's cluster profile
    is saved in ``results`` first, where ``tune profile`` puts one (``build_loop`` reads it)."""
    if t.profile is not None:
        replays.save_measured_profile(spec, t.profile, results)
    return build_loop(spec, results=str(results), launcher=fast_launcher, keep=t.keep)


def tally(loop: StudyLoop, t: Truth) -> tuple[int, bool, int]:
    """(launched runs up to the first good one, whether found, OOM launches so far)."""
    launched = sorted(
        (x for x in loop.trials() if x.user_attrs.get("launched")), key=lambda x: x.number
    )
    ooms = sum(x.user_attrs.get("outcome") == "oom" for x in launched)
    for i, x in enumerate(launched, 1):
        if x.user_attrs.get("outcome") == "ok" and t.good(str(x.user_attrs.get("key"))):
            return i, True, ooms
    return len(launched), False, ooms


DEFAULT_METHODS = "tune,tune-no-early-stop,tpe,random,grid,second,second-calibrated"
"""The runs table's methods; with ``--node-hours`` the default is tune and every anchor."""

SECOND_SEED = 100
"""The second study of the calibration comparison: another sampler seed and other noise."""


def run_method(
    surface: str, space: str, method: str, t: Truth, seeds: int, tmp: Path
) -> list[dict[str, Any]]:
    """Every seed of one method on one surface: one row each.

    ``tune``, ``tune-count-rule`` and ``tpe`` run on until their own stop rules end them
    (launches counted).
    ``second`` and ``second-calibrated``: a second tune study on the same surface (sampler seed
    and noise seed + SECOND_SEED), without and with the calibration a first ``tune`` study of
    the same seed saved (in the same results folder, so the same cluster)."""
    rows = []
    for seed in range(seeds):
        root = tmp / f"{space}-{surface}-{method}-{seed}"
        if method in ("second", "second-calibrated"):
            if method == "second-calibrated":
                first = study_from_mapping(study_data(surface, "tune", seed, t.valid, space))
                search(first, t, root, until_stop=True)
            data = study_data(surface, "tune", seed + SECOND_SEED, t.valid, space)
            data["name"] = f"eff-{surface}-{method}-{seed}"
            out = search(study_from_mapping(data), t, root)
        else:
            spec = study_from_mapping(study_data(surface, method, seed, t.valid, space))
            out = search(spec, t, root, until_stop=method in ("tune", "tpe", "tune-count-rule"))
        rows.append({"space": space, "surface": surface, "method": method, "seed": seed,
                     "runs": out.runs, "found": out.found, "oom_launches": out.oom_launches,
                     "launches": out.launches, "stop": out.stop,
                     "wall_s": round(out.wall_s, 2)})  # fmt: skip
    return rows


def summary_row(space: str, surface: str, method: str, rows: list[dict[str, Any]]) -> list[str]:
    """One line of the table for one method on one surface."""
    runs = [r["runs"] for r in rows]
    launches = [r["launches"] for r in rows if r.get("launches") is not None]
    known = sum(r.get("stop", "").startswith("the answer is known") for r in rows)
    return [space, surface, method, f"{statistics.mean(runs):.1f}",
            f"{statistics.median(runs):g}", f"{min(runs)}-{max(runs)}",
            str(sum(not r["found"] for r in rows)), str(sum(r["oom_launches"] for r in rows)),
            f"{statistics.mean(launches):.1f}" if launches else "",
            f"{known}/{len(rows)}" if launches else "",
            f"{statistics.mean(r['wall_s'] for r in rows):.1f}"]  # fmt: skip


def print_calibration_table(rows: list[dict[str, Any]]) -> None:
    """Runs to within 2 % of the best of the second study, per seed: without and with the
    calibration the first study saved."""
    runs = {(r["space"], r["surface"], r["seed"], r["method"]): r["runs"] for r in rows}
    cases = sorted({k[:3] for k in runs if k[3] == "second-calibrated" and (*k[:3], "second")
                    in runs})  # fmt: skip
    if not cases:
        return
    groups = sorted({c[:2] for c in cases})
    seeds = sorted({c[2] for c in cases})
    print("\nsecond study on the same surface, runs to within 2 % of the best: "
          "without / with the saved calibration")  # fmt: skip
    print("  ".join(["space/surface".ljust(22), *(f"seed {s}".ljust(8) for s in seeds), "mean"]))
    for space, surface in groups:
        cells, cold, warm = [], [], []
        for seed in seeds:
            a, b = runs.get((space, surface, seed, "second")), runs.get(
                (space, surface, seed, "second-calibrated"))  # fmt: skip
            cells.append(f"{a}/{b}".ljust(8))
            if a is not None and b is not None:
                cold.append(a)
                warm.append(b)
        mean = f"{statistics.mean(cold):.1f}/{statistics.mean(warm):.1f}"
        print("  ".join([f"{space}/{surface}".ljust(22), *cells, mean]))


# ----------------------------------------------------------------------------- node-hours


def launch_node_hours(spec: StudySpec, t: Truth, key: str) -> float:
    """What launching ``key`` costs: start-up (``search.startup_min``, charged per launch) plus
    the iterations it runs (the warm-up and the estimator's minimum, capped by ``train_iters``:
    :func:`tuner.space.cost.trial_cost`) at its true step time; a config that runs out of memory
    fails in its first step: start-up only."""
    return trial_cost(spec, t.space.step.get(key)).node_hours


def spending(spec: StudySpec, t: Truth, keys: tuple[str, ...] | list[str]
             ) -> tuple[float | None, float]:  # fmt: skip
    """(node-hours up to and including the first launch within 2 % of the best, None when none
    was; node-hours of every launch)."""
    total, to_best = 0.0, None
    for key in keys:
        total += launch_node_hours(spec, t, key)
        if to_best is None and t.good(key):
            to_best = total
    return to_best, total


ANCHOR_NAMES = tuple(ANCHORS)


def node_hour_rows(surface: str, space: str, t: Truth, seeds: int, tmp: Path,
                   methods: tuple[str, ...]) -> list[dict[str, Any]]:  # fmt: skip
    """One row per method and seed: node-hours to within 2 % of the best and in all. ``tune``
    runs the real study loop until its own stop rules end it; the anchors are emulated
    (``benchmarks/anchors.py``) on the same truth."""
    rows = []
    spec = study_from_mapping(study_data(surface, "tune", 0, t.valid, space))
    for method in methods:
        for seed in range(seeds):
            if method == "tune":
                data = study_data(surface, "tune", seed, t.valid, space)
                data["name"] = f"nh-{surface}-{seed}"
                out = search(study_from_mapping(data), t, tmp / f"nh-{space}-{surface}-{seed}",
                             until_stop=True)  # fmt: skip
                keys, stop = list(out.keys), out.stop
            else:
                keys = ANCHORS[method](t.space, random.Random(seed))
                stop = "its own end"
            to_best, total = spending(spec, t, keys)
            rows.append({"space": space, "surface": surface, "method": method, "seed": seed,
                         "to_best_nh": to_best, "all_nh": total, "launches": len(keys),
                         "launch_nh": [launch_node_hours(spec, t, k) for k in keys],
                         "stop": stop})  # fmt: skip
    return rows


def _median(values: list[float | None]) -> float:
    """The median, a miss (None) counted as infinitely costly."""
    return statistics.median(math.inf if v is None else v for v in values)


def print_node_hour_table(rows: list[dict[str, Any]]) -> bool:
    """The per-surface table and the targets of issue 33; True when every target holds."""
    groups = sorted({(r["space"], r["surface"]) for r in rows})
    header = ["space", "surface", "method", "to best (median)", "in all (median)",
              "launches (median)", "misses", "stop (tune)"]  # fmt: skip
    table, verdicts, ok = [], [], True
    for space, surface in groups:
        mine = [r for r in rows if (r["space"], r["surface"]) == (space, surface)]
        medians: dict[str, float] = {}
        for method in dict.fromkeys(r["method"] for r in mine):
            rs = [r for r in mine if r["method"] == method]
            medians[method] = _median([r["to_best_nh"] for r in rs])
            stops = ""
            if method == "tune":
                kinds = [r["stop"].split(":")[0] for r in rs]
                stops = ", ".join(f"{k} {kinds.count(k)}" for k in dict.fromkeys(kinds))
            table.append([space, surface, method, f"{medians[method]:.3f}",
                          f"{_median([r['all_nh'] for r in rs]):.3f}",
                          f"{statistics.median(r['launches'] for r in rs):g}",
                          str(sum(r["to_best_nh"] is None for r in rs)), stops])  # fmt: skip
        tune = [r for r in mine if r["method"] == "tune"]
        if not tune:
            continue
        launch = statistics.median(x for r in tune for x in r["launch_nh"])
        in_all, to_best = _median([r["all_nh"] for r in tune]), medians["tune"]
        first = in_all <= to_best + 1.5 * launch
        anchors = [m for m in medians if m != "tune"]
        second = all(to_best < medians[m] for m in anchors)
        ok = ok and first and second
        verdicts.append(
            f"{space}/{surface}: tune in all {in_all:.3f} <= to best {to_best:.3f} + 1.5 x "
            f"median launch {launch:.3f} = {to_best + 1.5 * launch:.3f}: "
            f"{'yes' if first else 'NO'}; to best below every anchor's "
            f"({', '.join(f'{m} {medians[m]:.3f}' for m in anchors)}): "
            f"{'yes' if second else 'NO'}"
        )
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    print("\nnode-hours (each study's nodes per trial: 2 on the synthetic surfaces, the measured "
          "run's on a replay; start-up charged per launch plus the iterations run)")  # fmt: skip
    for r in [header, ["-" * w for w in widths], *table]:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    print()
    for line in verdicts:
        print(line)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--spaces", default="small,full")
    parser.add_argument("--surfaces", default="high_tp,pipeline,micro_batch,rugged,builtin")
    parser.add_argument("--methods", default=DEFAULT_METHODS)
    parser.add_argument("--json", help="write every search's figures here")
    parser.add_argument(
        "--node-hours",
        action="store_true",
        help="node-hours of tune and the anchors' emulations (issue 33)",
    )
    parser.add_argument(
        "--replay-network", choices=replays.NETWORKS, default="profile",
        help="a replay's network: its cluster profile's measured link where the rows cite one "
        "(as after tune profile), or the catalog's figures",
    )  # fmt: skip
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("tuner").setLevel(logging.WARNING)
    if args.node_hours:
        return node_hours_main(args)
    rows: list[dict[str, Any]] = []
    table: list[list[str]] = []
    ratios: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="tuner-eff-") as tmp:
        for space in args.spaces.split(","):
            for surface in args.surfaces.split(","):
                base = study_from_mapping(study_data(surface, "tune", 0, 1, space))
                t = truth(base, surface, args.replay_network)
                print(f"{space}/{surface}: {t.valid} valid configs, {len(t.oom)} really OOM, "
                      f"{len(t.falsely_pruned)} fit but pruned by the memory model; best "
                      f"{t.best_step:.3f} s ({t.best_key}), {t.n_good} within 2 %; the best that "
                      f"fits at all is {t.best_step / t.true_best_step - 1:.1%} faster",
                      flush=True)  # fmt: skip
                means: dict[str, float] = {}
                for method in args.methods.split(","):
                    mine = run_method(surface, space, method, t, args.seeds, Path(tmp))
                    rows += mine
                    means[method] = statistics.mean(r["runs"] for r in mine)
                    table.append(summary_row(space, surface, method, mine))
                naive = (t.valid + 1) / (t.n_good + 1)
                table.append([space, surface, "grid, no memory model (expected)",
                              f"{naive:.1f}", "", "", "", "", "", "", ""])  # fmt: skip
                if "tune" in means and "grid" in means:
                    share = means["tune"] / means["grid"]
                    ratios.setdefault(space, {})[surface] = share
                    table.append([space, surface, "tune / grid", f"{share:.0%}",
                                  "", "", "", "", "", "", ""])  # fmt: skip
    header = ["space", "surface", "method", "mean runs", "median", "range", "misses",
              "OOM launches", "launches", "known-stop", "s/search"]  # fmt: skip
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    print()
    for r in [header, ["-" * w for w in widths], *table]:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    for space, shares in ratios.items():
        for group, names in (("the 3 issue surfaces", SHAPES), ("held out", HELD_OUT)):
            part = [v for name, v in shares.items() if name in names]
            tune_runs = [r["runs"] for r in rows if r["space"] == space and r["method"] == "tune"
                    and r["surface"] in names]  # fmt: skip
            if part:
                print(f"{space}, {group}: tune needs {statistics.mean(part):.0%} of the grid's "
                      f"runs on average (target <= 25 %), {statistics.mean(tune_runs):.1f} runs "
                      "(target <= 8 on ~50 configs)")  # fmt: skip
    print_calibration_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def studies(spaces: str, surfaces: str) -> list[tuple[str, str]]:
    """(space, surface) pairs: each synthetic surface in each space; each replay once, in its
    own space (``replay``). ``replays`` names every replay of :data:`replays.REPLAYS`."""
    names = [n for s in surfaces.split(",") for n in (replays.REPLAYS if s == "replays" else [s])]
    synthetic = [(space, n) for space in spaces.split(",") for n in names
                 if n not in replays.REPLAYS]  # fmt: skip
    return synthetic + [("replay", n) for n in names if n in replays.REPLAYS]


def node_hours_main(args: argparse.Namespace) -> int:
    """``--node-hours``: tune and the anchors on every surface; exit 1 when a target fails."""
    methods = ("tune", *ANCHOR_NAMES) if args.methods == DEFAULT_METHODS else tuple(
        args.methods.split(","))  # fmt: skip
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tuner-eff-") as tmp:
        for space, surface in studies(args.spaces, args.surfaces):
            base = study_from_mapping(study_data(surface, "tune", 0, 1, space))
            t = truth(base, surface, args.replay_network)
            print(f"{space}/{surface}: {t.valid} valid configs, best {t.best_step:.3f} s, "
                  f"{t.n_good} within 2 %", flush=True)  # fmt: skip
            rows += node_hour_rows(surface, space, t, args.seeds, Path(tmp), methods)
    ok = print_node_hour_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
