"""Cluster profiles: what ``tune profile`` measures, how the job is launched, and when to trust it.

The probe itself is :mod:`tuner.profile.job` (torch only), shipped to the nodes as an extra file
of an ordinary :class:`~tuner.launch.LaunchRequest` and started by torchrun on each node through
the study's own executor (local processes, SSH or Slurm): no second launcher. The plan it runs
comes from the study (:mod:`tuner.profile.plan`).

A saved profile (``results/clusters/<name>.yaml``, :class:`~tuner.layout.ClusterLayout`) holds the
date, the software versions, the host count and every raw sample; :func:`check_profile` refuses a
profile that is stale (older than :data:`MAX_AGE_DAYS`, or measured under other software than the
cluster runs now) or foreign (another GPU type than the study's ``cluster.gpu``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from tuner._loader import load_yaml, yaml_problem
from tuner.errors import ConfigError, LaunchError
from tuner.layout import ClusterLayout, write_atomic
from tuner.profile.fields import Malformed, field_of, optional, present, samples, text, utc_time
from tuner.profile.plan import ProbeOptions, make_plan
from tuner.spec.file import read_text
from tuner.spec.study import StudySpec

MAX_AGE_DAYS = 30
"""A profile older than this is refused: drivers, NCCL and firmware change under a cluster (and a
re-profile costs minutes)."""
VERSION_KEYS = ("torch", "cuda", "nccl", "driver", "backend")
"""The software a profile's figures depend on; any difference makes it stale."""
PROGRESS = "TUNER_PROFILE_PROGRESS"  # the probe's line prefixes (tuner.profile.job, torch only)
RESULT = "TUNER_PROFILE_RESULT"


class ProfileError(ConfigError):
    """A cluster profile cannot be used (missing, stale, foreign or malformed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmSample:
    """One GEMM shape ``[m, k] @ [k, n]`` and its timings."""

    label: str
    m: int
    k: int
    n: int
    samples_s: tuple[float, ...]
    median_s: float
    tflops: float


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionSample:
    """Causal fused attention on one ``(batch, heads, seq, head_dim)`` call, forward and backward,
    at the rates the time model reads (``tuner.models.rates.attention_seconds``'s FLOP
    convention)."""

    label: str
    batch: int
    heads: int
    seq: int
    head_dim: int
    backend: str
    """The kernels that ran: ``cudnn`` (asked for on Hopper under Megatron) or ``default``."""
    forward_samples_s: tuple[float, ...]
    forward_backward_samples_s: tuple[float, ...]
    forward_s: float
    backward_s: float
    """Median forward + backward minus median forward."""
    forward_tflops: float
    backward_tflops: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSample:
    """STREAM's Add kernel (``z = x + y``) on buffers past the caches, as every rank ran it."""

    bytes: int
    """Moved per call: two buffers read, one written."""
    samples_s: tuple[float, ...]
    median_s: float
    gbps: float
    """Achieved memory bandwidth, GB/s: what the time model's streaming kernels get."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSample:
    """Tiny ops back to back (:mod:`tuner.profile.job`): what an eager op costs beyond its work."""

    ops: int
    """Forward and backward ops of one chain."""
    samples_s: tuple[float, ...]
    """Seconds per chain."""
    median_s: float
    per_op_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveSample:
    """One collective at one message size on one group, and its timings."""

    op: str
    link: str
    """``intra`` (all ranks on one node) or ``inter`` (the group spans nodes)."""
    group_size: int
    ranks: tuple[int, ...]
    bytes: int
    samples_s: tuple[float, ...]
    median_s: float
    busbw_gbps: float
    """nccl-tests' bus bandwidth, GB/s (see :mod:`tuner.profile.job`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AlphaBeta:
    """``time = alpha + bytes * factor / busbw``: latency and bus bandwidth of one collective
    on one kind of group, fitted over the message sizes (Hockney's model) by Theil-Sen's robust
    line (:func:`_robust_line`)."""

    op: str
    link: str
    group_size: int
    alpha_s: float
    busbw_gbps: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterProfile:
    """A measured cluster profile (``results/clusters/<name>.yaml``)."""

    cluster: str
    gpu: str
    """The study's ``cluster.gpu`` when it was measured."""
    created: str
    """UTC time of the measurement, ISO 8601."""
    versions: Mapping[str, Any]
    """torch, CUDA, NCCL or gloo, GPU name, driver, python: as rank 0 saw them."""
    hosts: int
    """Distinct host names among the job's ranks."""
    world_size: int
    dtype: str
    gemm: tuple[GemmSample, ...]
    collectives: tuple[CollectiveSample, ...]
    stream: StreamSample | None = None
    """The memory-streaming measurement; None in profiles saved before it was measured."""
    launch: LaunchSample | None = None
    """The per-op launch cost; None in profiles saved before it was measured."""
    attention: tuple[AttentionSample, ...] = ()
    """Fused attention per call shape; empty without flash attention, or in profiles saved
    before it was measured."""
    tool: Mapping[str, Any] = field(default_factory=dict)
    """How it was measured (warm-up, repeats, message sizes)."""

    def alpha_beta(self) -> list[AlphaBeta]:
        """The alpha-beta fit of each (op, link, group size) over its message sizes."""
        groups: dict[tuple[str, str, int], list[CollectiveSample]] = {}
        for s in self.collectives:
            groups.setdefault((s.op, s.link, s.group_size), []).append(s)
        return [_fit(key, rows) for key, rows in sorted(groups.items())]

    def to_dict(self) -> dict[str, Any]:
        """Plain data for YAML (mappings and lists: safe_dump takes no tuples or proxies)."""
        out: dict[str, Any] = _plain(dataclasses.asdict(self))
        return out


