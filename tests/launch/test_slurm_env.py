"""Submit mode started inside an allocation, without Slurm: the environment the trials' jobs get,
the warning, and the reason read from a job's output file when it failed before its nodes ran."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from tuner.launch import LaunchRequest
from tuner.launch.slurm import SlurmExecutor, SlurmJob
from tuner.launch.slurm_alloc import make_slurm_executor
from tuner.launch.slurm_env import enclosing_job_variables, submit_env
from tuner.launch.slurm_states import Accounting, output_failure
from tuner.layout import ResultsLayout
from tuner.spec.study import SlurmSpec

# What `salloc -N2 --mem-per-cpu=1000` and `srun --pty bash` inside it leave in the shell
# (names from sbatch(1), salloc(1) and srun(1) "OUTPUT ENVIRONMENT VARIABLES"), beside the
# user's own settings.
ALLOCATION = {
    "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_MEM_PER_CPU": "1000",
    "SLURM_NNODES": "2", "SLURM_NTASKS": "2", "SLURM_CPUS_PER_TASK": "4",
    "SLURM_TRES_PER_TASK": "cpu:4", "SLURM_STEP_ID": "0", "SLURM_UMASK": "0022",
    "SLURMD_NODENAME": "n1", "SBATCH_MEM_BIND": "local", "SRUN_DEBUG": "3",
}  # fmt: skip
USER = {
    "PATH": "/usr/bin", "HOME": "/home/u", "SLURM_CONF": "/etc/slurm/slurm.conf",
    "SLURM_CLUSTERS": "c1", "SLURM_TIME_FORMAT": "standard", "SBATCH_ACCOUNT": "proj",
    "SBATCH_PARTITION": "gpu", "SRUN_CPUS_PER_TASK": "8",
}  # fmt: skip


def test_the_enclosing_jobs_variables_are_dropped_and_the_users_kept() -> None:
    assert submit_env({**USER, **ALLOCATION}) == USER
    assert enclosing_job_variables({**USER, **ALLOCATION}) == sorted(ALLOCATION)


def test_outside_an_allocation_the_environment_is_the_users() -> None:
    """On a login node a SLURM_* variable was set on purpose: nothing is dropped."""
    env = {**USER, "SLURM_MEM_PER_CPU": "1000", "SLURM_ACCOUNT": "proj"}
    assert submit_env(env) == env and enclosing_job_variables(env) == []


def test_the_executor_submits_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = SlurmExecutor(SlurmSpec(), env={**USER, **ALLOCATION})
    assert ex.commands.env == USER
    for k in [k for k in os.environ if k.startswith(("SLURM", "SBATCH", "SRUN"))]:
        monkeypatch.delenv(k)
    assert SlurmExecutor(SlurmSpec()).commands.env is None  # outside: the live environment
    for k, v in ALLOCATION.items():
        monkeypatch.setenv(k, v)
    env = SlurmExecutor(SlurmSpec()).commands.env
    assert env is not None and not set(env) & set(ALLOCATION) and env["PATH"]


def _submit_warnings(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, env: dict[str, str]
) -> list[str]:
    """What making a submit-mode executor warns with ``env`` set."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with caplog.at_level(logging.WARNING, logger="tuner.launch.slurm_alloc"):
        ex = make_slurm_executor(SlurmSpec(mode="submit"), ("slurm-0",))
    assert isinstance(ex, SlurmExecutor)
    return [r.getMessage() for r in caplog.records]


def test_submit_mode_inside_an_allocation_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    said = _submit_warnings(monkeypatch, caplog, ALLOCATION)
    assert len(said) == 1 and "inside Slurm job 4242" in said[0], said
    assert "every trial is its own job" in said[0] and "SLURM_CPUS_PER_TASK" in said[0]
    for k in ALLOCATION:
        monkeypatch.delenv(k)
    caplog.clear()
    make_slurm_executor(SlurmSpec(mode="submit"), ("slurm-0",))
    assert caplog.records == []


