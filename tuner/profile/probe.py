"""The framework probe (``tune profile --probe``): the study's own launch at 1 and a few layers.

A few points of the space (:func:`probe_runs`) run the study's launch template, with the study's
model at reduced depth (1 layer per stage and :func:`probe_depths`' deeper one; hidden size, heads,
sequence and vocabulary unchanged) and :data:`PROBE_ITERS` iterations each, through the study's own
executor. All of them are one :class:`~tuner.launch.LaunchRequest`: each node runs one script that
starts the points one after the other, so the local executor starts one process group, SSH one
session per node and Slurm one allocation (one batch job whose steps are the points), never one
queued job per point. Each point's output is framed by :data:`POINT` lines in the node logs and
parsed by the framework's own log parser; :mod:`tuner.profile.stack_terms` turns the differences
into measured terms and saves them beside the cluster profile.

Step times under a drifting load: a script that runs every point in one process
(``launch.probe_one_process``) may interleave their timed steps, one step of each point per
round (:data:`INTERLEAVED`; the DeepSpeed workload does on CPU ranks). The rows then carry each
sample's round, and the terms read each point against a reference point by the median of their
paired ratios (:func:`tuner.profile.paired.paired_ratio`), which a load common to a round does
not move.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tuner.config.parallel import ParallelConfig
from tuner.errors import LaunchError
from tuner.layout import TrialPaths
from tuner.logs import parse_log
from tuner.profile.probe_rows import ProbeResult as ProbeResult
from tuner.profile.probe_rows import ProbeRow as ProbeRow
from tuner.profile.probe_rows import ProbeRun as ProbeRun
from tuner.space.enumerate import iter_configs, study_violations
from tuner.spec.study import StudySpec

PROBE_ITERS = 11
"""Iterations of each probe run: the first (warm-up) and ten after it, so that interleaved points
run five blocks of two rounds (:func:`tuner.profile.paired.paired_ratios`): with three, one
block that a burst of load hit moved a median of three ratios by its whole error (the CPU demo's
block ratios spread 10-20% under a load of 6-8 on two cores). A run's start (interpreter,
imports, process group, engine) costs more than ten of its steps on the demos, so each iteration
cut is a small saving; the warm-up is detected, not assumed long."""
PROBE_WARMUP = 1
"""Iterations always left out of the median: the first optimizer step builds the optimizer's
lazy state (Adam's moments, ZeRO's partitions), the autograd graph's first allocations and the
workloads' memory accounting."""
WARM_SLOW = 1.25
"""After those, a leading iteration slower than this times the median of the ones after it is
still warming up (allocator growth, first collectives on a new communicator) and is left out
too (:func:`steady_samples`)."""
MIN_STEADY = 3
"""The fewest iterations a median is taken over."""
DEEP_MAX = 4
"""The most layers per stage of the probe's deeper runs (:func:`probe_depths`)."""
BATCH_SCALE = 2
"""The base point runs once more at 1 layer with this many times the micro-batches per step: a
step of ``m`` micro-batches is ``m x V + S`` (what each micro-batch computes, and what the step
does once: the optimizer, the gradient reduction, the engine's step call), so two micro-batch
counts at one depth separate the two, which two depths at one count cannot (their difference
leaves ``S`` to the model)."""
PIPE_DEPTH = 1
"""Layers per stage of the pipeline point (:func:`pipeline_run`): the fewest, so that the rest
it measures (the pipeline engine's per-micro-batch work outside the layers) is the largest share
of its step; the layers themselves take the base point's per-layer terms."""
PROBE_TIMEOUT_MIN = 10.0
"""Minutes each run may take when the study sets no ``search.trial_timeout_min``."""
PORT_OFFSET = 100
"""The points' rendezvous ports start this far above ``launch.master_port``: each is chosen
when the job is submitted and bound minutes later, so they stay clear of the ports that trials
and demos on the same machine start from."""
INTERLEAVE = True
"""Whether a script that runs every point in one process is asked to interleave their steps
(the ``interleave`` key of the points file): every point's engine is then held until the last
round, which a run of many points (``tools/probe_truth.py``) may not want."""
HEREDOC = "TUNER_PROBE_POINT_SCRIPT"
POINT = "TUNER_STACK_POINT"
"""The line that frames each point's output in the node logs: ``TUNER_STACK_POINT <k> start``
and ``TUNER_STACK_POINT <k> end rc=<code>``; a script that interleaves its points' steps
(:data:`INTERLEAVED`) frames each later part of a point by ``<k> resume`` and ``<k> pause``."""
INTERLEAVED = "resume"
"""The framing word that says a point's steps were interleaved with the other points' (one step
of each per round, the rounds numbered by the steps' iteration): their samples pair by round."""


