"""The study loop at scale: 64 trials in flight over 1,024 nodes, and a storage of 10,000 trials.

    python benchmarks/loop_scale.py [--trials 10000] [--launch 192] [--nodes 1024]
                                    [--nodes-per-trial 16] [--hold 2.0] [--storage URL]
                                    [--saved-calibration own|other]

Issue 36's targets: a scheduling decision (claim nodes, launch, record) under 50 ms of the
tuner's CPU with 64 trials in flight over a 1,024-node pool; one storage holding 10,000 trials
without ``tune leaderboard`` or ``tune report`` slowing past a few seconds.

1. **The storage**: an SQLite study (``--storage`` for another URL) filled with ``--trials``
   finished trials of the gpt-70b model on 16-node trials, as the loop records them (configs,
   predictions, measurements, hosts). The space has about 900 viable configs, so the stored
   trials go round the first 80 % of the model's ranking (a long study re-measuring configs)
   and leave the rest for the sampler; every fourth round is OOMs, failed launches and
   predicted refusals.
2. **Reading it**: ``tune leaderboard`` and ``tune report`` as a user runs them (a subprocess:
   start-up included), reading all trials once (``get_trials``) and again (Optuna's cached RDB
   storage re-reads only unfinished trials), and the model sampler's ask over them.
3. **The loop**: ``build_loop`` on the same storage with 1,024 local node slots and a fake
   executor whose jobs write a Megatron log and end after ``--hold`` seconds (the tuner's own
   work only: no process starts), ``--launch`` more trials, 64 in flight. CPU time of the
   loop's thread per decision, split into claim (``Scheduler.acquire``), ask and screen
   (``StudyLoop.next_config``), launch, record (``_record``) and the rest of a pass (reading
   the trials, the stop rules); "per decision" adds those up over the launches. What runs
   once per run is apart: the sampler's candidates (its first ask), its first fold of the
   stored trials (also printed added back in, as earlier rounds counted it), the seed, and the
   end's save of the cluster's calibration (every measured trial in YAML, a config's repeats
   as short entries of its row: about a second at 10,000).
   The thread's CPU time leaves out BLAS worker threads: run with ``OPENBLAS_NUM_THREADS=1``
   to count the fits' linear algebra in full.

4. **A saved calibration** (``--saved-calibration``): the stored trials saved as the cluster's
   calibration before the loop, as a second run of the study finds them (``own``) or a study
   of the same setup under another name does (``other``: every observation a row of the
   sampler's fits, folded into its prior once: :mod:`tuner.search.fold`).

Figures are printed, never asserted (a shared machine's load only adds to wall time; CPU time
is what the load moves least).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.api import estimate  # noqa: E402
from tuner.calibrate.store import record_study  # noqa: E402
from tuner.config.parallel import ParallelConfig  # noqa: E402
from tuner.launch import LaunchRequest  # noqa: E402
from tuner.launch.base import Executor, NodeProcess  # noqa: E402
from tuner.layout import ResultsLayout  # noqa: E402
from tuner.models.memory.estimate import GIB  # noqa: E402
from tuner.outcome import Outcome  # noqa: E402
from tuner.search.sampler import ModelGuidedSampler  # noqa: E402
from tuner.space.enumerate import enumerate_space, study_gpu  # noqa: E402
from tuner.space.trials import config_params, distributions  # noqa: E402
from tuner.spec.file import load_study  # noqa: E402
from tuner.spec.study import StudySpec  # noqa: E402
from tuner.study import loop as loop_module  # noqa: E402
from tuner.study.build import build_loop  # noqa: E402
from tuner.study.loop import StudyLoop  # noqa: E402
from tuner.study.row_attrs import ROW_ATTR, ROW_KEYS, kept_text  # noqa: E402
from tuner.study.storage import open_storage, open_study  # noqa: E402

STUDY = """\
name: scale
model: {{preset: gpt-70b}}
training: {{global_batch_size: 1024, precision: bf16}}
cluster: {{gpu: h100-sxm-80gb, gpus_per_node: 8, num_nodes: {nodes}, executor: local}}
framework: megatron
launch: {{template: megatron_gpt, train_iters: 30, warmup_iters: 10,
         megatron_path: /opt/Megatron-LM, train_args: [--mock-data]}}
