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

A probe that runs one point per launch measures again, in the same job, the points whose first
run a burst of load slowed (:mod:`tuner.profile.recheck`): after their first pass the node
scripts wait for the verdict (:data:`RECHECK`) and run the points it names once more; the log
reading is :mod:`tuner.profile.probe_logs`'s.

Step times under a drifting load: a script that runs every point in one process
(``launch.probe_one_process``) may interleave their timed steps, one step of each point per
round (:data:`INTERLEAVED`; the DeepSpeed workload does on CPU ranks). The rows then carry each
sample's round, and the terms read each point against a reference point by the median of their
paired ratios (:func:`tuner.profile.paired.paired_ratio`), which a load common to a round does
not move.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from tuner.config.parallel import ParallelConfig
from tuner.errors import LaunchError
from tuner.layout import TrialPaths
from tuner.profile.probe_logs import AGAIN as AGAIN
from tuner.profile.probe_logs import INTERLEAVED as INTERLEAVED
from tuner.profile.probe_logs import MIN_STEADY as MIN_STEADY
from tuner.profile.probe_logs import POINT as POINT
from tuner.profile.probe_logs import PROBE_WARMUP as PROBE_WARMUP
from tuner.profile.probe_logs import WARM_SLOW as WARM_SLOW
from tuner.profile.probe_logs import ended, read_log
from tuner.profile.probe_logs import rows_from_logs as rows_from_logs
from tuner.profile.probe_logs import split_points as split_points
from tuner.profile.probe_logs import steady_samples as steady_samples
from tuner.profile.probe_logs import versions as versions
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
RECHECK = "probe-recheck.txt"
"""The verdict the node scripts of a probe that runs one point per launch wait for after their
first pass: the indices of the points to run again (:mod:`tuner.profile.recheck`), in that
order, or nothing; written by :func:`run_stack_probe` into the job's directory on every node."""
RECHECK_WAIT_S = 300.0
"""The longest the node scripts wait for :data:`RECHECK`: it comes a poll after the last
point's end; past this (a tune that died) the job ends as if nothing were to run again."""


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
    point's script (inline) and runs the points in order, each framed by :data:`POINT` lines,
    then waits for :data:`RECHECK` and runs the points it names again (:func:`_again`).
    ``master_ports``: one per run, then one per run for its second run (the first's again
    where missing)."""
    from tuner.launch import render_launch

    if spec.launch.probe_one_process:  # DeepSpeed studies only (the study loader's rule)
        return _one_process(spec, runs, hosts, master_addr, master_ports[0], node_dir)
    files: dict[str, str] = {}
    bodies: list[list[str]] = [[] for _ in hosts]
    agains: list[list[str]] = [[] for _ in hosts]
    for k, run in enumerate(runs):
        for tag, port, out in (
            (f"p{k}", master_ports[k], bodies),
            (f"p{k}r", _port(master_ports, len(runs) + k), agains),
        ):
            rendered = render_launch(
                reduced(spec, run.launched, run.depth), run.launched, hosts=hosts,
                master_addr=master_addr, master_port=port, trial_dir=f"{node_dir}/{tag}",
            )  # fmt: skip
            copies = [f"mkdir -p {tag}"]
            for name, text in rendered.files.items():
                files[f"{tag}.{name}"] = text
                copies.append(f"cp {tag}.{name} {tag}/{name}")
            for n, script in enumerate(rendered.scripts):
                # inline, so what an executor fills in a node's script (Slurm's master address)
                # reaches the point's script too
                name = f"{tag}.node-{n}.sh"
                inline = [f"cat > {name} <<'{HEREDOC}'", script.rstrip("\n"), HEREDOC]
                if out is bodies:
                    out[n] += [*copies, *inline, f"run {k} {name}"]
                else:
                    out[n] += [f"{k})", *copies, *inline, f"again {k} {name} ;;"]
    head = [
        "#!/usr/bin/env bash",
        "set -uo pipefail",
        f"cd {_quote(node_dir)}",
        f"rm -f {RECHECK}",
        f'run() {{ echo "{POINT} $1 start"; bash "$2"; echo "{POINT} $1 end rc=$?"; }}',
        f'again() {{ echo "{POINT} $1 {AGAIN}"; bash "$2"; echo "{POINT} $1 end rc=$?"; }}',
    ]
    polls = int(RECHECK_WAIT_S / 0.2)
    tail = [
        f'n=0; while [ ! -e {RECHECK} ] && [ "$n" -lt {polls} ]; do sleep 0.2; n=$((n + 1)); done',
        f"for k in $(cat {RECHECK} 2>/dev/null); do",
        'case "$k" in',
    ]
    return tuple("\n".join([*head, *body, *tail, *extra, "esac", "done"]) + "\n"
                 for body, extra in zip(bodies, agains, strict=True)), files  # fmt: skip


def _port(ports: Sequence[int], k: int) -> int:
    """The ``k``-th rendezvous port, or the first run's where the caller gave one per run."""
    return ports[k] if k < len(ports) else ports[k % len(ports)]


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


