"""Submit mode started inside an allocation, without Slurm: the environment the trials' jobs get
and the warning."""

from __future__ import annotations

import logging
import os

import pytest

from tuner.launch.slurm import SlurmExecutor
from tuner.launch.slurm_alloc import make_slurm_executor
from tuner.launch.slurm_env import enclosing_job_variables, submit_env
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


def test_submit_mode_inside_an_allocation_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for k, v in ALLOCATION.items():
        monkeypatch.setenv(k, v)
    with caplog.at_level(logging.WARNING, logger="tuner.launch.slurm_alloc"):
        ex = make_slurm_executor(SlurmSpec(mode="submit"), ("slurm-0",))
    assert isinstance(ex, SlurmExecutor)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "inside Slurm job 4242" in said[0], said
    assert "every trial is its own job" in said[0] and "SLURM_CPUS_PER_TASK" in said[0]
    for k in ALLOCATION:
        monkeypatch.delenv(k)
    caplog.clear()
    make_slurm_executor(SlurmSpec(mode="submit"), ("slurm-0",))
    assert caplog.records == []