space:
  tp: [1, 2, 4, 8]
  pp: auto
  cp: [1, 2]
  vp: [1, 2, 4]
  micro_batch_size: [1, 2, 4]
  sequence_parallel: [true, false]
  recompute: [none, selective, full]
  distributed_optimizer: [true, false]
search: {{sampler: model, n_trials: {n_trials}, nodes_per_trial: {per_trial},
          trial_timeout_min: 20, heartbeat_s: 30, stop_chance: null,
          early_stop_trials: null}}
"""


def megatron_log(step_s: float, peak_gib: float, iters: int = 30) -> str:
    """A Megatron-LM log a finished trial leaves: iteration lines and one memory report."""
    lines = []
    for i in range(1, iters + 1):
        lines.append(f" [2026-01-01 00:00:00] iteration {i:8d}/{iters:8d} | consumed samples: "
                     f"{i * 1024:12d} | elapsed time per iteration (ms): {step_s * 1000:.1f} | "
                     "learning rate: 1.0E-04 | global batch size:  1024 | lm loss: 2.0E+00 | "
                     "loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 | "
                     "number of nan iterations:   0 |")  # fmt: skip
        if i == 10:
            mb = peak_gib * 1024
            lines.append(f"[Rank 0] (after 10 iterations) memory (MB) | allocated: {mb * 0.6} | "
                         f"max allocated: {mb} | reserved: {mb * 1.05} | max reserved: "
                         f"{mb * 1.05}")  # fmt: skip
    return "\n".join(lines) + "\n"


class _Done(NodeProcess):
    """A node whose script wrote its log and exits 0 once ``hold_s`` has passed."""

    def __init__(self, log: Path, text: str, until: float) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text)
        self.until = until

    def poll(self) -> int | None:
        return 0 if time.monotonic() >= self.until else None


class FakeExecutor(Executor):
    """The executor's bookkeeping (``Job``, fan-out, files) with no process behind it: each
    node's "script" is the log to write (:func:`fake_launcher`)."""

    def __init__(self, hold_s: float) -> None:
        super().__init__(max_parallel=16)
        self.hold_s = hold_s

    def _prepare_node(self, request: LaunchRequest, node_rank: int) -> None:
        return None

    def _start_node(self, request: LaunchRequest, node_rank: int, token: str) -> NodeProcess:
        log = request.paths.node_log(node_rank)
        text = request.scripts[node_rank] if node_rank == 0 else ""
        return _Done(log, text, time.monotonic() + self.hold_s)

    def _reap_node(self, request: LaunchRequest, node_rank: int, token: str,
                   grace_s: float) -> list[str]:  # fmt: skip
        return []

    def _run_check(self, host: str, argv: Any) -> tuple[int, str, str]:
        return 0, "", ""


def fake_launcher(spec: StudySpec, config: ParallelConfig, number: int, group: Any, paths: Any,
                  master: str) -> LaunchRequest:  # fmt: skip
    """The launch "script": the log of a run 1.3x slower than predicted (a little more for some
    trials, so that configs differ), at 40 GiB. The step must be one the hardware allows: a
    step faster than the FLOPs at the GPUs' peak is recorded as a corrupt measurement
    (``tuner.models.time.breakdown.fastest_step_s``), and a study of such trials has no best,
    so the sampler never values a launch (the fixed 1 s step this wrote did that for gpt-70b)."""
    del master
    step = 1.3 * _predicted_step(spec, config) * (1.0 + 0.001 * (number % 97))
    return LaunchRequest(trial=number, hosts=group.hosts, paths=paths,
                         scripts=(megatron_log(step, 40.0),)
                         + ("",) * (len(group.hosts) - 1))  # fmt: skip


_PREDICTED: dict[str, float] = {}


def _predicted_step(spec: StudySpec, config: ParallelConfig) -> float:
    """The model's step of ``config`` (seconds), once per config."""
    key = config.key()
    if key not in _PREDICTED:
        time = estimate(spec, config).time
        _PREDICTED[key] = time.step if time is not None else 1.0
    return _PREDICTED[key]


# ----------------------------------------------------------------------------- the storage