def run_stack_probe(
    spec: StudySpec, executor: Any, paths: TrialPaths,
    on_progress: Callable[[int, int], None] | None = None, poll_s: float = 0.2,
    runs: Sequence[ProbeRun] | None = None, rates: Any = None,
) -> ProbeResult:  # fmt: skip
    """Run every point of :func:`probe_runs` (or ``runs``) as one job through ``executor``; the
    rows. A probe that runs one point per launch has its inconsistent points measured again in
    the same job (:mod:`tuner.profile.recheck`, under ``rates``: the cluster profile's, or the
    catalog's): once every node's first pass has ended, the verdict goes to the nodes
    (:data:`RECHECK`), which run those points again before the job ends."""
    from tuner.launch import LaunchRequest
    from tuner.profile import recheck

    runs = list(probe_runs(spec) if runs is None else runs)
    if not runs:
        raise LaunchError("the probe found no config without pipeline stages in the space")
    hosts = tuple(spec.node_names[: spec.nodes_per_trial])
    master = executor.master_addr(hosts)
    ports = [executor.master_port(hosts, spec.launch.master_port + PORT_OFFSET)]
    again = 0 if spec.launch.probe_one_process else len(runs)  # a port for each second run
    for _ in range(len(runs) + again - 1):  # one each: a finished run's may linger
        ports.append(executor.master_port(hosts, ports[-1] + 1))
    paths.dir.mkdir(parents=True, exist_ok=True)
    for n in range(len(hosts)):  # an earlier probe's log here would be appended to
        paths.node_log(n).unlink(missing_ok=True)
    node_dir = str(paths.dir.resolve())
    scripts, files = bundle(spec, runs, hosts, master, ports, node_dir)
    per_run = (spec.search.trial_timeout_min or PROBE_TIMEOUT_MIN) * 60.0
    limit = per_run * (len(runs) + again) + (RECHECK_WAIT_S if again else 0.0)
    request = LaunchRequest(trial=0, label="the framework probe's job", hosts=hosts, paths=paths,
                            scripts=scripts, files=files, timeout_s=limit)  # fmt: skip
    start = time.monotonic()
    job = executor.submit(request)
    why: dict[int, str] | None = None if again else {}
    first_s: float | None = None
    try:
        while (result := job.poll()) is None:
            # every node's log while the verdict waits on their first passes; node 0's after
            logs = [read_log(paths.node_log(n)) for n in range(len(hosts) if why is None else 1)]
            if on_progress is not None:
                on_progress(ended(logs[0]), len(runs))
            if why is None and all(ended(text) >= len(runs) for text in logs):
                first_s = time.monotonic()
                why = _verdict(spec, runs, logs, rates)
                order = " ".join(str(k) for k in recheck.order(why))
                executor.send_files(request, {RECHECK: order + "\n"})
            time.sleep(poll_s)
    except BaseException:
        job.cancel()
        raise
    end = time.monotonic()
    logs = [read_log(paths.node_log(n)) for n in range(len(hosts))]
    if not result.ok:
        tail = " | ".join(logs[0].strip().splitlines()[-3:]) or "no output"
        raise LaunchError(f"the probe job failed (see {paths.node_log(0)}): {tail}")
    rows = rows_from_logs(spec, runs, logs)
    if why:
        second = dict(zip(why, rows_from_logs(spec, runs, logs, AGAIN, list(why)), strict=True))
        rows = recheck.settle(spec, runs, rows, second, why, rates)
    return ProbeResult(rows=tuple(rows), wall_s=end - start, nodes=len(hosts),
                       versions=versions(logs[0]),
                       recheck_s=0.0 if first_s is None else end - first_s)  # fmt: skip


def _verdict(spec: StudySpec, runs: Sequence[ProbeRun], logs: Sequence[str],
             rates: Any) -> dict[int, str]:  # fmt: skip
    """The first pass's points to measure again (:func:`tuner.profile.recheck.verdict`); none
    where a point measured nothing (the job's end reports it)."""
    from tuner.profile import recheck
    from tuner.profile.run import ProfileError

    try:
        return recheck.verdict(spec, runs, rows_from_logs(spec, runs, logs), rates)
    except (LaunchError, ProfileError):
        return {}