# What a process started by `srun --mpi=pmix` (Slurm's PMIx plugin), `srun --mpi=pmi2` and Open
# MPI's mpirun carries (their servers' addresses, its rank and size), beside the user's own
# MPI and PMIx parameters and Slurm's PMI library settings (srun(1)).
LAUNCH = {
    "PMIX_RANK": "0", "PMIX_NAMESPACE": "slurm.pmix.4242.0", "PMIX_SERVER_URI3": "pmix-server",
    "PMIX_SERVER_URI21": "pmix-server", "PMIX_SERVER_TMPDIR": "/var/spool/pmix.4242.0",
    "PMIX_SECURITY_MODE": "native", "PMIX_HOSTNAME": "n1", "PMI_RANK": "0", "PMI_SIZE": "2",
    "PMI_FD": "7", "PMI_JOBID": "4242.0", "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_UNIVERSE_SIZE": "2",
    "OMPI_MCA_orte_hnp_uri": "1234.0;tcp://10.0.0.1:5000", "OMPI_MCA_ess": "^singleton",
    "OMPI_MCA_pmix": "^s1,s2,cray,isolated", "OMPI_FILE_LOCATION": "/scratch/ompi.n1/pid.7/0/0",
}  # fmt: skip
MPI_USER = {
    "OMPI_MCA_btl_tcp_if_include": "ib0", "PMIX_MCA_gds": "hash", "PMI_FANOUT": "32",
    "PMI_TIME": "500",
}  # fmt: skip


def test_an_enclosing_mpi_launch_s_variables_are_dropped_and_the_user_s_kept() -> None:
    """``tune run`` from a shell started by ``srun --mpi=pmix --pty bash`` (or under mpirun)
    exported that step's PMIx, PMI and Open MPI variables into every trial's job: its server's
    address, its rank and size (0 of 2). A process there that initialises MPI or PMIx (mpi4py,
    an MPI-aware library, Slurm's own PMI library under an srun whose plugin sets fewer names)
    took itself for rank 0 of the enclosing step and reached for that step's server. As
    mpirun itself clears them for what it starts, the trials' jobs get none of them; the
    user's ``OMPI_MCA_*``, ``PMIX_MCA_*`` and srun's ``PMI_FANOUT``/``PMI_TIME`` stay."""
    env = {**USER, **MPI_USER, **ALLOCATION, **LAUNCH}
    assert submit_env(env) == {**USER, **MPI_USER}
    assert enclosing_job_variables(env) == sorted({**ALLOCATION, **LAUNCH})
    under_mpirun = {**USER, **MPI_USER, **LAUNCH}  # no Slurm job: mpirun on its own hosts
    assert submit_env(under_mpirun) == {**USER, **MPI_USER}
    ex = SlurmExecutor(SlurmSpec(), env=under_mpirun)
    assert ex.commands.env == {**USER, **MPI_USER}


def test_outside_a_launch_the_mpi_settings_are_the_users() -> None:
    env = {**USER, **MPI_USER, "PMIX_SERVER_TMPDIR": "/x", "OMPI_MCA_pmix": "^s1"}
    assert submit_env(env) == env and enclosing_job_variables(env) == []


def test_submit_mode_under_an_mpi_launch_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning named the Slurm job only: under mpirun alone it raised StopIteration."""
    for k in [k for k in os.environ if k.startswith(("SLURM", "PMI", "OMPI_"))]:
        monkeypatch.delenv(k)
    said = _submit_warnings(monkeypatch, caplog, LAUNCH)
    assert len(said) == 1 and "inside an MPI launch (rank 0)" in said[0], said


SRUN_FATAL = (
    "srun: fatal: SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and SLURM_MEM_PER_NODE are mutually "
    "exclusive."
)


def test_the_failure_line_of_a_jobs_output() -> None:
    own = "tuner: job 12 on n[1-2], master 10.0.0.1\n"
    assert output_failure(own + SRUN_FATAL + "\n") == SRUN_FATAL
    pyxis = ("pyxis: importing docker image: nvcr.io#nvidia/pytorch:24.05-py3\n"
             "slurmstepd: error: pyxis: child 7 failed with error code: 1\n"
             "srun: error: n1: task 0: Exited with exit code 1\n")  # fmt: skip
    pyxis_error = "slurmstepd: error: pyxis: child 7 failed with error code: 1"
    assert output_failure(own + pyxis) == pyxis_error
    assert output_failure("/x/slurm-job.sh: line 7: module: command not found\n") == (
        "/x/slurm-job.sh: line 7: module: command not found"
    )
    assert output_failure(own) is None and output_failure("") is None
    assert len(output_failure("error " + "x" * 1000) or "") == 300


class _FailedBeforeNodes:
    """Slurm's answers for job 7, which ended FAILED (exit 1) before any wrapper ran."""

    def __call__(self, argv: Sequence[str], *, timeout: float = 60) -> tuple[int, str, str]:
        if list(argv[:3]) == ["scontrol", "show", "job"]:
            return 0, "JobId=7 JobName=tuner-t0-tok JobState=FAILED ExitCode=1:0 NodeList=n1\n", ""
        if list(argv[:3]) == ["scontrol", "show", "hostnames"]:
            return 0, "n1\n", ""
        if argv[0] == "sacct":
            return 1, "", "sacct: error: Slurm accounting storage is disabled\n"
        return 0, "", ""  # the token reaper here: nothing left