def fill(spec: StudySpec, url: str, results: Path, n: int) -> tuple[float, int]:
    """Add ``n`` finished trials to a new study (seconds taken, configs left untried)."""
    report = enumerate_space(spec)
    ranked = report.ranked()
    cycle = ranked[: int(len(ranked) * 0.8)]
    hosts = [f"local-{i}" for i in range(spec.search.nodes_per_trial)]  # type: ignore[arg-type]
    trials = []
    for number in range(n):
        cand = cycle[number % len(cycle)]
        c = cand.config
        step = cand.time.step if cand.time else 1.0
        attrs: dict[str, Any] = {
            "config": dataclasses.asdict(c), "key": c.key(),
            "predicted_step_s": step, "predicted_peak_gib": round(cand.memory.peak / GIB, 3),
            "predicted_allocated_gib": round(cand.memory.allocated / GIB, 3),
            "predicted_reserved_gib": round(cand.memory.reserved / GIB, 3),
            "predicted_activation_share": round(cand.memory.activation_share, 4),
            "predicted_peak_stage": cand.memory.stage, "predicted_peak_phase": cand.memory.phase,
            "predicted_mfu": 0.4, "hosts": hosts, "worker": "bench:1", "launched": True,
            "token": "0" * 32, "duration_s": 300.0,
        }  # fmt: skip
        kind = (number // len(cycle)) % 4
        state, value = optuna.trial.TrialState.COMPLETE, step * 1.3
        if kind == 3 and number % 3 == 0:
            attrs |= {"outcome": str(Outcome.OOM), "reason": "CUDA out of memory"}
            state, value = optuna.trial.TrialState.PRUNED, None
        elif kind == 3 and number % 3 == 1:
            attrs |= {"outcome": str(Outcome.LAUNCH_ERROR), "reason": "template error"}
            state, value = optuna.trial.TrialState.PRUNED, None
        else:
            attrs |= {"outcome": str(Outcome.OK), "reason": None, "step_time_s": value,
                      "iterations": 20, "peak_memory_gib": cand.memory.allocated / GIB * 1.1,
                      "tokens_per_s": 1024 * 4096 / value, "mfu": 0.35, "tflops_per_gpu": 350.0,
                      "samples_per_s": 1024 / value}  # fmt: skip
        shown = sorted((k, json.dumps(v)) for k, v in attrs.items() if k in ROW_KEYS)
        attrs[ROW_ATTR] = json.loads(kept_text(shown))  # as the record keeps them together
        trials.append((number, state, value, config_params(c), attrs))
    layout = ResultsLayout(results, spec.name)
    study = open_study(spec, open_storage(url, layout), optuna.samplers.RandomSampler(),
                       force=False, url=url, layout=layout)  # fmt: skip
    study.set_user_attr("space_counts", report.counts())  # as the loop's seed records them
    t0 = time.perf_counter()
    insert(open_storage(url, layout), study._study_id, distributions(spec), trials)
    return time.perf_counter() - t0, len(ranked) - len(cycle)


def insert(storage: Any, study_id: int, dists: dict[str, Any], trials: list[Any]) -> None:
    """The trials' rows in Optuna's tables, in one transaction (``Study.add_trials`` takes about
    0.1 s of CPU a trial through the ORM: a quarter of an hour for 10,000). Setting up, not
    measured."""
    from optuna.storages._rdb import models as m

    if not trials:
        return
    now = datetime.datetime.now()
    as_json = {k: optuna.distributions.distribution_to_json(d) for k, d in dists.items()}
    with storage.engine.begin() as conn:
        first = conn.execute(sa.select(sa.func.max(m.TrialModel.trial_id))).scalar() or 0
        rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for k, (number, state, value, params, attrs) in enumerate(trials, first + 1):
            rows["trials"].append({"trial_id": k, "number": number, "study_id": study_id,
                                   "state": state.name, "datetime_start": now,
                                   "datetime_complete": now})  # fmt: skip
            for name, v in params.items():
                rows["params"].append({"trial_id": k, "param_name": name,
                                       "param_value": dists[name].to_internal_repr(v),
                                       "distribution_json": as_json[name]})  # fmt: skip
            for key, v in attrs.items():
                rows["attrs"].append({"trial_id": k, "key": key, "value_json": json.dumps(v)})
            if value is not None:
                rows["values"].append({"trial_id": k, "objective": 0, "value": value,
                                       "value_type": "FINITE"})  # fmt: skip
        conn.execute(m.TrialModel.__table__.insert(), rows["trials"])
        conn.execute(m.TrialParamModel.__table__.insert(), rows["params"])
        conn.execute(m.TrialUserAttributeModel.__table__.insert(), rows["attrs"])
        conn.execute(m.TrialValueModel.__table__.insert(), rows["values"])


def cli(args: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one ``tune`` command."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tuner.cli.main", *args], cwd=cwd, check=True,
                   capture_output=True)  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall, CPU of this thread) seconds of ``fn()``."""
    c0, t0 = time.thread_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.thread_time() - c0


# ----------------------------------------------------------------------------- the loop


class Meter:
    """CPU time of the loop's thread by phase (nested phases counted in the innermost)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self._stack: list[tuple[str, float]] = []
        self._thread = threading.get_ident()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if threading.get_ident() != self._thread:  # the heartbeat thread: not a decision
            yield
            return
        now = time.thread_time()
        if self._stack:
            outer, since = self._stack[-1]
            self.cpu[outer] += now - since
        self._stack.append((name, now))
        try:
            yield
        finally:
            end = time.thread_time()
            _, since = self._stack.pop()
            self.cpu[name] += end - since
            self.count[name] += 1
            if self._stack:
                outer, _ = self._stack[-1]
                self._stack[-1] = (outer, end)

    def wrap(self, obj: Any, method: str, name: str) -> None:
        real = getattr(obj, method)

        def wrapped(*a: Any, **k: Any) -> Any:
            with self.phase(name):
                return real(*a, **k)

        setattr(obj, method, wrapped)