def _plain(value: Any) -> Any:
    """``value`` with every mapping a dict and every tuple a list, all the way down."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _fit(key: tuple[str, str, int], rows: Sequence[CollectiveSample]) -> AlphaBeta:
    op, link, size = key
    # bus bytes = bytes x nccl-tests' factor = busbw x time: the bytes one link really carries
    x = [r.busbw_gbps * 1e9 * r.median_s for r in rows]
    y = [r.median_s for r in rows]
    if len(rows) < 2 or len(set(x)) < 2:
        only = rows[0]
        return AlphaBeta(op=op, link=link, group_size=size, alpha_s=0.0,
                         busbw_gbps=only.busbw_gbps)  # fmt: skip
    slope, intercept = _robust_line(x, y)
    bw = 1.0 / slope / 1e9 if slope > 0 else max(r.busbw_gbps for r in rows)
    return AlphaBeta(op=op, link=link, group_size=size, alpha_s=max(intercept, 0.0),
                     busbw_gbps=bw)  # fmt: skip


def _robust_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of Theil-Sen's line: the median of the slopes between every two
    points, and the median of ``y - slope x`` (Theil 1950, Sen 1968).

    A size's median time is not a normal draw about the line: a rank that waits for a CPU
    another process holds adds milliseconds and nothing takes them away, so with the repeats
    split between the two the median lands in either. Gloo's two-rank all-reduce on a loaded
    2-core host: 0.2-0.5 ms at 4-256 KiB, or 2-4 ms at any of them. Least squares lets one such
    size move the intercept: the all-to-all's latency came out 0.20 to 1.36 ms over four
    profiles of one machine within a minute, while Theil-Sen (which holds up to 29% of the
    points off the line) gave 0.18-0.23 ms. On a clean line it is least squares' line."""
    pairs = [((b2 - b1) / (a2 - a1)) for i, (a1, b1) in enumerate(zip(x, y, strict=True))
             for a2, b2 in zip(x[i + 1 :], y[i + 1 :], strict=True) if a2 != a1]  # fmt: skip
    slope = statistics.median(pairs)
    return slope, statistics.median(b - slope * a for a, b in zip(x, y, strict=True))


# ----------------------------------------------------------------------------- the job


def probe_source() -> str:
    """The text of :mod:`tuner.profile.job`, shipped to the nodes as a file."""
    return resources.files("tuner.profile").joinpath("job.py").read_text()


