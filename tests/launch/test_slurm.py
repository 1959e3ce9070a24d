"""The Slurm executor on a real local Slurm (tools/local_slurm.py): the executor contract, the
batch script (golden file) and Slurm's own states."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_study import SURFACE, standin_processes, study_data, tune, write_study
from tuner.errors import ConfigError, LaunchError, StudyError
from tuner.launch import Executor, Job, LaunchRequest
from tuner.launch.slurm import SlurmExecutor, SlurmJob
from tuner.launch.slurm_alloc import SlurmAllocationExecutor
from tuner.launch.slurm_script import batch_script, sbatch_argv
from tuner.launch.slurm_states import job_state, parse_job
from tuner.layout import ResultsLayout
from tuner.report.leaderboard import leaderboard
from tuner.spec.file import study_from_mapping
from tuner.spec.study import SlurmSpec

from .conftest import live_processes, wait_for
from .contract import ExecutorContract, FakeClock
from .slurm import LocalSlurm, local_slurm, running_slurm

__all__ = ["local_slurm"]

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


@dataclass(frozen=True)
class TimeLimited:
    """A job Slurm's own time limit is to end, on a cluster of its own."""

    cluster: LocalSlurm
    executor: SlurmExecutor
    job: Job
    marker: str


@pytest.fixture(scope="module")
def time_limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TimeLimited]:
    """A one-minute job (``--time``'s minimum), submitted when the module's first test starts.

    Slurm ends it only at its first time-limit check past the minute, and slurmctld checks every
    30 s (a constant of its source, PERIODIC_TIMEOUT, no slurm.conf setting): 60 to 90 s that
    :func:`test_slurms_own_time_limit_is_a_timeout`, the module's last test, would otherwise
    spend waiting. Nothing polls the job meanwhile, as for a tuner that died; its own cluster
    keeps the other tests' nodes free, and its record of the ended job (MinJobAge) outlives the
    module."""
    base = tmp_path_factory.mktemp("slurm-limit")
    with running_slurm(base / "cluster", 1, min_job_age_s=3600) as cluster:
        ex = SlurmExecutor(SlurmSpec(poll_interval_s=0.5, time_limit_min=1), env=cluster.env)
        marker = f"tuner-marker-{uuid.uuid4().hex[:8]}"
        try:
            job = ex.submit(_request(base, 5, f"(exec -a {marker} sleep 3006)", nodes=1))
            yield TimeLimited(cluster, ex, job, marker)
        finally:
            ex.close()


# The contract's tests come first in the module: they start the time-limited job's wait.
@pytest.mark.usefixtures("local_slurm", "time_limited")
class TestSlurmExecutor(ExecutorContract):
    hosts = ("slurm-0", "slurm-1")

    def make_executor(self, **kwargs: Any) -> Executor:
        return SlurmExecutor(SlurmSpec(poll_interval_s=0.2), **kwargs)


def test_cluster_is_up(local_slurm: LocalSlurm) -> None:
    assert local_slurm.conf.exists()


# ----------------------------------------------------------------------------- the batch script

GOLDEN = Path(__file__).parent / "golden"


def test_batch_script_golden_with_hostile_paths(tmp_path: Path) -> None:
    """A 2-node trial in a directory no shell may split: the golden file says what sbatch gets.

    Re-record after an intended change with ``TUNER_REGOLD=1 pytest tests/launch/test_slurm.py``.
    """
    layout = ResultsLayout(Path("/results/a b 'c'; echo pwned"), "golden")
    spec = SlurmSpec(
        partition="gpu", account="proj-1", qos="high", gpus_per_node=8,
        extra_sbatch=("--constraint=h100",), container_image="nvcr.io#nvidia/pytorch:24.05-py3",
        container_mounts=("/lustre:/lustre",), setup=("module load cuda/12.4",),
    )  # fmt: skip
    request = LaunchRequest(
        trial=3, hosts=("slurm-0", "slurm-1"), scripts=("true", "true"),
        paths=layout.trial(3), timeout_s=20 * 60, env={"NCCL_DEBUG": "INFO it's"},
    )  # fmt: skip
    text = batch_script(spec, request, "0123abcd")
    path = GOLDEN / "slurm-job-2node.sh"
    if os.environ.get("TUNER_REGOLD"):
        path.write_text(text)
    assert path.exists(), f"record {path.name} with TUNER_REGOLD=1 pytest {__file__}"
    assert text == path.read_text(), (
        f"{path.name} differs from its golden file; if the change is intended, re-record with "
        f"TUNER_REGOLD=1 pytest {__file__}"
    )
    assert "#SBATCH --time=25" in text  # the trial's 20 min + the margin
    argv = sbatch_argv(request)
    assert argv[2] == f"--chdir={layout.trial(3).dir}"  # a path: argv, never an #SBATCH line
    assert not any("pwned" in line for line in text.splitlines() if line.startswith("#SBATCH"))


