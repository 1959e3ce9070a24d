"""A burst of load over one point's run of a probe that runs one point per launch (every Megatron
study: Megatron cannot run several configs in one process) is found and that point measured
again in the same job (tuner.profile.recheck). The job here is the node scripts' protocol played
by a stand-in executor: the first pass's node log (Megatron's own lines), then, once the probe's
verdict is in the job directory, the named points' second runs. The demo-ssh probe run one
point after another read one point's steps at x1.5 for 9 of its 10 steady steps, which took the
layer time to x2.17 and the rest per micro-batch and the sharded work to nil.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.standins.probe_log import probe_job_log
from tests.test_stack_terms import STUDY, spec_of, true_peak, true_step
from tuner.layout import TrialPaths
from tuner.models.memory.estimate import GIB
from tuner.profile import probe
from tuner.profile.probe import POINT, PROBE_ITERS, ProbeRun, probe_runs, run_stack_probe
from tuner.profile.stack_terms import derive_terms
from tuner.spec.study import StudySpec

BURST = 1.5
"""A third CPU-bound process on two cores: each rank gets two thirds of a core."""
VERDICT = "probe-recheck.txt"
"""The file the node scripts wait for (tuner.profile.probe.RECHECK), spelled here so that the
test runs on a tree without it."""


def megatron_data() -> dict[str, Any]:
    """The stand-in study as a Megatron-LM one: distributed optimizer in place of ZeRO."""
    data = copy.deepcopy(STUDY)
    data["framework"] = "megatron"
    data["launch"] = {"template": "megatron_gpt", "megatron_path": "/opt/Megatron-LM"}
    data["space"].pop("zero_stage")
    data["space"]["distributed_optimizer"] = [False, True]
    return data


def megatron() -> StudySpec:
    return spec_of(megatron_data())


def known(spec: StudySpec, run: ProbeRun) -> float:
    """The stand-in's step at the run's config and depth (tests/test_stack_terms.py's
    surface)."""
    return true_step(spec, run.launched, run.depth * run.config.pp * run.config.vp)


def log_of(spec: StudySpec, runs: list[ProbeRun], slow: Callable[[int, int], float]) -> str:
    """Node 0's first pass, Megatron's lines, point ``k``'s iteration ``it`` ``slow(k, it)``
    times the surface (its first iteration twice: the warm-up)."""

    def step(k: int, it: int) -> str:
        took = known(spec, runs[k]) * (2.0 if it == 1 else 1.0) * slow(k, it)
        text = (f" [2026-01-05 10:00:00] iteration {it:8d}/{PROBE_ITERS:8d} | elapsed time per "
                f"iteration (ms): {took * 1e3:.3f} | learning rate: 1.0E-04 | global batch "
                f"size: {runs[k].launched.global_batch_size:5d} | lm loss: 1.0E+01 |")  # fmt: skip
        if it == 1:
            layers = runs[k].depth * runs[k].config.pp
            mb = true_peak(spec, runs[k].launched, layers) / 2**20
            text += (f"\n[Rank 0] (after 1 iterations) memory (MB) | allocated: {mb} | max "
                     f"allocated: {mb} | reserved: {mb} | max reserved: {mb}")  # fmt: skip
        return text

    return probe_job_log(len(runs), False, step)


class Nodes:
    """The probe's job as its node scripts run it: ``first`` (the first pass's log) at once,
    then, when the probe's verdict has come (:meth:`send_files`), each named point again
    (``again(k)``: its lines) framed as the scripts frame a second run; a probe that sends no
    verdict sees the job end after its first pass."""

    def __init__(self, first: str, again: Callable[[int], str]) -> None:
        self.first, self.again = first, again
        self.paths: TrialPaths | None = None
        self.verdict: list[int] | None = None
        self.polls = 0

    def master_addr(self, hosts: Any) -> str:
        return "127.0.0.1"

    def master_port(self, hosts: Any, preferred: int) -> int:
        return preferred

    def submit(self, request: Any) -> Nodes:
        self.paths = request.paths
        request.paths.node_log(0).write_text(self.first)
        return self

    def send_files(self, request: Any, files: dict[str, str]) -> None:
        for name, text in files.items():
            (request.paths.dir / name).write_text(text)

    def poll(self) -> Any:
        assert self.paths is not None
        self.polls += 1
        verdict = self.paths.dir / VERDICT
        if verdict.exists():
            self.verdict = [int(k) for k in verdict.read_text().split()]
            with self.paths.node_log(0).open("a") as log:
                for k in self.verdict:
                    log.write(f"{POINT} {k} again\n{self.again(k)}{POINT} {k} end rc=0\n")
        elif self.polls < 3:
            return None
        return type("Result", (), {"ok": True})()

    def cancel(self) -> None:
        pass


def probed(tmp_path: Path, spec: StudySpec, slow: Callable[[int, int], float]) -> tuple[
        list[ProbeRun], Any, Nodes]:  # fmt: skip
    """The probe's rows through :class:`Nodes`: the first pass slowed by ``slow``, every second
    run at the surface."""
    runs = probe_runs(spec)
    clean = log_of(spec, runs, lambda k, it: 1.0)
    parts = probe.split_points(clean)
    nodes = Nodes(log_of(spec, runs, slow), lambda k: parts[k])
    found = run_stack_probe(spec, nodes, TrialPaths(tmp_path / "probe"), poll_s=0.0)
    return runs, found, nodes


def test_the_probe_points_of_a_megatron_study_run_one_per_launch() -> None:
    spec = megatron()
    runs = probe_runs(spec)
    # base at 1 and 4 layers, at twice the micro-batches, full recomputation and the
    # distributed optimizer at 4, the pipeline point
    assert len(runs) == 6 and not spec.launch.probe_one_process


@pytest.mark.parametrize("point", range(6))
def test_a_burst_over_one_point_is_measured_again_and_the_terms_are_the_surfaces(
    tmp_path: Path, point: int
) -> None:
    """A burst over 9 of the 10 steady steps of each point in turn (as on the demo): that point
    is measured again (and no other), its quiet second run kept, and every row is the stand-in's
    surface within 1%; the terms are those of a probe without the burst within 1%. A probe
    without it keeps the burst's level in that row (x1.5 less the one quiet step)."""
    spec = megatron()
    _, quiet, _ = probed(tmp_path / "quiet", spec, lambda k, it: 1.0)
    runs, found, nodes = probed(
        tmp_path / "burst", spec, lambda k, it: BURST if k == point and it < PROBE_ITERS else 1.0
    )
    for run, row in zip(runs, found.rows, strict=True):
        assert row.step_s / known(spec, run) == pytest.approx(1.0, rel=0.01), (run, row.step_s)
    assert nodes.verdict == [point]
    assert found.rows[point].rechecked and not found.rows[point].uncertain
    assert "two levels" in found.rows[point].rechecked and "the second kept" in (
        found.rows[point].rechecked)  # fmt: skip
    assert found.recheck_s >= 0.0
    clean, burst = derive_terms(spec, quiet.rows), derive_terms(spec, found.rows)
    for a, b in zip(clean.points, burst.points, strict=True):
        for name in ("layer_scale", "fixed_scale", "step_scale", "overhead_scale"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None) and (x is None or y == pytest.approx(x, rel=0.01))