def node_script(spec: StudySpec, node_rank: int, master_addr: str, master_port: int) -> str:
    """The bash script node ``node_rank`` runs: torchrun on the probe, in the job directory."""
    import shlex

    q = shlex.quote
    python = spec.launch.python
    lines = ["#!/usr/bin/env bash", "set -euo pipefail"]
    if "/" in python:  # the nodes' venv first, as the study's templates do
        lines.append(f'export PATH={q(str(PurePosixPath(python).parent))}:"$PATH"')
    lines += [f"export {k}={q(v)}" for k, v in sorted(spec.launch.env.items())]
    lines.append(
        f"exec {q(python)} -m torch.distributed.run --nnodes {spec.nodes_per_trial} "
        f"--node_rank {node_rank} --nproc_per_node {spec.cluster.gpus_per_node} "
        f"--master_addr {q(master_addr)} --master_port {master_port} profile_job.py plan.json"
    )
    return "\n".join(lines) + "\n"


def run_probe(
    spec: StudySpec, executor: Any, layout: ClusterLayout, options: ProbeOptions,
    on_progress: Callable[[int, int], None] | None = None,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    poll_s: float = 0.2,
) -> ClusterProfile:  # fmt: skip
    """Run the probe on the study's first node group through ``executor``; the profile."""
    import time

    from tuner.launch import LaunchRequest

    hosts = tuple(spec.node_names[: spec.nodes_per_trial])
    master = executor.master_addr(hosts)
    port = executor.master_port(hosts, spec.launch.master_port)
    plan = make_plan(spec, options)
    paths = layout.probe
    paths.dir.mkdir(parents=True, exist_ok=True)
    request = LaunchRequest(
        trial=0, label="tune profile's job", hosts=hosts, paths=paths, timeout_s=options.timeout_s,
        scripts=tuple(node_script(spec, k, master, port) for k in range(len(hosts))),
        files={"profile_job.py": probe_source(), "plan.json": json.dumps(plan, indent=1)},
    )  # fmt: skip
    created = now()
    job = executor.submit(request)
    try:
        while (result := job.poll()) is None:
            if on_progress is not None:
                on_progress(*_progress(paths.node_log(0)))
            time.sleep(poll_s)
    except BaseException:
        job.cancel()
        raise
    text = _read(paths.node_log(0))
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith(RESULT)), None)
    if not result.ok or line is None:
        tail = " | ".join(text.strip().splitlines()[-3:]) or "no output"
        raise LaunchError(f"the profile job failed (see {paths.node_log(0)}): {tail}")
    try:
        measured = json.loads(line[len(RESULT) :])
    except ValueError:  # cut short or run into by another rank's output
        raise LaunchError(f"the profile job's result line in {paths.node_log(0)} is not "
                          "whole JSON (cut short, or another process wrote into it); run "
                          "tune profile again") from None  # fmt: skip
    return from_probe(spec, measured, created, options, plan)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _progress(log: Path) -> tuple[int, int]:
    """The job's last progress line whole: the log is read while the job writes it (a line cut
    short, or run into by another rank's output, was a ValueError that ended ``tune profile``)."""
    for line in reversed(_read(log).splitlines()):
        words = line.split()
        if words[:1] == [PROGRESS] and len(words) >= 3 and all(w.isdigit() for w in words[1:3]):
            return int(words[1]), int(words[2])
    return 0, 1


def from_probe(
    spec: StudySpec, data: Mapping[str, Any], created: dt.datetime, options: ProbeOptions,
    plan: Mapping[str, Any],
) -> ClusterProfile:  # fmt: skip
    """The profile made of the probe's result line."""
    tool = {"warmup": options.warmup, "repeats": options.repeats,
            "message_bytes": list(plan["message_bytes"])}  # fmt: skip
    return _profile({**data, "cluster": spec.cluster_name, "gpu": spec.cluster.gpu_name,
                     "created": created.astimezone(dt.UTC).isoformat(timespec="seconds"),
                     "tool": tool})  # fmt: skip