def test_bash_parses_the_batch_script_and_keeps_hostile_values_whole(tmp_path: Path) -> None:
    layout = ResultsLayout(tmp_path / "a b 'c'; echo pwned", "s")
    request = LaunchRequest(trial=0, hosts=("slurm-0",), scripts=("true",), paths=layout.trial(0),
                            env={"V": "a'; echo pwned"})  # fmt: skip
    text = batch_script(SlurmSpec(), request, "tok")
    head = text.split("cd ", 1)[0] + 'printf "%s\\n" "$V" "$TUNER_TRIAL_TOKEN"\n'
    done = subprocess.run(["bash", "-c", head], capture_output=True, text=True, check=True)
    assert done.stdout == "a'; echo pwned\ntok\n"


def test_bad_sbatch_lines_are_refused() -> None:
    with pytest.raises(ConfigError, match="extra_sbatch"):
        SlurmSpec(extra_sbatch=("--constraint=h100\nrm -rf /",))
    with pytest.raises(ConfigError, match="partition"):
        SlurmSpec(partition="gpu; rm")


# ----------------------------------------------------------------------------- Slurm's own states


def _squeue(name_part: str, env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                         check=True, env=env).stdout  # fmt: skip
    return [line for line in out.splitlines() if name_part in line]


def _request(tmp_path: Path, n: int, script: str, nodes: int = 2, **kw: Any) -> LaunchRequest:
    layout = ResultsLayout(tmp_path / "res", "states")
    return LaunchRequest(trial=n, hosts=tuple(f"slurm-{k}" for k in range(nodes)),
                         scripts=(script,) * nodes, paths=layout.trial(n), **kw)  # fmt: skip


