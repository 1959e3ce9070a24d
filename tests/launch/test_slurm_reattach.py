"""A tuner killed with SIGKILL while one Slurm job of it runs and another is queued, started
again, watches the same jobs to their end and records their results (no job cancelled, none
submitted again); a job of the study that belongs to no live trial is cancelled. Real local
Slurm (tools/local_slurm.py)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import optuna
import pytest
import yaml

from tests.test_study import standin_processes, tune
from tuner.layout import ResultsLayout
from tuner.report.leaderboard import leaderboard
from tuner.spec.file import study_from_mapping
from tuner.study.storage import open_storage

from .conftest import wait_for
from .slurm import LocalSlurm, local_slurm
from .test_slurm import _slurm_study

__all__ = ["local_slurm"]

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def _jobs() -> dict[str, str]:
    """Live tuner jobs: id -> state."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return {
        i: s for i, n, s in (line.split() for line in out.splitlines()) if n.startswith("tuner-t")
    }


def _sbatch(*opts: str) -> str:
    return subprocess.run(["sbatch", "--parsable", *opts, "--output=/dev/null", "--wrap",
                           "sleep 300"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def _adopted(results: Path) -> int:
    """Trials whose job a restarted worker watches (``reattached_from`` in the storage)."""
    storage = open_storage(None, ResultsLayout(results, "e2e"))
    trials = optuna.load_study(study_name="e2e", storage=storage).get_trials(deepcopy=False)
    return sum("reattached_from" in t.user_attrs for t in trials)


def test_sigkilled_tuner_reattaches_to_its_running_jobs(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    path = _slurm_study(tmp_path, "3", n_trials=2)
    results = tmp_path / "results"
    argv = ("run", "--study", str(path), "--results", str(results), "--quiet", "--skip-preflight")
    hold = _sbatch("--job-name=hold", "-N1", "--exclusive")  # one node busy: one trial queues
    first = tune(*argv, cwd=tmp_path)
    try:
        wait_for(lambda: sorted(_jobs().values()) == ["PENDING", "RUNNING"]
                 and len(standin_processes(tmp_path)) >= 2,
                 timeout=90, what="one trial job running its stand-ins, one queued")  # fmt: skip
        before = set(_jobs())
    finally:
        first.kill()  # SIGKILL: no cleanup of any kind
        first.wait()
    assert set(_jobs()) == before, "the jobs must outlive the tuner"
    # A job of the study no trial knows (the tuner died between sbatch and the storage).
    stray_dir = results / "e2e" / "trials" / "99"
    stray_dir.mkdir(parents=True)
    stray = _sbatch(f"--job-name=tuner-t99-{uuid.uuid4().hex}", "-N1", f"--chdir={stray_dir}")
    second = tune(*argv, cwd=tmp_path)
    try:
        wait_for(lambda: _adopted(results) == 2, timeout=90, what="both trials adopted")
    finally:
        subprocess.run(["scancel", hold], check=True)  # now the queued trial can start
    out = second.communicate(timeout=300)[0]
    assert second.returncode == 0, out
    assert _jobs() == {} and standin_processes(tmp_path) == []
    files = results.glob("e2e/trials/*/result.json")
    done = {r["job_id"]: r for r in (json.loads(p.read_text()) for p in files)}
    assert before <= set(done), "the same jobs, watched to their end"
    assert all(done[j]["exit_codes"] == [0] and not done[j]["cancelled"] for j in before), done
    # The "nodes" are this machine: a job whose rendezvous port another program held failed at
    # its start and ran again as a new trial (a node error), before the first tuner died. Any
    # other job is one submitted again: Slurm's ids grow, so it would come after the stray.
    earlier = set(done) - before
    assert all(int(j) < int(stray) for j in earlier), f"submitted again: {sorted(done)}"
    rows = leaderboard(study_from_mapping(yaml.safe_load(path.read_text())), include_all=True,
                       results=str(results))  # fmt: skip
    assert sorted(rows.outcome) == ["node_error"] * len(earlier) + ["ok", "ok"], rows.to_dict()
    assert stray not in _jobs()
    acct = subprocess.run(["scontrol", "show", "job", "-o", stray], capture_output=True,
                          text=True, check=False).stdout  # fmt: skip
    assert "JobState=CANCELLED" in acct, acct


def test_a_job_that_ended_while_the_tuner_was_dead_is_recorded_not_run_again(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    path = _slurm_study(tmp_path, "1", n_trials=1)
    results = tmp_path / "results"
    argv = ("run", "--study", str(path), "--results", str(results), "--quiet", "--skip-preflight")
    first = tune(*argv, cwd=tmp_path)
    try:
        wait_for(lambda: list(_jobs().values()) == ["RUNNING"], timeout=90,
                 what="the trial job running")  # fmt: skip
        before = set(_jobs())
    finally:
        first.kill()
        first.wait()
    wait_for(lambda: _jobs() == {}, timeout=120, what="the job ending by itself")
    trial_dir = results / "e2e" / "trials" / "0"
    assert not (trial_dir / "result.json").exists()  # nobody watched it end
    second = tune(*argv, cwd=tmp_path)
    out = second.communicate(timeout=300)[0]
    assert second.returncode == 0, out
    done = json.loads((trial_dir / "result.json").read_text())
    assert {done["job_id"]} == before and done["exit_codes"] == [0]
    assert sorted(p.name for p in (results / "e2e" / "trials").iterdir()) == ["0"]
    rows = leaderboard(study_from_mapping(yaml.safe_load(path.read_text())), include_all=True,
                       results=str(results))  # fmt: skip
    assert list(rows.outcome) == ["ok"], rows.to_dict()