def _profile(data: Mapping[str, Any]) -> ClusterProfile:
    """A profile from plain data (the probe's result line plus what tune knows, or a saved file);
    the probes added later (stream, launch, attention) may be missing. A missing or wrong field
    is a :class:`Malformed` naming it (``gemm[0].tflops is missing``)."""
    return ClusterProfile(
        cluster=field_of(data, "cluster", text), gpu=field_of(data, "gpu", text),
        created=field_of(data, "created", utc_time), versions=field_of(data, "versions", dict),
        hosts=field_of(data, "hosts", int), world_size=field_of(data, "world_size", int),
        dtype=field_of(data, "dtype", text),
        gemm=samples(GemmSample, field_of(data, "gemm", present), "gemm"),
        collectives=samples(CollectiveSample, field_of(data, "collectives", present),
                             "collectives"),
        stream=optional(StreamSample, data.get("stream"), "stream"),
        launch=optional(LaunchSample, data.get("launch"), "launch"),
        attention=samples(AttentionSample, data.get("attention"), "attention"),
        tool=dict(data.get("tool") or {}),
    )  # fmt: skip


# ----------------------------------------------------------------------------- files


def save_profile(profile: ClusterProfile, path: Path) -> None:
    """Write ``profile`` as YAML (the alpha-beta fits are written too, for readers; they are
    recomputed from the samples on load)."""
    data = profile.to_dict()
    data["alpha_beta"] = [dataclasses.asdict(f) for f in profile.alpha_beta()]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, yaml.safe_dump(data, sort_keys=False))


def load_profile(path: Path, spec: StudySpec | None = None) -> ClusterProfile:
    """Read a saved profile; a missing or malformed file is a one-line :class:`ProfileError`
    naming the file and the command that measures it again (``spec``'s, where it is known)."""
    again = spec.profile_command if spec is not None else "tune profile"
    if not path.exists():
        raise ProfileError(f"no cluster profile yet ({again} measures it)", file=str(path))
    why: str | None
    try:
        data = load_yaml(read_text(path, "the cluster profile", limit=None))
    except ConfigError as exc:  # not a regular file, not UTF-8
        why = exc.reason
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # [[[[...]]]], 5000 digits
        why = "not YAML: " + yaml_problem(exc)
    else:
        why = _profile_problem(data)
        if why is None and isinstance(data, Mapping):  # the problem's first check, for mypy
            try:
                return _profile(data)
            except (Malformed, TypeError, ValueError) as exc:
                why = f"malformed cluster profile: {exc}"
    raise ProfileError(f"{why}; {again} measures it again", file=str(path))


def _profile_problem(data: object) -> str | None:
    """Why ``data`` is not a saved profile at first sight, or None."""
    names = {f.name for f in dataclasses.fields(ClusterProfile)} | {"alpha_beta"}
    if not isinstance(data, dict):
        return f"not a cluster profile (expected a mapping, got {type(data).__name__})"
    if set(data) - names:
        return f"not a cluster profile (unknown keys {sorted(set(data) - names)})"
    return None


def check_profile(
    profile: ClusterProfile, spec: StudySpec, *, now: dt.datetime,
    versions: Mapping[str, Any] | None = None, path: str = "",
) -> ClusterProfile:  # fmt: skip
    """``profile`` when it may be used for ``spec``'s cluster; else a one-line ProfileError.

    ``versions``: the software the cluster runs now, where the caller knows it (the local
    executor's own torch; on remote clusters the latest probe or trial log); keys missing on
    either side are not compared."""
    where = path or profile.cluster
    if profile.gpu != spec.cluster.gpu_name:
        raise ProfileError(
            f"foreign profile: measured on {profile.gpu}, the study's cluster.gpu is "
            f"{spec.cluster.gpu_name} (run {spec.profile_command})", file=where,
        )  # fmt: skip
    age = now - dt.datetime.fromisoformat(profile.created)
    if age > dt.timedelta(days=MAX_AGE_DAYS):
        raise ProfileError(
            f"stale profile: measured {profile.created}, {age.days} days ago (more than "
            f"{MAX_AGE_DAYS}); run {spec.profile_command}", file=where,
        )  # fmt: skip
    for key in VERSION_KEYS:
        then, current = profile.versions.get(key), (versions or {}).get(key)
        if then is not None and current is not None and str(then) != str(current):
            raise ProfileError(
                f"stale profile: measured with {key} {then}, the cluster now has {current}; "
                f"run {spec.profile_command}", file=where,
            )  # fmt: skip
    if profile.cluster != spec.cluster_name:  # a copy of another cluster's file: its network
        raise ProfileError(  # (and the rates built once per cluster name and time, rates.py)
            f"foreign profile: its cluster is {profile.cluster!r}, the study's is "
            f"{spec.cluster_name!r} (a profile copied from another cluster's folder); run "
            f"{spec.profile_command}", file=where,
        )  # fmt: skip
    return profile