def run_loop(spec_path: Path, url: str, results: Path, launch: int, hold_s: float) -> None:
    spec = load_study(str(spec_path))
    loop = build_loop(spec, storage=url, results=str(results), force=True,
                      executor=FakeExecutor(hold_s), launcher=fake_launcher)  # fmt: skip
    done = loop.runs_done(loop.trials())
    loop.n_trials = done + launch
    loop.poll_s = 0.05
    meter = Meter()
    for method, name in (("step", "pass"), ("next_config", "ask+screen"), ("launch", "launch"),
                         ("_record", "record"), ("trials", "read trials")):  # fmt: skip
        meter.wrap(loop, method, name)
    sampler = loop.study.sampler
    if isinstance(sampler, ModelGuidedSampler):  # once per worker: the candidates' arrays
        meter.wrap(sampler, "_candidates", "candidates")
        first_fold(meter, sampler)
    meter.wrap(loop.scheduler, "acquire", "claim")
    meter.wrap(loop.scheduler, "release", "release")
    meter.wrap(loop, "seed", "seed")  # once, before the first pass
    meter.wrap(loop, "recover", "recover")  # once a heartbeat period
    meter.wrap(loop_module, "keep", "save calibration")  # once, at the end
    peak = [0]

    def on_update(lp: StudyLoop) -> None:
        peak[0] = max(peak[0], len(lp.running))

    loop.on_update = on_update
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    summary = loop.run()
    wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
    loop.executor.close()
    decisions = max(1, meter.count["launch"])
    if meter.count["read trials"]:
        FIGURES["read"] = (peak[0], meter.cpu["read trials"] / meter.count["read trials"])
    print(f"\nloop: {meter.count['launch']} launched, {meter.count['record']} recorded, "
          f"{peak[0]} in flight at most, over {len(spec.node_names)} nodes "
          f"({spec.search.nodes_per_trial} per trial), {done} trials stored before; "
          f"stop: {summary.stop_reason}")  # fmt: skip
    once = meter.cpu["candidates"]  # the sampler's first ask only: the rest are cache hits
    print(f"  loop thread CPU {cpu:.1f} s in {wall:.1f} s wall; per launched trial "
          f"{cpu / decisions * 1000:.1f} ms, {(cpu - once) / decisions * 1000:.1f} ms less the "
          f"sampler's one-off candidates ({once:.2f} s, in its first ask)")  # fmt: skip
    ends = sum(meter.cpu[k] for k in ("seed", "save calibration"))
    decided = sum(meter.cpu[k] for k in DECISION)
    folded = meter.cpu["first fold"]
    print(f"  per decision {decided / decisions * 1000:.1f} ms CPU ({' + '.join(DECISION)}, "
          f"the sampler's one-off candidates and first fold left out; "
          f"{(decided + folded) / decisions * 1000:.1f} ms with its first fold); the run's ends "
          f"once: {ends:.2f} s (seed, save calibration); else "
          f"{cpu - decided - ends - once - folded:.2f} s")  # fmt: skip
    for name in ("claim", "ask+screen", "candidates", "first fold", "launch", "record", "release",
                 "read trials", "recover", "pass", "seed", "save calibration"):  # fmt: skip
        n = meter.count[name]
        if n:
            print(f"  {name:12s} {n:6d} calls  {meter.cpu[name]:7.2f} s CPU  "
                  f"{meter.cpu[name] / n * 1000:8.2f} ms/call  "
                  f"{meter.cpu[name] / decisions * 1000:8.2f} ms/launch")  # fmt: skip


