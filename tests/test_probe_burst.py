"""A burst of load during one point's run of the probe (another process taking a share of the two
cores for a few seconds) must not move that point against the others: the shipped multi-node
demo (studies/demo-ssh.yaml) runs its probe's points in one process per node with their steps
interleaved, so a burst slows the steps of every point in the rounds it lasts and the paired
ratios (tuner.profile.paired) cancel it. Run one point after another, the burst lands on the
point whose minutes it lasted (`make demo-ssh` read a ZeRO-2 point at 1.183 s against 0.586 s
interleaved on the same machine, its sharded work at x12.8 of the catalog instead of x2.1-2.3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.standins.probe_log import probe_job_log
from tuner.config.parallel import ParallelConfig
from tuner.profile import probe
from tuner.profile.paired import aligned
from tuner.profile.probe import PROBE_ITERS, ProbeRun, probe_runs
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec

REPO = Path(__file__).resolve().parents[1]
BURST = 1.5
"""A third CPU-bound process on two cores: each rank gets two thirds of a core."""


def known_step(run: ProbeRun) -> float:
    """The stand-in's surface: a step is micro-batches x (a rest + layers x a layer) plus a
    rest per step, and sharding adds work per micro-batch that grows with the stage."""
    c = run.launched
    micro = c.global_batch_size // (c.micro_batch_size * c.dp)
    return micro * (0.03 + run.depth * 0.06 + 0.01 * c.zero_stage) + 0.02


def job_log(runs: list[ProbeRun], interleaved: bool, burst: range) -> str:
    """Node 0's log of the probe's job on the stand-in, the steps numbered as they ran in the
    job: those whose number is in ``burst`` ran :data:`BURST` times slower. ``interleaved``: as
    the DeepSpeed workload runs its points in one process (each point's first step in turn,
    then one step of each per round, in reverse on odd rounds, framed by resume/pause); else one
    point after the other."""
    done = 0

    def step(k: int, it: int) -> str:
        nonlocal done
        took = known_step(runs[k]) * (2.0 if it == 1 else 1.0) * (BURST if done in burst else 1)
        done += 1
        return (f"tuner-step: iter={it} time_s={took:.6f} samples_per_s=1.0 "
                f"max_allocated_gib=0.1 max_reserved_gib=0.1 rank=0")  # fmt: skip

    return probe_job_log(len(runs), interleaved, step)


def demo_ssh(monkeypatch: pytest.MonkeyPatch) -> StudySpec:
    monkeypatch.setenv("TUNER_DEMO_ROOT", str(REPO))
    monkeypatch.setenv("TUNER_DEMO_SSH", str(REPO / "results" / ".demo-ssh"))
    return load_study(str(REPO / "tuner" / "studies" / "demo-ssh.yaml"))


def interleaves(spec: StudySpec, runs: list[ProbeRun]) -> bool:
    """Whether the probe's job for ``spec`` asks its script to interleave the points."""
    ports = [spec.launch.master_port + k for k in range(len(runs))]
    hosts = tuple(spec.node_names[: spec.nodes_per_trial])
    _, files = probe.bundle(spec, runs, hosts, hosts[0], ports, "/probe")
    plan = files.get("probe-points.json")
    return plan is not None and bool(json.loads(plan)["interleave"])


@pytest.mark.parametrize("point", range(6))
def test_a_burst_during_one_point_of_the_demo_ssh_probe_moves_no_point_alone(
    monkeypatch: pytest.MonkeyPatch, point: int
) -> None:
    """Every point of the demo-ssh probe, as the terms read it (each row over its group's
    1-layer base, paired by round where the points interleaved), is the stand-in's known step
    times one common factor within 3%, whichever point's run a burst of eleven steps fell on."""
    spec = demo_ssh(monkeypatch)
    runs = probe_runs(spec)
    assert len(runs) == 6
    # the burst: eleven steps from the job's step that began ``point``'s run one after another
    start = point * PROBE_ITERS + 1
    log = job_log(runs, interleaves(spec, runs), range(start, start + PROBE_ITERS))
    rows = probe.rows_from_logs(spec, runs, [log])
    by_key: dict[str, dict[int, probe.ProbeRow]] = {}
    configs: dict[str, ParallelConfig] = {}
    for run, row in zip(runs, rows, strict=True):
        by_key.setdefault(row.key, {})[row.depth] = row
        configs[row.key] = run.launched
    read = aligned(by_key, configs)
    ratios = [read[r.key][r.depth].step_s / known_step(run)
              for run, r in zip(runs, rows, strict=True)]  # fmt: skip
    assert max(ratios) / min(ratios) < 1.03, ratios