def study_profile(
    spec: StudySpec, results: str | Path = "results", now: dt.datetime | None = None
) -> ClusterProfile | None:
    """The saved profile of ``spec``'s cluster, checked (:func:`check_profile`), or None when
    there is none: what the time model reads (it falls back to the catalog on None)."""
    layout = ClusterLayout(Path(results).resolve(), spec.cluster_name)
    if not layout.profile_yaml.exists():  # a folder or a FIFO there is an error, not "none"
        return None
    local = local_versions() if spec.cluster.executor == "local" else None
    when = now or dt.datetime.now(dt.UTC)
    path = str(layout.profile_yaml)
    return check_profile(load_profile(layout.profile_yaml, spec), spec, now=when, versions=local,
                         path=path)  # fmt: skip


def local_versions() -> dict[str, Any]:
    """This machine's torch (and CUDA / NCCL) versions, for the local executor's check; empty
    when torch is not installed here."""
    try:
        import torch
    except ImportError:
        return {}
    out: dict[str, Any] = {"torch": str(torch.__version__)}  # a str subclass: plain for YAML
    if torch.cuda.is_available():
        out["cuda"] = str(torch.version.cuda)
    out["backend"] = "nccl" if torch.cuda.is_available() else "gloo"
    return out


def summary_rows(profile: ClusterProfile) -> list[tuple[str, str]]:
    """(what, figure) lines for the CLI: GEMM throughput range and each alpha-beta fit."""
    rows = []
    if profile.gemm:
        tf = [g.tflops for g in profile.gemm]
        best = max(profile.gemm, key=lambda g: g.tflops)
        rows.append((f"GEMM ({len(tf)} shapes, {profile.dtype})",
                     f"{min(tf):.3g}-{max(tf):.3g} TFLOP/s (best {best.label})"))  # fmt: skip
    if profile.attention:
        fwd = [a.forward_tflops for a in profile.attention]
        bwd = [a.backward_tflops for a in profile.attention]
        ran = ", ".join(sorted({a.backend for a in profile.attention}))
        rows.append((f"attention ({len(fwd)} shapes, causal, {ran})",
                     f"fwd {min(fwd):.3g}-{max(fwd):.3g}, bwd {min(bwd):.3g}-{max(bwd):.3g} "
                     "TFLOP/s"))  # fmt: skip
    if profile.stream is not None:
        mib = profile.stream.bytes / 3 / 2**20
        rows.append((f"memory stream (add, 3 x {mib:.0f} MiB)",
                     f"{profile.stream.gbps:.4g} GB/s"))  # fmt: skip
    if profile.launch is not None:
        rows.append((f"kernel launch ({profile.launch.ops} tiny ops, forward and backward)",
                     f"{profile.launch.per_op_s * 1e6:.3g} us per op"))  # fmt: skip
    for f in profile.alpha_beta():
        # a fit whose intercept the message sizes put at or under nil has not resolved the
        # latency (clipped at nil, or one size): "0.0 us" would read as a measurement
        lat = (f"{f.alpha_s * 1e6:.1f} us" if math.isfinite(f.alpha_s) and f.alpha_s > 0
               else "unresolved")  # fmt: skip
        rows.append((f"{f.op} {f.link} n={f.group_size}",
                     f"{f.busbw_gbps:.3g} GB/s bus, {lat} latency"))  # fmt: skip
    return rows