def first_fold(meter: Meter, sampler: ModelGuidedSampler) -> None:
    """The sampler's first fold of the stored trials (each finished trial read once per worker,
    :mod:`tuner.search.observed`) as a phase of its own: a one-off of the worker's start, like
    its candidates; the folds of the trials recorded after it are in the phases that read."""
    observed = getattr(sampler, "_observed", None)
    if observed is None or not hasattr(observed, "_update"):
        return
    update = observed._update

    def once(trials: Any) -> Any:
        observed._update = update  # the later reads: counted where they are read
        with meter.phase("first fold"):
            return update(trials)

    observed._update = once


DECISION = ("claim", "ask+screen", "launch", "record", "release", "read trials", "recover",
            "pass")  # fmt: skip
"""The phases of the loop's passes: what a scheduling decision costs, spread over the launches
(nested phases counted in the innermost, so these add up without overlap)."""

FIGURES: dict[str, tuple[int, float]] = {}
"""What :func:`breaks_first` reads: (trials, CPU s of one sampler ask), (trials in flight,
CPU s of one read of the trials)."""


def breaks_first() -> None:
    """Where the loop would pass its 50 ms per decision first as the study grows, from the
    figures measured above (each cost and what it grows with)."""
    print("\nwhere it breaks first at larger scale:")
    if "ask" in FIGURES:
        n, cpu = FIGURES["ask"]
        print(f"  1. the model sampler's ask: {cpu * 1000:.0f} ms CPU over {n} stored trials. "
              "The finished trials are folded once each (tuner.search.observed for the "
              "sampler, tuner.study.digest for the screen and the run count), a fit of the "
              "same arrays is kept (a re-measured config adds no row), and past as many "
              "measured configs as features the fit's covariance is kept from ask to ask "
              "(tuner.search.normal: a newly measured config is a rank update, F^2 each; the "
              "memory fit's OOM passes share one covariance), each open config is predicted "
              "once per fit and the running configs are believed from the kept products. "
              "What grows is the walk over every finished trial of each read (linear in the "
              "trials: a few ms at 10,000) and the first prediction after a new measurement "
              "(N F^2 over the N open configs).")  # fmt: skip
    if "read" in FIGURES:
        flight, cpu = FIGURES["read"]
        print(f"  2. reading the trials: {cpu * 1000:.1f} ms CPU a read with {flight} in flight "
              "(every unfinished trial is read again: linear in the trials in flight), several "
              "reads per pass (a pass that launches: the read under the budget lease serves "
              "the ask). Then Optuna's own trial creation through its ORM (an insert, then a "
              "read of the new trial).")  # fmt: skip
    print("  3. a saved calibration of another study (--saved-calibration other): its rows are "
          "folded into the sampler's prior once per run (tuner.search.fold), its OOMs kept as "
          "one row per config; an ask still costs some 15 ms more than without it at 10,000 "
          "(not profiled yet), and the calibration file grows across studies by an entry per "
          "measured trial (its save at the end).")  # fmt: skip
    print(
        "  (the per-launched-trial figure also carries the end's one-off save of the cluster's "
        "calibration, every measured trial in YAML through libyaml (a config's repeats as short "
        "entries of its row): about a second at 10,000, the file "
        "read again only if another worker changed it; the per-decision figure leaves it out)"
    )
    print("  4. the report: the read and the imports (about half its CPU), Optuna's views "
          "(linear in the completed trials); its page grows by a leaderboard row and a view "
          "per trial (the figures draw each config's spread past 2,000 trials, and the "
          "allocator is simulated, and a measured trial's log tail kept, only for the configs "
          "they break down: tuner.report.shown).")  # fmt: skip