def _failed_job(tmp_path: Path, output: str | None) -> SlurmJob:
    ex = SlurmExecutor(SlurmSpec(poll_interval_s=0.01), env={"PATH": "/usr/bin"})
    ex.commands.run = _FailedBeforeNodes()  # type: ignore[method-assign]
    ex.accounting = Accounting(ex.commands.run)
    request = LaunchRequest(trial=0, hosts=("slurm-0",), scripts=("true",),
                            paths=ResultsLayout(tmp_path, "s").trial(0))  # fmt: skip
    request.paths.dir.mkdir(parents=True)
    if output is not None:
        (request.paths.dir / "slurm-7.out").write_text(output)
    job = SlurmJob(ex, request, token="tok")
    job.job_id, job.state = "7", "RUNNING"
    return job


def test_a_job_failing_before_its_nodes_gives_srun_s_words_as_the_reason(tmp_path: Path) -> None:
    result = _failed_job(tmp_path, f"tuner: job 7 on n1, master n1\n{SRUN_FATAL}\n").poll()
    assert result is not None and result.exit_codes == (1,)
    assert result.scheduler_verdict == (
        "launch_error",
        f"Slurm job 7 failed before the trial started: {SRUN_FATAL} (slurm-7.out)",
    )


def test_without_words_in_the_output_the_exit_code_decides(tmp_path: Path) -> None:
    for output in (None, ""):  # a setup line that exited quietly
        result = _failed_job(tmp_path / str(output), output).poll()
        assert result is not None and result.exit_codes == (1,)
        assert result.scheduler_verdict is None


def test_allocation_steps_get_the_job_s_variables_but_not_an_mpi_launch_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``tune run`` as rank 0 of ``srun --mpi=pmix`` inside an allocation (allocation mode):
    every trial step's srun passed the caller's PMIx, PMI and Open MPI variables to its tasks
    (srun's default ``--export=ALL``; under ``--mpi=none`` srun sets none of its own over
    them), so each rank of the trial carried rank 0 of the enclosing step and its PMIx server's
    address. The steps are the allocation's own: its ``SLURM_*`` stay, and so do the user's
    MPI settings."""
    from tuner.launch.slurm import SlurmCommands
    from tuner.launch.slurm_alloc import SlurmAllocationExecutor

    monkeypatch.setattr(SlurmCommands, "show_job", lambda _self, _id: {"NodeList": "n[1-2]"})
    monkeypatch.setattr(SlurmCommands, "hostnames", lambda _self, _list: ("n1", "n2"))
    env = {**USER, **MPI_USER, **ALLOCATION, **LAUNCH}
    ex = SlurmAllocationExecutor(SlurmSpec(), job_id="4242", env=env)
    assert ex.commands.env == {**USER, **MPI_USER, **ALLOCATION}
    outside = {**USER, **MPI_USER, **ALLOCATION, "PMIX_SERVER_TMPDIR": "/x"}  # no launch rank
    assert SlurmAllocationExecutor(SlurmSpec(), job_id="4242", env=outside).commands.env == outside