def reduced(spec: StudySpec, config: ParallelConfig, depth: int) -> StudySpec:
    """``spec`` with ``depth`` layers per pipeline stage, ``config``'s global batch and the
    probe's iteration count."""
    model = dataclasses.replace(spec.model, num_layers=depth * config.pp * config.vp)
    launch = dataclasses.replace(spec.launch, train_iters=PROBE_ITERS, warmup_iters=PROBE_WARMUP)
    training = dataclasses.replace(spec.training, global_batch_size=config.global_batch_size)
    return dataclasses.replace(spec, model=model, launch=launch, training=training)


def probe_depths(spec: StudySpec) -> tuple[int, int]:
    """(1, the deeper runs' layers per stage): the study's own ``num_layers``, within 2 to
    :data:`DEEP_MAX`. The per-layer time is the two runs' difference over the layers between
    them, so each step's noise (a few percent on CPU ranks, even paired by round) comes back
    divided by that count: one layer, a third of the demo's 1-layer step, made it 2-3 times as
    large per layer (the 2- over the 1-layer step measured 1.14-1.60 on one machine), three cut
    it threefold. At the study's own depth the deeper run is the config as it trains, and fewer
    layers per stage (pipeline stages) interpolate between the depths, not past them."""
    return 1, max(2, min(DEEP_MAX, spec.model.num_layers))


def _knobs(c: ParallelConfig) -> tuple[Any, ...]:
    """What a point varies besides TP, CP, micro-batch, recompute, ZeRO stage and EP."""
    return (c.pp, c.vp, c.sequence_parallel, c.tp_comm_overlap,
            )  # fmt: skip


