"""The environment the Slurm commands run with: none of an enclosing job's or MPI launch's own.

``tune run`` started inside an allocation (``salloc``, ``srun --pty bash``, a batch script) has
that job's variables in its environment: Slurm sets them there for the ``srun`` calls of *that*
job to read back (sbatch(1), salloc(1), srun(1), "OUTPUT ENVIRONMENT VARIABLES": e.g.
``SLURM_MEM_PER_CPU`` "is used by subsequent srun calls within the job allocation"). ``sbatch``
exports the submitting environment into the new job (``--export=ALL``, its default), where the
trial's own ``srun`` reads them as its options, options of a job that is not this one: with
``SLURM_MEM_PER_CPU`` from the allocation and ``SLURM_MEM_PER_NODE`` from the trial's job, srun
stops with "SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and SLURM_MEM_PER_NODE are mutually exclusive"
before any rank starts. Submit mode therefore runs every Slurm command without them.

The same holds for the variables an MPI launch gives each process it starts (``srun
--mpi=pmix``/``pmi2`` inside the allocation, ``mpirun``): the launch's PMIx server address, the
process's rank and size. Exported into a trial's job, a process there that initialises MPI or
PMIx takes itself for that rank of the enclosing launch and reaches for its server (the
trial's srun sets its own plugin's variables for each task, none under ``--mpi=none``). mpirun
clears its own for what it starts (Open MPI ``orted_submit.c``: ``OMPI_MCA_ess``,
``OMPI_MCA_pmix``; PRRTE launches without ``PMIX_*``); submit mode runs without any of them.

Allocation mode keeps the job's ``SLURM_*`` (its steps are steps of that job, and srun reads
them as such) but drops the launch's variables too: a step's tasks get the caller's whole
environment (srun(1) ``--export``: ALL is the default) and, under ``--mpi=none`` (the default:
"No special MPI processing"), srun sets no PMI or PMIx variable of its own over them, so every
rank of a trial's step would carry the enclosing launch's rank, size and server address.
"""

from __future__ import annotations

from collections.abc import Mapping

ALLOCATION_MARKERS = ("SLURM_JOB_ID", "SLURM_JOBID")
"""Set in every job's environment (sbatch(1), salloc(1), srun(1) outputs): this process runs
inside a Slurm job."""

CLIENT_INPUTS = frozenset({"SLURM_CONF", "SLURM_CLUSTERS", "SLURM_DEBUG_FLAGS",
                           "SLURM_EXIT_ERROR", "SLURM_TIME_FORMAT"})  # fmt: skip
"""The ``SLURM_*`` variables kept inside an allocation: inputs a user sets on purpose (sbatch(1),
squeue(1) "INPUT ENVIRONMENT VARIABLES": which configuration and cluster the commands talk to,
their debug flags, exit code and time format) that no Slurm command sets in a job's environment.
Every other ``SLURM_*`` is the enclosing job's (its size, memory, tasks, CPUs, GPUs, binding,
steps: the output lists of sbatch, salloc and srun, which grow with each Slurm release), or an
srun option (``SLURM_ACCOUNT``, ``SLURM_HINT``) that the trial's job, which has its own
``#SBATCH`` options, must not take from a shell that happened to be inside a job. ``SBATCH_*``,
``SALLOC_*`` and ``SRUN_*`` are inputs the user sets, kept except the few Slurm sets below."""

JOB_OUTPUTS = frozenset({"SLURMD_NODENAME", "SRUN_DEBUG", "SBATCH_MEM_BIND",
                         "SBATCH_MEM_BIND_LIST", "SBATCH_MEM_BIND_PREFER",
                         "SBATCH_MEM_BIND_TYPE", "SBATCH_MEM_BIND_VERBOSE"})  # fmt: skip
"""Outside the ``SLURM_`` prefix, the variables sbatch(1) and srun(1) list as set in a job's
environment (an enclosing job's ``--mem-bind`` would otherwise bind the trial's)."""


LAUNCH_MARKERS = ("PMIX_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
"""Set for every process a PMIx, PMI or Open MPI launch started: this process is one."""

LAUNCH_INPUTS = ("PMIX_MCA_", "OMPI_MCA_", "PMI_FANOUT", "PMI_TIME")
"""Prefixes of the ``PMIX_*``, ``OMPI_*`` and ``PMI_*`` variables a user sets on purpose: PMIx's
and Open MPI's parameters (``PMIX_MCA_gds``, ``OMPI_MCA_btl_tcp_if_include``) and the settings of
Slurm's PMI library (srun(1): ``PMI_FANOUT``, ``PMI_FANOUT_OFF_HOST``, ``PMI_TIME``)."""

LAUNCH_PARAMETERS = ("OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_orte_")
"""The Open MPI parameters mpirun sets for what it starts, not the user: how a process finds its
launcher (``orte_hnp_uri``, ``orte_ess_num_procs``, the ``ess`` and ``pmix`` components)."""


def inside_allocation(env: Mapping[str, str]) -> bool:
    """True when ``env`` is the environment of a process inside a Slurm job."""
    return any(env.get(name) for name in ALLOCATION_MARKERS)


def launch_rank(env: Mapping[str, str]) -> str | None:
    """This process's rank in the MPI launch that started it, None outside one."""
    return next((env[name] for name in LAUNCH_MARKERS if env.get(name)), None)


def enclosed(env: Mapping[str, str]) -> bool:
    """True when ``env`` is that of a process inside a Slurm job or an MPI launch."""
    return inside_allocation(env) or launch_rank(env) is not None


def _launch_variable(name: str) -> bool:
    if name.startswith(LAUNCH_PARAMETERS):
        return True
    return name.startswith(("PMIX_", "PMI_", "OMPI_")) and not name.startswith(LAUNCH_INPUTS)


def enclosing_job_variables(env: Mapping[str, str]) -> list[str]:
    """The names of ``env`` that are the enclosing job's or launch's (none outside one)."""
    job, launch = inside_allocation(env), enclosed(env)
    return sorted(
        name for name in env
        if (job and (name in JOB_OUTPUTS or (name.startswith("SLURM_")
                                              and name not in CLIENT_INPUTS)))
        or (launch and _launch_variable(name))
    )  # fmt: skip


def launch_variables(env: Mapping[str, str]) -> list[str]:
    """The names of ``env`` that are the enclosing MPI launch's (none outside one)."""
    if launch_rank(env) is None:
        return []
    return sorted(name for name in env if _launch_variable(name))


def step_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the enclosing MPI launch's variables, its ``SLURM_*`` kept: what the
    job steps of allocation mode run with (``env`` itself outside a launch)."""
    drop = set(launch_variables(env))
    return {k: v for k, v in env.items() if k not in drop}


def submit_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the enclosing job's and launch's variables: what ``sbatch`` and the other
    Slurm commands of submit mode run with (``env`` itself outside both)."""
    drop = set(enclosing_job_variables(env))
    return {k: v for k, v in env.items() if k not in drop}