def test_a_probe_without_a_burst_measures_nothing_again(tmp_path: Path) -> None:
    """Nothing runs again without a burst, nor with each step's own noise (up to 4% either way,
    twice the spread of the demo-ssh probe's quiet runs one after another)."""
    spec = megatron()
    _, noisy, nodes = probed(
        tmp_path / "noisy", spec, lambda k, it: 1 + 0.04 * math.sin(7 * k + 3 * it)
    )
    assert nodes.verdict == [] and not any(r.rechecked for r in noisy.rows)
    runs, found, nodes = probed(tmp_path, spec, lambda k, it: 1.0)
    assert nodes.verdict == [] and not any(r.rechecked for r in found.rows)
    for run, row in zip(runs, found.rows, strict=True):
        assert row.step_s == pytest.approx(known(spec, run), rel=1e-4)
        peak = true_peak(spec, run.launched, run.depth * run.config.pp) / GIB
        assert row.peak_gib == pytest.approx(peak, rel=1e-3)


def test_a_burst_over_the_whole_deeper_base_run_puts_a_part_under_nil_and_is_measured_again(
    tmp_path: Path,
) -> None:
    """A burst over every step of the base's deeper run leaves one level in it; the parts
    composed from it do not hold (the layer takes the burst, the sharded work of the distributed
    optimizer's point goes under nil): the base at both depths is measured again, and the rows
    are the surface."""
    spec = megatron()
    runs, found, nodes = probed(tmp_path, spec, lambda k, it: BURST if k == 1 else 1.0)
    assert nodes.verdict == [1, 0]  # the base's two depths, the deeper first (reverse order)
    assert "sharded work" in found.rows[1].rechecked and "under nil" in found.rows[1].rechecked
    for run, row in zip(runs, found.rows, strict=True):
        assert row.step_s / known(spec, run) == pytest.approx(1.0, rel=0.01), run