def probe_runs(spec: StudySpec) -> list[ProbeRun]:
    """The probe's runs: per (TP, CP) of the space without pipeline stages, a base point (no
    recomputation where the space has it, the middle micro-batch size, the lowest ZeRO stage and
    EP) at both :func:`probe_depths` and at 1 layer with :data:`BATCH_SCALE` times the
    micro-batches, then the base's neighbours that change one knob (each other recomputation,
    ZeRO stage and EP) at the deeper one, in an MoE study the base at another micro-batch size
    at the deeper one (:func:`size_run`), and, where the space has pipeline stages with that TP
    and CP, one pipeline point (:func:`pipeline_run`) at :data:`PIPE_DEPTH` layers per
    stage. The other configs with pipeline stages are not run: they compose from the same
    per-layer terms and the pipeline point's per-micro-batch rest (tuner.models.stack)."""
    depths = probe_depths(spec)
    every = list(iter_configs(spec))
    flat = [c for c in every if c.pp == 1 and c.vp == 1]
    flat = [c for c in flat if not study_violations(c, reduced(spec, c, max(depths)))]
    runs: list[ProbeRun] = []
    for tp, cp in sorted({(c.tp, c.cp) for c in flat}):
        group = [c for c in flat if (c.tp, c.cp) == (tp, cp)]
        sizes = sorted({c.micro_batch_size for c in group})
        mbs = sizes[(len(sizes) - 1) // 2] if len(sizes) > 2 else sizes[-1]
        base = min(
            (c for c in group if c.micro_batch_size == mbs),
            key=lambda c: (
                c.recompute != "none",
                c.zero_stage,
                c.distributed_optimizer,
                c.ep,
                str(_knobs(c)),
            ),
        )
        runs += [ProbeRun(base, d) for d in depths]
        wide = ProbeRun(base, min(depths), BATCH_SCALE)
        if not study_violations(wide.launched, reduced(spec, wide.launched, wide.depth)):
            runs.append(wide)
        seen = {base.key()}
        for c in group:
            same = c.micro_batch_size == mbs and _knobs(c) == _knobs(base)
            changed = [
                c.recompute != base.recompute,
                c.zero_stage != base.zero_stage,
                c.ep != base.ep,
                c.distributed_optimizer != base.distributed_optimizer,
            ]
            if same and sum(changed) == 1 and c.key() not in seen:
                seen.add(c.key())
                runs.append(ProbeRun(c, max(depths)))
        other = size_run(spec, base, group, max(depths))
        if other is not None:
            runs.append(other)
        pipe = pipeline_run(spec, base, every)
        if pipe is not None:
            runs.append(pipe)
    return runs


def size_run(spec: StudySpec, base: ParallelConfig, group: Sequence[ParallelConfig],
             depth: int) -> ProbeRun | None:  # fmt: skip
    """In a study with MoE layers, the base's config at the space's smallest other micro-batch
    size (the largest if the base has the smallest), at ``depth`` layers: an MoE layer's expert
    calls cost a part per micro-batch whatever its tokens (tuner.models.stack.expert_calls), which
    a layer measured at one size stretches with the size; two sizes tell it apart. None in a
    dense study (its per-layer time measured no such part: the calibration guide) or a space of
    one size."""
    if spec.model.moe is None:
        return None
    same = [c for c in group if c.micro_batch_size != base.micro_batch_size
            and dataclasses.replace(c, micro_batch_size=base.micro_batch_size) == base
            and not study_violations(c, reduced(spec, c, depth))]  # fmt: skip
    smaller = [c for c in same if c.micro_batch_size < base.micro_batch_size]
    pick = min(smaller or same, key=lambda c: c.micro_batch_size * (1 if smaller else -1),
               default=None)  # fmt: skip
    return None if pick is None else ProbeRun(pick, depth)


def pipeline_run(spec: StudySpec, base: ParallelConfig,
                 configs: Sequence[ParallelConfig]) -> ProbeRun | None:  # fmt: skip
    """The pipeline point of ``base``'s group: the config with the fewest pipeline stages (more
    than one, not interleaved) that matches ``base`` in TP, CP, micro-batch size, recomputation
    and EP, at the lowest sharding the pipeline allows (DeepSpeed's pipeline runs ZeRO 0-1
    only), at :data:`PIPE_DEPTH` layers per stage; None when the space has none. Its step is the
    pipeline engine's own schedule: the layers (the base's per-layer terms), the point-to-point
    transfers, the fill and drain, and the per-micro-batch rest of a pipeline engine, which runs
    the LM head on the last stage alone and drives each micro-batch through an instruction
    schedule of its own (tuner.profile.stack_terms derives that rest from it)."""
    same = [
        c for c in configs
        if c.pp > 1 and c.vp == 1 and (c.tp, c.cp, c.micro_batch_size, c.recompute, c.ep)
        == (base.tp, base.cp, base.micro_batch_size, base.recompute, base.ep)
        and not study_violations(c, reduced(spec, c, PIPE_DEPTH))
    ]  # fmt: skip
    if not same:
        return None
    best = min(same, key=lambda c: (c.pp, c.zero_stage, c.distributed_optimizer, str(_knobs(c))))
    return ProbeRun(best, PIPE_DEPTH)


def bundle(
    spec: StudySpec, runs: Sequence[ProbeRun], hosts: Sequence[str], master_addr: str,
    master_ports: Sequence[int], node_dir: str,
) -> tuple[tuple[str, ...], dict[str, str]]:  # fmt: skip
    """(one script per node, the files): each run rendered by the study's template into its own
    sub-directory ``p<k>``, its files shipped as ``p<k>.<name>``; every node's script writes each
    point's script (inline) and runs the points in order, each framed by :data:`POINT` lines."""
    from tuner.launch import render_launch

    if spec.launch.probe_one_process:  # DeepSpeed studies only (the study loader's rule)
        return _one_process(spec, runs, hosts, master_addr, master_ports[0], node_dir)
    files: dict[str, str] = {}
    bodies: list[list[str]] = [[] for _ in hosts]
    for k, run in enumerate(runs):
        rendered = render_launch(
            reduced(spec, run.launched, run.depth), run.launched, hosts=hosts,
            master_addr=master_addr, master_port=master_ports[k], trial_dir=f"{node_dir}/p{k}",
        )  # fmt: skip
        copies = [f"mkdir -p p{k}"]
        for name, text in rendered.files.items():
            files[f"p{k}.{name}"] = text
            copies.append(f"cp p{k}.{name} p{k}/{name}")
        for n, script in enumerate(rendered.scripts):
            # inline, so what an executor fills in a node's script (Slurm's master address)
            # reaches the point's script too
            name = f"p{k}.node-{n}.sh"
            inline = [f"cat > {name} <<'{HEREDOC}'", script.rstrip("\n"), HEREDOC]
            bodies[n] += [*copies, *inline, f"run {k} {name}"]
    head = [
        "#!/usr/bin/env bash",
        "set -uo pipefail",
        f"cd {_quote(node_dir)}",
        f'run() {{ echo "{POINT} $1 start"; bash "$2"; echo "{POINT} $1 end rc=$?"; }}',
    ]
    return tuple("\n".join([*head, *body]) + "\n" for body in bodies), files


def _one_process(
    spec: StudySpec, runs: Sequence[ProbeRun], hosts: Sequence[str], master_addr: str,
    master_port: int, node_dir: str,
) -> tuple[tuple[str, ...], dict[str, str]]:  # fmt: skip
    """:func:`bundle` for a script that runs the points itself (``launch.probe_one_process``):
    each point's files as there, and one launch per node (the first point's, given
    ``--probe-points`` with every point's arguments), so the interpreter, imports and process
    group start once; the script frames each point with :data:`POINT` lines."""
    import json

    from tuner.launch import render_launch
    from tuner.launch.megatron_flags import deepspeed_script_flags

    files: dict[str, str] = {}
    copies: list[str] = []
    points = []
    for k, run in enumerate(runs):
        small = reduced(spec, run.launched, run.depth)
        rendered = render_launch(small, run.launched, hosts=hosts, master_addr=master_addr,
                                 master_port=master_port,
                                 trial_dir=f"{node_dir}/p{k}")  # fmt: skip
        copies.append(f"mkdir -p p{k}")
        for name, text in rendered.files.items():
            files[f"p{k}.{name}"] = text
            copies.append(f"cp p{k}.{name} p{k}/{name}")
        flags = deepspeed_script_flags(small.model, run.launched, small.launch.train_iters)
        argv = ["--deepspeed_config", f"{node_dir}/p{k}/ds_config.json"]
        argv += [part for flag in flags for part in flag] + list(spec.launch.script_args)
        points.append({"point": k, "argv": argv})
    files["probe-points.json"] = json.dumps({"marker": POINT, "interleave": INTERLEAVE,
                                             "points": points})  # fmt: skip
    launch = dataclasses.replace(spec.launch, extra_args=(
        *spec.launch.extra_args, "--probe-points", f"{node_dir}/probe-points.json"))  # fmt: skip
    first = dataclasses.replace(reduced(spec, runs[0].launched, runs[0].depth), launch=launch)
    rendered = render_launch(first, runs[0].launched, hosts=hosts, master_addr=master_addr,
                             master_port=master_port, trial_dir=f"{node_dir}/p0")  # fmt: skip
    head = ["#!/usr/bin/env bash", "set -uo pipefail", f"cd {_quote(node_dir)}", *copies]
    scripts = []
    for n, script in enumerate(rendered.scripts):
        name = f"points.node-{n}.sh"
        body = [f"cat > {name} <<'{HEREDOC}'", script.rstrip("\n"), HEREDOC, f"bash {name}"]
        scripts.append("\n".join([*head, *body]) + "\n")
    return tuple(scripts), files


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def split_points(text: str) -> dict[int, str]:
    """Each point's lines of one node log, by point index: the last run of each (an executor
    may append a probe's log to an earlier probe's in the same directory), its interleaved parts
    (``resume`` ... ``pause``) joined."""
    out: dict[int, list[str]] = {}
    current: int | None = None
    for line in text.splitlines():
        if line.startswith(POINT):
            parts = line.split()
            current = int(parts[1]) if parts[2] in ("start", INTERLEAVED) else None
            if current is not None and parts[2] == "start":
                out[current] = []
            continue
        if current is not None:
            out.setdefault(current, []).append(line)
    return {k: "\n".join(v) + "\n" for k, v in out.items()}


def versions(text: str) -> dict[str, str]:
    """The stack's versions from a workload's ``tuner-versions: python=... torch=...`` line."""
    for line in text.splitlines():
        if "tuner-versions:" in line:
            words = line.split("tuner-versions:", 1)[1].split()
            return dict(w.split("=", 1) for w in words if "=" in w)
    return {}


def rows_from_logs(
    spec: StudySpec, runs: Sequence[ProbeRun], logs: Sequence[str]
) -> list[ProbeRow]:
    """The rows of every run, each parsed from its part of all node logs; a run without a step
    time is a one-line :class:`LaunchError` naming it."""
    parts = [split_points(text) for text in logs]
    paired = any(f"{POINT} {k} {INTERLEAVED}" in text for text in logs for k in range(len(runs)))
    rows = []
    for k, run in enumerate(runs):
        text = "".join(p.get(k, "") for p in parts)
        m = parse_log(
            text, spec.framework, PROBE_WARMUP, global_batch_size=spec.training.global_batch_size
        )
        if m.step_time_s is None or m.peak_memory_gib is None:
            tail = " | ".join(text.strip().splitlines()[-2:]) or "no output"
            raise LaunchError(f"probe run p{k} ({run.launched.key()}, {run.depth} layers) "
                              f"measured nothing ({m.outcome}): {tail}")  # fmt: skip
        steady = steady_samples(m.step_times_s)
        # the samples are the run's last iterations (1, 2, ... in the workloads' step lines)
        first = len(m.step_times_s) - len(steady) + 1
        rows.append(ProbeRow(key=run.launched.key(), depth=run.depth,
                             step_s=statistics.median(steady),
                             samples_s=tuple(steady), peak_gib=m.peak_memory_gib,
                             reserved_gib=m.peak_reserved_gib,
                             rounds=tuple(range(first, first + len(steady))) if paired
                             else ()))  # fmt: skip
    return rows


def run_stack_probe(
    spec: StudySpec, executor: Any, paths: TrialPaths,
    on_progress: Callable[[int, int], None] | None = None, poll_s: float = 0.2,
    runs: Sequence[ProbeRun] | None = None,
) -> ProbeResult:  # fmt: skip
    """Run every point of :func:`probe_runs` (or ``runs``) as one job through ``executor``; the
    rows."""
    from tuner.launch import LaunchRequest

    runs = list(probe_runs(spec) if runs is None else runs)
    if not runs:
        raise LaunchError("the probe found no config without pipeline stages in the space")
    hosts = tuple(spec.node_names[: spec.nodes_per_trial])
    master = executor.master_addr(hosts)
    ports = [executor.master_port(hosts, spec.launch.master_port + PORT_OFFSET)]
    for _ in runs[1:]:  # one port each: a finished run's may linger, another job may take one
        ports.append(executor.master_port(hosts, ports[-1] + 1))
    paths.dir.mkdir(parents=True, exist_ok=True)
    for n in range(len(hosts)):  # an earlier probe's log here would be appended to
        paths.node_log(n).unlink(missing_ok=True)
    node_dir = str(paths.dir.resolve())
    scripts, files = bundle(spec, runs, hosts, master, ports, node_dir)
    limit = (spec.search.trial_timeout_min or PROBE_TIMEOUT_MIN) * 60.0 * len(runs)
    request = LaunchRequest(trial=0, label="the framework probe's job", hosts=hosts, paths=paths,
                            scripts=scripts, files=files, timeout_s=limit)  # fmt: skip
    start = time.monotonic()
    job = executor.submit(request)
    try:
        while (result := job.poll()) is None:
            if on_progress is not None:
                on_progress(_done(paths.node_log(0)), len(runs))
            time.sleep(poll_s)
    except BaseException:
        job.cancel()
        raise
    wall = time.monotonic() - start
    logs = [_read(paths.node_log(n)) for n in range(len(hosts))]
    if not result.ok:
        tail = " | ".join(logs[0].strip().splitlines()[-3:]) or "no output"
        raise LaunchError(f"the probe job failed (see {paths.node_log(0)}): {tail}")
    rows = rows_from_logs(spec, runs, logs)
    return ProbeResult(rows=tuple(rows), wall_s=wall, nodes=len(hosts),
                       versions=versions(logs[0]))  # fmt: skip


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _done(log: Path) -> int:
    return len({ln.split()[1] for ln in _read(log).splitlines()
                if ln.startswith(POINT) and " end " in ln})  # fmt: skip


def steady_samples(times: Sequence[float]) -> tuple[float, ...]:
    """The step times past the warm-up: the first :data:`PROBE_WARMUP` always dropped, then each
    leading one more than :data:`WARM_SLOW` times the median of those after it, while at least
    :data:`MIN_STEADY` stay (all of them when there are fewer)."""
    rest = list(times[PROBE_WARMUP:])
    if len(rest) < MIN_STEADY:
        return tuple(times[-MIN_STEADY:]) or tuple(times)
    while len(rest) > MIN_STEADY and rest[0] > WARM_SLOW * statistics.median(rest[1:]):
        rest.pop(0)
    return tuple(rest)