def main() -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10_000)
    p.add_argument("--launch", type=int, default=192)
    p.add_argument("--nodes", type=int, default=1024)
    p.add_argument("--nodes-per-trial", type=int, default=16)
    p.add_argument("--hold", type=float, default=2.0, help="seconds a fake trial runs")
    p.add_argument("--storage", default=None, help="SQLAlchemy URL (default: SQLite)")
    p.add_argument("--skip-loop", action="store_true")
    p.add_argument("--skip-reads", action="store_true", help="no leaderboard, report, asks")
    p.add_argument("--dir", help="keep the storage here and reuse it (default: a temporary one)")
    p.add_argument("--saved-calibration", choices=("own", "other"), default=None,
                   help="before the loop, save the stored trials as the cluster's calibration: "
                   "as this study's (run again) or another study's of the same setup")  # fmt: skip
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tuner-loop-scale-") as tmp:
        base = Path(args.dir or tmp)
        spec_path = base / "scale.yaml"
        spec_path.write_text(STUDY.format(nodes=args.nodes, per_trial=args.nodes_per_trial,
                                          n_trials=args.trials + args.launch))  # fmt: skip
        spec = load_study(str(spec_path))
        results = base / "results"
        url = args.storage or f"sqlite:///{results / 'scale' / 'study.db'}"
        if args.storage is None and not (results / "scale" / "study.db").exists():
            (results / "scale").mkdir(parents=True, exist_ok=True)
            took, left = fill(spec, url, results, args.trials)
            print(f"storage: {args.trials} trials added in {took:.1f} s "
                  f"({url.split(':')[0]}); {left} viable configs left untried")  # fmt: skip
        if args.trials and not args.skip_reads:
            reads(args, spec_path, spec, url, results)
        if args.saved_calibration:
            save_history(spec, url, results, args.saved_calibration)
        if not args.skip_loop:
            run_loop(spec_path, url, results, args.launch, args.hold)
        breaks_first()
        print(f"(pid {os.getpid()}; CPU: this process's thread or the child's)")
    return 0


def save_history(spec: StudySpec, url: str, results: Path, whose: str) -> None:
    """The stored trials as the cluster's saved calibration (what a finished run leaves), under
    this study's name (``own``: the sampler leaves its own trials out) or another's
    (``other``: every observation is a row of the sampler's fits). Setting up, not measured."""
    storage = open_storage(url, ResultsLayout(results, spec.name))
    study = optuna.load_study(study_name=spec.name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    named = spec if whose == "own" else dataclasses.replace(spec, name=f"{spec.name}-before")
    saved = record_study(named, trials, study_gpu(spec).memory_gib, results)
    print(f"saved calibration: {len(saved.observations)} observations ({whose})")


def reads(args: argparse.Namespace, spec_path: Path, spec: StudySpec, url: str,
          results: Path) -> None:  # fmt: skip
    """The commands and calls that read the whole storage."""
    base = spec_path.parent
    common = ["--study", str(spec_path), "--results", str(results)]
    if args.storage:
        common += ["--storage", args.storage]
    for name, cmd in (("tune leaderboard", ["leaderboard", *common]),
                      ("tune leaderboard --all", ["leaderboard", "--all", *common]),
                      ("tune best", ["best", *common]),
                      ("tune report", ["report", *common])):  # fmt: skip
        wall, cpu = cli(cmd, base)
        print(f"{name:24s} wall {wall:6.2f} s  CPU {cpu:6.2f} s")
    report = results / "scale" / "report.html"
    if report.exists():
        print(f"{'report.html':24s} {report.stat().st_size / 2**20:.1f} MiB")
    storage = open_storage(url, ResultsLayout(results, spec.name))
    study = optuna.load_study(study_name=spec.name, storage=storage)
    wall, cpu = timed(lambda: study.get_trials(deepcopy=False))
    print(f"{'get_trials, first':24s} wall {wall:6.2f} s  CPU {cpu:6.2f} s")
    wall, cpu = timed(lambda: study.get_trials(deepcopy=False))
    print(f"{'get_trials, again':24s} wall {wall:6.3f} s  CPU {cpu:6.3f} s")
    sampler = ModelGuidedSampler(spec, seed=0)
    trials = study.get_trials(deepcopy=False)
    wall, cpu = timed(lambda: sampler.choose(trials))
    print(f"{'sampler ask, first':24s} wall {wall:6.2f} s  CPU {cpu:6.2f} s (enumerates)")
    wall, cpu = timed(lambda: sampler.choose(trials))
    print(f"{'sampler ask, again':24s} wall {wall:6.3f} s  CPU {cpu:6.3f} s")
    FIGURES["ask"] = (len(trials), cpu)


if __name__ == "__main__":
    sys.exit(main())