def test_failed_job_records_job_id_hosts_and_exit_codes(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    ex = SlurmExecutor(SlurmSpec(poll_interval_s=0.2))
    try:
        job = ex.submit(_request(tmp_path, 0, 'echo "rank $SLURM_NODEID"; exit 7'))
        assert isinstance(job, SlurmJob)
        result = job.wait(timeout=60)
        assert result.exit_codes == (7, 7) and not result.ok and not result.node_errors
        assert result.job_id == job.job_id and result.job_id is not None
        assert sorted(result.hosts) == ["n1", "n2"]
        saved = json.loads(job.paths.result_json.read_text())
        assert saved["job_id"] == job.job_id and sorted(saved["hosts"]) == ["n1", "n2"]
        assert "rank 1" in job.paths.node_log(1).read_text()
        assert job.state == "FAILED"
        assert _squeue(job.token) == []
    finally:
        ex.close()


def test_setup_line_failing_before_srun_gives_every_node_slurms_exit_code(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    ex = SlurmExecutor(SlurmSpec(poll_interval_s=0.2, setup=("exit 4",)))
    try:
        result = ex.submit(_request(tmp_path, 1, "echo never")).wait(timeout=60)
        assert result.exit_codes == (4, 4) and not result.timed_out
    finally:
        ex.close()


def test_sbatch_refusal_is_a_launch_error(local_slurm: LocalSlurm, tmp_path: Path) -> None:
    ex = SlurmExecutor(SlurmSpec(partition="nosuchpartition"))
    try:
        with pytest.raises(LaunchError, match="^trial 2: sbatch refused the job.*partition"):
            ex.submit(_request(tmp_path, 2, "true"))
        # tune profile's jobs are no trial: the message names them as what they are
        with pytest.raises(LaunchError, match="^the framework probe's job: sbatch refused"):
            ex.submit(_request(tmp_path, 0, "true", label="the framework probe's job"))
    finally:
        ex.close()


def test_queue_time_is_not_trial_time(local_slurm: LocalSlurm, tmp_path: Path) -> None:
    """A job waiting for nodes never times out; its limit counts from RUNNING."""
    clock = FakeClock()
    ex = SlurmExecutor(SlurmSpec(poll_interval_s=0.1), clock=clock, grace_s=1.0)
    go = tmp_path / "go"
    try:
        blocker = ex.submit(
            _request(tmp_path, 3, f"while [ ! -e {str(go)!r} ]; do sleep 0.1; done")
        )
        wait_for(lambda: blocker.poll() is None and getattr(blocker, "state", "") == "RUNNING",
                 what="the blocker running")  # fmt: skip
        marker = f"tuner-marker-{uuid.uuid4().hex[:8]}"
        job = ex.submit(_request(tmp_path, 4, f"(exec -a {marker} sleep 3005)", timeout_s=60))
        wait_for(lambda: job.poll() is None and getattr(job, "state", "") == "PENDING",
                 what="the second job pending")  # fmt: skip
        clock.now += 600  # ten minutes in the queue
        time.sleep(0.3)
        assert job.poll() is None, "a pending job was timed out"
        go.touch()
        assert blocker.wait(timeout=60).ok
        wait_for(lambda: len(live_processes(marker)) == 2, what="the second job running")
        wait_for(lambda: job.poll() is None and getattr(job, "state", "") == "RUNNING",
                 what="RUNNING seen")  # fmt: skip
        clock.now += 61
        result = job.poll()
        assert result is not None and result.timed_out
        assert live_processes(marker) == [] and _squeue(job.token) == []
    finally:
        for j in ("blocker", "job"):
            if j in locals() and not locals()[j].done:
                locals()[j].cancel()
        ex.close()


def test_submit_mode_inside_an_allocation_runs_the_trial(
    local_slurm: LocalSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tune started inside an allocation (its SLURM_JOB_ID, SLURM_MEM_PER_CPU) submits trials
    whose srun runs; given those variables anyway, srun's words in the job's output file are
    the trial's reason (before: "exited with code 1", srun's message unread)."""
    leaky_env = {**os.environ, "SLURM_MEM_PER_CPU": "100"}  # no SLURM_JOB_ID: kept as given
    monkeypatch.setenv("SLURM_JOB_ID", "999999")
    monkeypatch.setenv("SLURM_MEM_PER_CPU", "100")
    # A per-node memory request (a cluster's DefMemPerNode does the same): the trial's job then
    # has SLURM_MEM_PER_NODE, which srun refuses beside an inherited SLURM_MEM_PER_CPU.
    spec = SlurmSpec(poll_interval_s=0.2, extra_sbatch=("--mem=500",))
    ex, leaky = SlurmExecutor(spec), SlurmExecutor(spec, env=leaky_env)
    try:
        job = ex.submit(_request(tmp_path, 8, "echo ran", nodes=1))
        failing = leaky.submit(_request(tmp_path, 9, "echo ran", nodes=1))
        result, failed = job.wait(timeout=60), failing.wait(timeout=60)
        assert result.ok and "ran" in job.paths.node_log(0).read_text()
        assert failed.exit_codes == (1,) and failed.scheduler_verdict is not None
        outcome, reason = failed.scheduler_verdict
        assert outcome == "launch_error" and "srun: fatal: " in reason, reason
        assert "mutually exclusive" in reason
        assert f"slurm-{getattr(failing, 'job_id', None)}.out" in reason
    finally:
        ex.close()
        leaky.close()


# ----------------------------------------------------------------------------- studies via the CLI


def _slurm_study(tmp_path: Path, time_scale: str, n_trials: int) -> Path:
    data = study_data(tmp_path, SURFACE, n_trials=n_trials, enqueue_top=n_trials)
    data["cluster"] = {
        "gpu": "a100-80gb",
        "gpus_per_node": 2,
        "num_nodes": 1,
        "executor": "slurm",
        "slurm": {"max_jobs": 2, "poll_interval_s": 0.3},
    }
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = time_scale
    return write_study(tmp_path, data)  # fmt: skip


def _running_tuner_jobs() -> int:
    out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%j"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return sum(name.startswith("tuner-t") for name in out.split())


def _results(tmp_path: Path) -> list[dict[str, Any]]:
    trials = tmp_path / "results" / "e2e" / "trials"
    return [json.loads(p.read_text()) for p in sorted(trials.glob("*/result.json"))]


def test_study_runs_through_slurm_two_trials_at_once(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    # paced (a 1-2.5 s step sleeps a fifth of it) so that both jobs are seen running at once
    path = _slurm_study(tmp_path, "0.2", n_trials=4)
    proc = tune("run", "--study", str(path), "--results", str(tmp_path / "results"), "--quiet",
                "--skip-preflight",  # the stand-in plays GPUs; the nodes have no nvidia-smi
                cwd=tmp_path)  # fmt: skip
    most = 0
    while proc.poll() is None:
        most = max(most, _running_tuner_jobs())
        time.sleep(0.2)
    out = proc.communicate()[0]
    assert proc.returncode == 0, out
    assert most == 2, f"at most {most} trial jobs ran at once"
    results = _results(tmp_path)
    rows = leaderboard(study_from_mapping(yaml.safe_load(path.read_text())), include_all=True,
                       results=str(tmp_path / "results"))  # fmt: skip
    # All "nodes" are this machine, shared with other tests: a rendezvous port someone else
    # holds is a node error and the trial runs again, so a retried job may be extra.
    outcomes = list(rows.outcome)
    assert outcomes.count("ok") == 4 and set(outcomes) <= {"ok", "node_error"}, rows.to_dict()
    assert len(results) >= 4 and all(r["job_id"] for r in results), results
    assert len({r["job_id"] for r in results}) == len(results)
    ok = [r for r in results if r["exit_codes"] == [0]]
    assert len(ok) >= 4 and all(r["hosts"][0] in ("n1", "n2") for r in results)
    assert _running_tuner_jobs() == 0 and standin_processes(tmp_path) == []


def test_ctrl_c_cancels_every_job_of_the_study(local_slurm: LocalSlurm, tmp_path: Path) -> None:
    path = _slurm_study(tmp_path, "5", n_trials=4)
    proc = tune("run", "--study", str(path), "--results", str(tmp_path / "results"), "--quiet",
                "--skip-preflight",  # the stand-in plays GPUs; the nodes have no nvidia-smi
                cwd=tmp_path)  # fmt: skip
    try:
        wait_for(lambda: _running_tuner_jobs() == 2 and len(standin_processes(tmp_path)) >= 4,
                 timeout=90, what="two trial jobs running their stand-ins")  # fmt: skip
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert _squeue("tuner-t") == [] and standin_processes(tmp_path) == []
    rows = leaderboard(study_from_mapping(yaml.safe_load(path.read_text())), include_all=True,
                       results=str(tmp_path / "results"))  # fmt: skip
    assert list(rows.outcome).count("interrupted") == 2, rows


# ----------------------------------------------------------------------------- cluster.slurm


def _readme_cluster() -> dict[str, Any]:
    """The cluster of the first study in the Slurm guide (docs/guides/slurm.md)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "slurm.md").read_text()
    section = text.split("## Submit mode\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    cluster: dict[str, Any] = yaml.safe_load(block)["cluster"]
    return cluster


def test_readme_cluster_example_loads_and_gives_slots(tmp_path: Path) -> None:
    data = study_data(tmp_path, SURFACE, nodes_per_trial="all")
    data["cluster"] = _readme_cluster()
    spec = study_from_mapping(data)
    assert spec.cluster.slurm.partition == "gpu" and spec.cluster.slurm.max_jobs == 4
    assert spec.node_names == tuple(f"slurm-{i}" for i in range(8))  # 2 nodes x 4 jobs
    assert spec.nodes_per_trial == 2 and spec.world_size == 16


def test_cluster_slurm_is_strict(tmp_path: Path) -> None:
    data = study_data(tmp_path, SURFACE)
    data["cluster"] = {**_readme_cluster(), "slurm": {"partiton": "gpu"}}
    with pytest.raises(ConfigError, match="partiton"):
        study_from_mapping(data)
    data["cluster"] = {k: v for k, v in _readme_cluster().items() if k != "num_nodes"}
    data["cluster"]["nodes"] = ["gpu001"]
    with pytest.raises(ConfigError, match="num_nodes"):
        study_from_mapping(data)


def test_mode_picks_the_executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.study.launchers import make_executor

    data = study_data(tmp_path, SURFACE)
    data["cluster"] = {**_readme_cluster(), "slurm": {"mode": "allocation"}}
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(StudyError, match="SLURM_JOB_ID is not set"):
        make_executor(study_from_mapping(data))
    data["cluster"]["slurm"] = {"mode": "auto"}
    ex = make_executor(study_from_mapping(data))
    try:
        assert isinstance(ex, SlurmExecutor)
    finally:
        ex.close()


@pytest.mark.parametrize("job_id", ["abc", "--help", "12 34", "-1", "7\nx", "\uff17"])
def test_a_job_id_that_is_no_number_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_id: str
) -> None:
    """A garbage ``SLURM_JOB_ID`` (a login shell's, a script's) was asked of Slurm: "Slurm job
    abc does not exist" named no variable, and ``--help`` made scontrol print its help, read as
    a job with no nodes. Refused before Slurm is asked, naming the variable and the mode."""
    from tuner.study.launchers import make_executor

    data = study_data(tmp_path, SURFACE)
    data["cluster"] = {**_readme_cluster(), "slurm": {"mode": "auto"}}
    monkeypatch.setenv("SLURM_JOB_ID", job_id)
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: asking Slurm fails otherwise
    with pytest.raises(StudyError, match=r"SLURM_JOB_ID is .*, no Slurm job id \(a number\)"):
        make_executor(study_from_mapping(data))


# ----------------------------------------------------------------------------- allocation mode


@pytest.fixture(scope="class")
def allocation(local_slurm: LocalSlurm) -> Iterator[str]:
    """A job holding both nodes, as ``salloc`` would; trials run as its steps. Class-scoped:
    while it runs, no other job of the module gets a node."""
    argv = [
        "sbatch",
        "--parsable",
        "-N2",
        "--exclusive",
        "--output=/dev/null",
        "--wrap",
        "sleep 3000",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    job_id = done.stdout.strip()
    try:
        wait_for(lambda: "RUNNING" in subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout,
            what="the allocation running")  # fmt: skip
        yield job_id
    finally:
        subprocess.run(["scancel", job_id], check=False)
        wait_for(lambda: _squeue(f"{job_id} ") == [], what="the allocation gone")


class TestSlurmAllocationExecutor(ExecutorContract):
    hosts = ("slurm-0", "slurm-1")

    @pytest.fixture(autouse=True)
    def _job(self, allocation: str) -> None:
        self.job_id = allocation

    def make_executor(self, **kwargs: Any) -> Executor:
        return SlurmAllocationExecutor(SlurmSpec(), job_id=self.job_id, **kwargs)

    def test_slots_are_the_allocations_nodes_in_order(self) -> None:
        ex = SlurmAllocationExecutor(job_id=self.job_id)
        try:
            assert [ex.host(h) for h in self.hosts] == ["n1", "n2"]
            assert ex.master_addr(("slurm-1",)) == "127.0.0.1"  # n2's NodeAddr
            with pytest.raises(StudyError, match="has 2"):
                ex.check_slots(("slurm-0", "slurm-1", "slurm-2"))
        finally:
            ex.close()


def test_study_inside_an_allocation_runs_trials_as_steps(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    """tune run inside sbatch (mode auto -> allocation): each slot is one node of the job."""
    path = _slurm_study(tmp_path, "0.0001", n_trials=4)  # nothing here waits on a pace
    results = tmp_path / "results"
    command = shlex.join([sys.executable, "-m", "tuner.cli.main", "run", "--study", str(path),
                          "--results", str(results), "--quiet", "--skip-preflight"])  # fmt: skip
    done = subprocess.run(["sbatch", "--parsable", "-N2", "--exclusive", f"--chdir={tmp_path}",
                           f"--output={tmp_path}/tune.out", "--wrap", command],
                          capture_output=True, text=True, check=True)  # fmt: skip
    job_id = done.stdout.strip()
    try:
        wait_for(lambda: _squeue(f"{job_id} ") == [], timeout=240, what="tune's job to end")
    finally:
        subprocess.run(["scancel", job_id], check=False)
    out = (tmp_path / "tune.out").read_text()
    state = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                           text=True, check=True).stdout  # fmt: skip
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, out
    rows = leaderboard(study_from_mapping(yaml.safe_load(path.read_text())), include_all=True,
                       results=str(results))  # fmt: skip
    outcomes = list(rows.outcome)  # node_error: a rendezvous port held by another test
    assert outcomes.count("ok") == 4 and set(outcomes) <= {"ok", "node_error"}, (rows, out)
    logs = [p.read_text() for p in sorted(results.glob("e2e/trials/*/node-0.log"))]
    assert len(logs) >= 4 and all(logs)
    assert _squeue("tuner-t") == [] and standin_processes(tmp_path) == []


def test_parse_job_keeps_values_with_spaces_whole() -> None:
    line = ("JobId=12 JobName=tuner-t3-ab JobState=CANCELLED Reason=None ExitCode=0:15 "
            "NodeList=n[1-2] Command=/r/a b 'c'; echo x=1/slurm-job.sh WorkDir=/r/a b "
            "StdOut=/r/a b/slurm-12.out")  # fmt: skip
    fields = parse_job(line + "\n")
    assert fields["JobState"] == "CANCELLED" and fields["ExitCode"] == "0:15"
    assert fields["Command"] == "/r/a b 'c'; echo x=1/slurm-job.sh"
    assert fields["WorkDir"] == "/r/a b" and fields["NodeList"] == "n[1-2]"
    assert job_state({"JobState": "CANCELLED by 0"}) == "CANCELLED"
    assert parse_job("") == {}


def test_the_shipped_slurm_demo_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.spec.file import load_study

    monkeypatch.setenv("TUNER_DEMO_ROOT", str(Path(__file__).resolve().parents[2]))
    spec = load_study("demo-slurm", cwd=Path(__file__).resolve().parents[2])
    assert spec.cluster.executor == "slurm" and spec.cluster.slurm.mode == "submit"
    assert spec.node_names == ("slurm-0", "slurm-1") and spec.world_size == 2


@pytest.mark.torch
def test_profile_runs_through_slurm(local_slurm: LocalSlurm, tmp_path: Path) -> None:
    """``tune profile`` is one sbatch job like a trial: torchrun on both nodes (gloo), the
    profile saved, nothing left queued or running."""
    pytest.importorskip("torch", reason="the probe runs torch.distributed (gloo)")
    from tests.test_profile import QUICK, probe_processes, study
    from tuner.layout import ClusterLayout
    from tuner.profile.run import load_profile

    data = study(
        cluster={"gpus_per_node": 1, "num_nodes": 2, "executor": "slurm",
                 "slurm": {"poll_interval_s": 0.3}},
        launch={"env": {"GLOO_SOCKET_IFNAME": "lo"}, "master_port": 29771},
    )  # fmt: skip
    path, results = write_study(tmp_path, data), tmp_path / "results"
    proc = tune("profile", "--study", str(path), "--results", str(results), *QUICK, cwd=tmp_path)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    assert _squeue("tuner-") == [] and probe_processes(tmp_path) == []
    spec = study_from_mapping(data)
    profile = load_profile(ClusterLayout(results.resolve(), spec.cluster_name).profile_yaml)
    assert profile.world_size == 2 and profile.versions["backend"] == "gloo"
    # one rank per node: every group spans the two nodes
    assert {c.link for c in profile.collectives} == {"inter"}
    assert profile.stream is not None and profile.attention and profile.gemm


# ----------------------------------------------------------------------------- last: a minute on


def test_slurms_own_time_limit_is_a_timeout(time_limited: TimeLimited) -> None:
    """The backstop for a dead tuner: Slurm's --time (1 min, its minimum) ends the job. Last in
    the module: the job has run its minute while the tests above ran (:func:`time_limited`)."""
    job = time_limited.job
    result = job.wait(timeout=150)
    assert result.timed_out and not result.ok
    assert job.state == "TIMEOUT"  # type: ignore[attr-defined]
    assert live_processes(time_limited.marker) == []
    assert _squeue(job.token, time_limited.cluster.env) == []
