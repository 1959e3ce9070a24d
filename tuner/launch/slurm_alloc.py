"""Run trials as job steps inside one Slurm allocation (``salloc`` / ``sbatch``; allocation mode).

``tune run`` runs inside the allocation (or is given its job id). The node pool's slots map onto
the allocation's nodes in Slurm's order: ``slurm-<i>`` is the i-th host of the job's NodeList, so
disjoint slots are disjoint nodes and a quarantined slot is a quarantined node. Each node of a
trial is one step, ``srun --jobid J --exact -N1 -n1 -w HOST`` running the node's script in its
own session with the trial token; its output streams into ``node-<k>.log``. Cleaning up is the
same token reaper as the SSH executor, run on the node as an ``--overlap`` step; preflight checks
run the same way. The master address is the ``NodeAddr`` of the trial's first node.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO, Any

from tuner.errors import LaunchError, NodeError, StudyError
from tuner.launch.base import PROCESS_SCRIPT, Executor, LaunchRequest, NodeProcess
from tuner.launch.slurm import SlurmExecutor
from tuner.launch.slurm_commands import SlurmCommands
from tuner.launch.slurm_env import (
    ALLOCATION_MARKERS,
    enclosing_job_variables,
    launch_rank,
    launch_variables,
    step_env,
)
from tuner.spec.study import SlurmSpec

logger = logging.getLogger(__name__)

_SLOT = re.compile(r"slurm-(\d+)")


def make_slurm_executor(spec: SlurmSpec, slots: Sequence[str]) -> Executor:
    """The executor for ``cluster.slurm``: submit mode, or job steps of the allocation this
    process runs in (``mode: auto`` picks allocation when ``SLURM_JOB_ID`` is set)."""
    mode = spec.mode
    if mode == "auto":
        mode = "allocation" if os.environ.get("SLURM_JOB_ID") else "submit"
    if mode == "submit":
        dropped = enclosing_job_variables(os.environ)
        if dropped:
            job = next((os.environ[v] for v in ALLOCATION_MARKERS if os.environ.get(v)), None)
            rank = (launch_rank(os.environ) or "")[:40]
            where = f"Slurm job {job[:40]}" if job is not None else f"an MPI launch (rank {rank})"
            logger.warning(
                "tune runs inside %s, but cluster.slurm.mode is submit: every trial is its own "
                "job, submitted without this job's %d variables (%s)",
                where, len(dropped), ", ".join(dropped[:3]) + (", ..." if dropped[3:] else ""),
            )  # fmt: skip
        return SlurmExecutor(spec, poll_interval_s=min(1.0, spec.poll_interval_s))
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise StudyError(
            "cluster.slurm.mode: allocation runs trials inside a Slurm allocation, but "
            "SLURM_JOB_ID is not set: run tune inside salloc or sbatch, or use mode: submit"
        )
    if not job_id.isascii() or not job_id.isdigit():
        # asked of Slurm, "abc" was "Slurm job abc does not exist", naming no variable, and
        # "--help" scontrol's help read as a job with "no nodes yet (is it still pending?)"
        raise StudyError(
            f"SLURM_JOB_ID is {job_id[:40]!r}, no Slurm job id (a number): cluster.slurm.mode "
            f"{spec.mode} runs trials inside that allocation; run tune inside salloc or sbatch, "
            "or unset it and use mode: submit"
        )
    executor = SlurmAllocationExecutor(spec, job_id=job_id)
    try:
        executor.check_slots(slots)
    except StudyError:
        executor.close()
        raise
    return executor


class _StepProcess(NodeProcess):
    def __init__(self, host: str, popen: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        self._host, self._popen, self._log = host, popen, log

    def poll(self) -> int | None:
        return self._popen.poll()

    def close(self) -> None:
        self._log.close()


class SlurmAllocationExecutor(Executor):
    """Trials as job steps on disjoint nodes of the allocation ``job_id`` (module docstring)."""

    def __init__(
        self, spec: SlurmSpec | None = None, *, job_id: str,
        env: Mapping[str, str] | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.spec = spec or SlurmSpec()
        self.job_id = job_id
        base = os.environ if env is None else env
        if launch_variables(base):  # the steps' tasks take none of an enclosing MPI launch's
            env = step_env(base)
        self.commands = SlurmCommands(env)
        fields = self.commands.show_job(job_id)
        if fields is None:
            raise StudyError(f"Slurm job {job_id} (the allocation) does not exist")
        self.nodes = self.commands.hostnames(fields.get("NodeList", ""))
        if not self.nodes:
            raise StudyError(f"Slurm job {job_id} has no nodes yet (is it still pending?)")
        self._addrs: dict[str, str] = {}
        logger.info("allocation %s: nodes %s", job_id, ",".join(self.nodes))

    def host(self, name: str) -> str:
        """The allocation's node behind a pool slot (``slurm-<i>``); a real name is itself."""
        m = _SLOT.fullmatch(name)
        if m is None:
            return name
        i = int(m.group(1))
        if i >= len(self.nodes):
            raise NodeError(name, f"the allocation has only {len(self.nodes)} nodes")
        return self.nodes[i]

    def check_slots(self, slots: Sequence[str]) -> None:
        """Refuse a pool larger than the allocation (a study error, before any trial)."""
        missing = [
            s for s in slots if _SLOT.fullmatch(s) and int(s.split("-")[1]) >= len(self.nodes)
        ]
        if missing:
            raise StudyError(
                f"the study needs {len(slots)} nodes (num_nodes x max_jobs) but allocation "
                f"{self.job_id} has {len(self.nodes)}"
            )

    def master_addr(self, hosts: Sequence[str]) -> str:
        """The ``NodeAddr`` of the first node (the node name when Slurm gives none)."""
        host = self.host(hosts[0])
        if host not in self._addrs:
            code, out, _err = self.commands.run(["scontrol", "show", "node", "-o", host])
            m = re.search(r"(?:^| )NodeAddr=(\S+)", out) if code == 0 else None
            self._addrs[host] = m.group(1) if m else host
        return self._addrs[host]

    def _step(self, host: str, *, overlap: bool, name: str) -> list[str]:
        argv = ["srun", f"--jobid={self.job_id}", "--quiet", "-N1", "-n1", f"--nodelist={host}",
                f"--job-name={name}", "--overlap" if overlap else "--exact"]  # fmt: skip
        if self.spec.container_image and not overlap:
            argv.append(f"--container-image={self.spec.container_image}")
        if self.spec.container_mounts and not overlap:
            argv.append(f"--container-mounts={','.join(self.spec.container_mounts)}")
        return argv

    # ----- hooks --------------------------------------------------------------------------------

    def _prepare_node(self, request: LaunchRequest, node_rank: int) -> None:
        """The trial directory is shared with the nodes: :meth:`submit` wrote everything."""

    def _start_node(self, request: LaunchRequest, node_rank: int, token: str) -> NodeProcess:
        host = self.host(request.hosts[node_rank])
        command = request.shell_command(node_rank, token, exec_=True)
        argv = self._step(host, overlap=False, name=f"tuner-t{request.trial}-{token}")
        log = request.paths.node_log(node_rank).open("ab", buffering=0)
        try:
            popen = subprocess.Popen(
                [*argv, "bash", "-c", command], env=self.commands.env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            log.close()
            raise LaunchError(f"srun: {exc}") from None
        return _StepProcess(host, popen, log)

    def _reap_node(
        self, request: LaunchRequest, node_rank: int, token: str, grace_s: float
    ) -> list[str]:
        host = self.host(request.hosts[node_rank])
        pid_file = str(request.remote_pid_file(node_rank))
        argv = [*self._step(host, overlap=True, name="tuner-reap"), "sh", "-c", PROCESS_SCRIPT,
                "tuner-reap", token, pid_file, str(grace_s)]  # fmt: skip
        code, out, err = self.commands.run(argv, timeout=grace_s + 60)
        if code != 0:
            raise NodeError(host, f"the process reaper could not run: {err.strip()[-300:]}")
        return [line.strip() for line in out.splitlines() if line.strip()]

    def _run_check(self, host: str, argv: Sequence[str]) -> tuple[int, str, str]:
        node = self.host(host)
        step = self._step(node, overlap=True, name="tuner-preflight")
        code, out, err = self.commands.run([*step, *argv], timeout=600)
        if code != 0 and "srun: error:" in err and "Unable to" in err:
            raise NodeError(host, f"srun could not start the check: {err.strip()[-300:]}")
        return code, out, err