def test_a_point_still_inconsistent_after_its_second_run_is_reported_not_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A point whose second run holds two levels too is measured again once only, kept at its
    faster run, and said to be uncertain (its samples both runs', so the spread its terms state
    covers the two); ``tune profile --probe`` prints what it measured again, why, and the cost."""
    import yaml

    import tuner.study.launchers as launchers
    from tuner.cli.main import main
    from tuner.profile import stack_terms

    spec = megatron()
    runs = probe_runs(spec)
    slow = lambda k, it: BURST if k == 3 and it < PROBE_ITERS else 1.0  # noqa: E731
    parts = probe.split_points(log_of(spec, runs, lambda k, it: 1.3 if k == 3 and it > 5 else 1))
    nodes = Nodes(log_of(spec, runs, slow), lambda k: parts[k])
    data = {**megatron_data(), "name": "mt"}
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "mt.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    nodes.close = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setattr(launchers, "make_executor", lambda spec: nodes)
    # the local stack's versions (a torch import, seconds): the probe's log reports none
    monkeypatch.setattr(stack_terms, "local_versions", dict)
    assert main(["profile", "--study", "mt", "--probe"]) == 0
    out = capsys.readouterr().out
    assert nodes.verdict == [3] and nodes.polls == 2  # one verdict, then the job's end
    assert "measured again: " in out and "two levels in its run" in out
    assert "uncertain: two levels" in out and "(its sharded work) states both runs' spread" in out
    assert re.search(r"\(\d[\d.]* (s|min|h) of it measuring 1 point\(s\) again\)", out), out
    from tuner.layout import ClusterLayout
    from tuner.profile.probe_file import load_probe

    saved = load_probe(ClusterLayout(tmp_path / "results", spec.cluster_name)
                       .stack_yaml("mt"), spec)["rows"]  # fmt: skip
    assert saved[3].uncertain and len(saved[3].samples_s) == 20
    # the faster run: its second, at x1.3 over six of its ten steady steps
    assert saved[3].step_s == pytest.approx(1.3 * known(spec, runs[3]), rel=0.01)


def test_two_levels_in_one_run_whichever_share_of_it_a_burst_took() -> None:
    """A burst over all of a run's steady steps but one (the median at the burst's level, the
    quiet step apart), over half of it (the median between the two levels: the level moved in
    the middle of the run, as the demo-ssh probe's 1-layer base did, six steps at 344-462 ms
    then four at 245-257 ms) or over its last six or four; not a run's own noise."""
    from tuner.profile.probe import ProbeRow
    from tuner.profile.recheck import two_levels

    def row(steps: list[float]) -> ProbeRow:
        return ProbeRow(key="k", depth=1, step_s=statistics.median(steps),
                        samples_s=tuple(steps), peak_gib=1.0, reserved_gib=None)  # fmt: skip

    assert two_levels(row([1.5] * 9 + [1.0]))
    assert two_levels(row([1.0] * 5 + [1.5] * 5))  # median 1.25: the min alone passes it
    assert two_levels(row([0.344, 0.40, 0.462, 0.41, 0.38, 0.36, 0.245, 0.25, 0.257, 0.25]))
    assert two_levels(row([1.0] * 4 + [1.5] * 6))
    assert two_levels(row([1.0] * 6 + [1.5] * 4))  # the median at the quiet level: one launch
    assert not two_levels(row([1 + 0.04 * math.sin(3 * i) for i in range(10)]))
    assert not two_levels(dataclasses.replace(row([1.5] * 9 + [1.0]), rounds=tuple(range(10))))
