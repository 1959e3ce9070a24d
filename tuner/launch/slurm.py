"""Run trials through Slurm: one ``sbatch`` job per trial (submit mode, from a login node).

A trial is one batch job (:mod:`tuner.launch.slurm_script`): ``srun --ntasks-per-node=1`` runs
a wrapper on every node, which picks its node script by ``SLURM_NODEID`` and streams its output
into ``node-<k>.log`` in the trial directory (a filesystem the login node and the compute nodes
share). The job is found again by its name, ``tuner-t<trial>-<token>``, so a tuner that lost the
:class:`~tuner.launch.Job` (a dead worker) still cancels it (:meth:`SlurmExecutor.reap_lost`).

Time in the queue is not trial time: the trial's limit counts from the moment Slurm reports the
job RUNNING. Slurm's own ``--time`` is the limit plus a margin, a backstop for a dead tuner.
Node failure and preemption are node errors (the trial runs again); everything else is judged
from the nodes' exit codes and logs. Cancelling is ``scancel``, then waiting until Slurm has
ended the job, then the token reaper on this machine for anything that escaped Slurm's process
tracking (on a cluster, Slurm's ``proctrack/cgroup`` does that on the compute nodes).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, NoReturn

from tuner.errors import LaunchError, NodeError
from tuner.launch.base import (
    PROCESS_SCRIPT,
    Executor,
    Job,
    JobResult,
    LaunchRequest,
    NodeProcess,
    new_token,
)
from tuner.launch.slurm_commands import COMMAND_TIMEOUT_S, SlurmCommands, error_line
from tuner.launch.slurm_env import enclosed, submit_env
from tuner.launch.slurm_script import (
    BATCH_SCRIPT,
    MASTER_PLACEHOLDER,
    NODE_WRAPPER,
    NODE_WRAPPER_TEXT,
    batch_script,
    job_name,
    job_output,
    sbatch_argv,
)
from tuner.launch.slurm_states import (
    ACTIVE,
    ENDED,
    NO_CONFIG,
    NODE_LOST,
    QUEUED,
    Accounting,
    failed_before_nodes,
    job_state,
    never_starts,
    pending_reason,
    run_seconds,
    scheduler_verdict,
    submitted_job_id,
)
from tuner.layout import write_atomic
from tuner.outcome import Outcome
from tuner.spec.study import SlurmSpec

logger = logging.getLogger(__name__)

QUERY_FAILURES = 30
"""Consecutive failed state queries after which a job is given up as a node error."""


_JOB_NAME = re.compile(r"tuner-t(\d+)-([0-9a-f]+)")
"""A trial's job name (:func:`~tuner.launch.slurm_script.job_name`)."""


class SlurmExecutor(Executor):
    """Submits each trial as one Slurm batch job (see the module docstring).

    ``hosts`` of a :class:`LaunchRequest` are abstract slots (``slurm-0``, ...) handed out by the
    node pool; the hosts Slurm picked are in the :class:`JobResult`.
    """

    def __init__(
        self, spec: SlurmSpec | None = None, *, env: Mapping[str, str] | None = None,
        cancel_timeout_s: float = 120.0, submit_timeout_s: float = COMMAND_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.spec = spec or SlurmSpec()
        base = os.environ if env is None else env
        if enclosed(
            base
        ):  # the trials' jobs get none of the enclosing job's or launch's variables
            env = submit_env(base)
        self.commands = SlurmCommands(env)
        self.accounting = Accounting(self.commands.run)
        self.cancel_timeout_s = cancel_timeout_s
        self.submit_timeout_s = submit_timeout_s
        """How long ``sbatch`` may take before it is killed (its job then looked for)."""

    def submit(self, request: LaunchRequest, token: str | None = None) -> Job:
        """Write the scripts, ``sbatch`` the job and return it (queued or running), named with
        ``token`` (a fresh one when None; see :meth:`Executor.submit`).

        Raises :class:`LaunchError` when Slurm refuses the job (bad partition, account, ...).
        """
        self._write_local_copies(request)
        job = SlurmJob(self, request, token=token or new_token())
        job._start()
        return job

    def master_addr(self, hosts: Sequence[str]) -> str:
        """Unknown until Slurm picks the nodes: the wrapper fills it in on the nodes."""
        return MASTER_PLACEHOLDER

    def reap_lost(self, request: LaunchRequest, token: str) -> list[str]:
        """Cancel the job of a trial known only by its token, wait until it is gone, then the
        token reaper here; returns the survivors (see :meth:`Executor.reap_lost`)."""
        try:
            self._cancel_named(job_name(request, token))
        except LaunchError as exc:
            raise LaunchError(f"{request.what}: {exc}") from None
        return [f"localhost: {line}" for line in self._reap_here(request, token, self.grace_s)]

    def _cancel_named(self, name: str) -> None:
        """Cancel every live job called ``name`` and wait until Slurm has ended each."""
        for job_id in self.commands.find_jobs(name):
            self.commands.cancel(job_id)
            if not self.commands.wait_gone(job_id, self.cancel_timeout_s):
                raise LaunchError(f"Slurm job {job_id} did not end")

    def attach(
        self, request: LaunchRequest, token: str, job_id: str | None = None
    ) -> SlurmJob | None:
        """The job of a trial whose tuner died, to watch on: found by its name while queued or
        running, else by its recorded ``job_id`` while Slurm still knows it (ended: its result
        is read from the nodes' files); None when Slurm has no such job. Its time limit
        counts from when Slurm started it (``RunTime``)."""
        ids = self.commands.find_jobs(job_name(request, token)) or ([job_id] if job_id else [])
        fields = self.commands.show_job(ids[0]) if ids else None
        if fields is None or fields.get("JobName") != job_name(request, token):
            return None
        job = SlurmJob(self, request, token=token)
        job.job_id, job.state, job._fields = ids[0], job_state(fields), fields
        if job.state not in QUEUED:
            job._running_since = self.clock() - run_seconds(fields.get("RunTime", ""))
            job._started_at = job._running_since  # its duration: Slurm's run time so far
            job.slurm_hosts = self.commands.hostnames(fields.get("NodeList", ""))
        logger.info("%s: re-attached to Slurm job %s (%s)", request.what, ids[0], job.state)
        return job

    def study_jobs(self, trial_dirs: Collection[str]) -> list[tuple[str, int, str]]:
        """``(job id, trial, token)`` of every live tuner job whose working directory is one
        of ``trial_dirs``' parents' children (the study's trial folders on the nodes)."""
        code, out, err = self.commands.run(["squeue", "-h", "-o", "%i|%j|%Z"])
        if code != 0:
            raise LaunchError(f"squeue: {error_line(err, code)}")
        roots = {str(PurePosixPath(d).parent) for d in trial_dirs}
        found = []
        for line in out.splitlines():
            job_id, _, rest = line.partition("|")
            name, _, workdir = rest.partition("|")
            m = _JOB_NAME.fullmatch(name)
            if m and str(PurePosixPath(workdir).parent) in roots:
                found.append((job_id, int(m.group(1)), m.group(2)))
        return found

    # ----- hooks --------------------------------------------------------------------------------

    def _prepare_node(self, request: LaunchRequest, node_rank: int) -> None:
        """The trial directory is shared with the nodes: :meth:`submit` wrote everything."""

    def _start_node(self, request: LaunchRequest, node_rank: int, token: str) -> NodeProcess:
        raise NotImplementedError("a Slurm trial starts as one job (SlurmJob._start)")

    def _reap_node(
        self, request: LaunchRequest, node_rank: int, token: str, grace_s: float
    ) -> list[str]:
        return self._reap_here(request, token, grace_s) if node_rank == 0 else []

    def _reap_here(self, request: LaunchRequest, token: str, grace_s: float) -> list[str]:
        pid_file = str(request.paths.pid_file(0))  # never written: the token alone decides
        code, out, err = self.commands.run(
            ["sh", "-c", PROCESS_SCRIPT, "tuner-reap", token, pid_file, str(grace_s)],
            timeout=grace_s + 60,
        )
        if code != 0:
            raise LaunchError(f"process reaper exited {code}: {err.strip()}")
        return [line.strip() for line in out.splitlines() if line.strip()]

    def _run_check(self, host: str, argv: Sequence[str]) -> tuple[int, str, str]:
        """One short ``srun`` on whatever node Slurm gives (the nodes are alike)."""
        s = self.spec
        opts = [f"--{o}={getattr(s, o)}" for o in ("partition", "account", "qos") if getattr(s, o)]
        if s.container_image:
            opts.append(f"--container-image={s.container_image}")
        if s.container_mounts:
            opts.append(f"--container-mounts={','.join(s.container_mounts)}")
        code, out, err = self.commands.run(
            ["srun", "--quiet", "-N1", "-n1", "--time=5", f"--job-name=tuner-preflight-{host}",
             *opts, *argv], timeout=600,
        )  # fmt: skip
        if code != 0 and err.lstrip().startswith("srun: error: Unable to"):
            raise NodeError(host, f"srun could not start the check: {error_line(err, code)}")
        return code, out, err


class SlurmJob(Job):
    """One trial as one Slurm batch job. ``job_id`` is Slurm's id once submitted."""

    _ex: SlurmExecutor

    def __init__(self, executor: SlurmExecutor, request: LaunchRequest, *, token: str) -> None:
        super().__init__(executor, request, token=token)
        self.job_id: str | None = None
        self.slurm_hosts: tuple[str, ...] = ()
        """The nodes Slurm picked (known once the job runs)."""
        self.state = "UNSUBMITTED"
        self._running_since: float | None = None
        self._last_query = float("-inf")
        self._cmd = executor.commands
        self._query_failures = 0
        self._verdict: tuple[str, str] | None = None
        self._fields: dict[str, str] | None = None
        """What ``scontrol show job`` said last."""
        self.pending_reason = ""
        self._accounting: dict[str, str] = {}

    def _start(self) -> None:
        req = self._req
        write_atomic(req.paths.file(BATCH_SCRIPT), batch_script(self._ex.spec, req, self.token))
        write_atomic(req.paths.file(NODE_WRAPPER), NODE_WRAPPER_TEXT, mode=0o755)
        try:
            code, out, err = self._cmd.run(sbatch_argv(req), timeout=self._ex.submit_timeout_s)
        except LaunchError as exc:  # a hung sbatch, killed: the controller may have the job
            self._failed_submit(str(exc))
        if code != 0:  # "Socket timed out on send/recv operation" may come after the queuing
            said = f"sbatch refused the job: {error_line(err, code)}"
            if NO_CONFIG in err:  # it found no controller: nothing can have been queued
                raise LaunchError(f"{req.what}: {said}")
            self._failed_submit(said)
        self.job_id = submitted_job_id(out)
        if self.job_id is None:  # watched as "" was another job; as text, none ("vanished")
            shown = out.strip().splitlines()[-1:] or ["nothing"]
            self._failed_submit(f"sbatch printed no job id: {shown[0][:200]!r}")
        self.state = "PENDING"
        logger.info("%s: Slurm job %s submitted", req.what, self.job_id)

    def _failed_submit(self, said: str) -> NoReturn:
        """sbatch failed, but Slurm may have queued the job before it did: cancel any job of
        the trial's name (never left to run unwatched while the trial runs again), then raise
        what sbatch said."""
        name = job_name(self._req, self.token)
        try:
            self._ex._cancel_named(name)
        except LaunchError as exc:
            raise LaunchError(
                f"{self._req.what}: {said}; a Slurm job named {name} may be left ({exc}): "
                f"see `squeue --name {name}`, cancel it with `scancel --name {name}`"
            ) from None
        raise LaunchError(f"{self._req.what}: {said}")

    def poll(self) -> JobResult | None:
        """The result once the job has ended (or was just killed for its limit), else None.

        PENDING is queue time; the trial's limit counts from the first RUNNING seen."""
        with self._lock:
            if self._result is not None:
                return self._result
            now = self._ex.clock()
            limit = self._req.timeout_s
            if self._over_limit(now, limit):
                logger.warning("%s ran past its limit of %.0f s", self._req.what, limit)
                self._kill_all(cancelled=True, timed_out=True)
                return self._result
            if time.monotonic() - self._last_query < self._ex.spec.poll_interval_s:
                return None
            self._last_query = time.monotonic()
            self._observe(now)
            return self._result

    def _over_limit(self, now: float, limit: float | None) -> bool:
        return (
            limit is not None
            and self._running_since is not None
            and now - self._running_since > limit
        )

    def _observe(self, now: float) -> None:
        assert self.job_id is not None
        try:
            fields = self._cmd.show_job(self.job_id)
        except LaunchError as exc:  # a busy controller: ask again, give up after a while
            self._query_failures += 1
            logger.warning("%s: %s", self._req.what, exc)
            if self._query_failures >= QUERY_FAILURES:
                self._errors[0] = f"cannot ask Slurm about job {self.job_id}: {exc}"
                self._kill_all(cancelled=False, timed_out=False)
            return
        self._query_failures = 0
        if fields is None:  # forgotten by Slurm (MinJobAge passed, controller restarted)
            record = self._accounting = self._ex.accounting.final(self.job_id, None)
            if "State" in record:
                self._end(record["State"].split()[0], record["State"], record)
            else:
                self._end_from_files(f"Slurm job {self.job_id} vanished")
            return
        self._fields = fields
        self.state = job_state(fields)
        if self.state not in QUEUED and not self.slurm_hosts:
            self.slurm_hosts = self._cmd.hostnames(fields.get("NodeList", ""))
        if self.state in ("RUNNING", "COMPLETING") and self._running_since is None:
            self._running_since = now
            logger.info("%s: job %s running on %s", self._req.what, self.job_id,
                        ",".join(self.slurm_hosts))  # fmt: skip
        if self.state == "PENDING" and self._running_since is None:
            self._check_pending(now, fields)
            return
        if self.state in ACTIVE:
            self._check_peers(now)
            return
        if self.state not in ENDED:  # held, or a state this tune does not know: no end
            self._verdict = (
                str(Outcome.INTERRUPTED),
                f"Slurm job {self.job_id} is "
                f"{fields.get('JobState', self.state)[:80]}, not an end state",
            )
            logger.warning("%s: %s; cancelling it", self._req.what, self._verdict[1])
            self._kill_all(cancelled=False, timed_out=False)
            return
        record = self._accounting = self._ex.accounting.final(self.job_id, fields)
        raw = record.get("State", fields.get("JobState", self.state))
        self._end(raw.split()[0], raw, {**fields, **record})

    def _check_pending(self, now: float, fields: Mapping[str, str]) -> None:
        """Cancel a job that can never start (a launch error) or that waited past the pending
        limit for a reason that may clear (interrupted: it runs again later)."""
        reason = pending_reason(fields)
        if reason != self.pending_reason:
            self.pending_reason = reason
            logger.info("%s: job %s pending (%s)", self._req.what, self.job_id, reason)
        limit_s = self._ex.spec.pending_limit_min * 60
        if never_starts(reason, self._cmd.run):
            self._verdict = (
                str(Outcome.LAUNCH_ERROR),
                f"Slurm job {self.job_id} can never start as submitted: pending for {reason}",
            )
        elif now - self._started_at > limit_s:
            self._verdict = (
                str(Outcome.INTERRUPTED),
                f"Slurm job {self.job_id} still pending ({reason}) after the pending limit "
                f"of {self._ex.spec.pending_limit_min:g} min (cluster.slurm.pending_limit_min)",
            )
        else:
            return
        logger.warning("%s: %s; cancelling it", self._req.what, self._verdict[1])
        self._kill_all(cancelled=False, timed_out=False)

    def _check_peers(self, now: float) -> None:
        codes = self._exit_files()
        if any(c not in (None, 0) for c in codes) and self._first_exit_at is None:
            self._first_exit_at = now
        if None in codes and self._peers_stuck(now):
            logger.warning("%s: a node failed; ending the others", self._req.what)
            self._kill_all(cancelled=False, timed_out=False)

    def _end(self, state: str, raw_state: str, fields: Mapping[str, str]) -> None:
        """The job ended without the tuner cancelling it: Slurm's final ``state``."""
        self.state = state
        self._verdict = scheduler_verdict(state, raw_state)
        codes = self._exit_files()
        if state in NODE_LOST:
            self._errors.update(
                {k: f"Slurm job {self.job_id} {state}" for k in range(len(self._req.hosts))}
            )
        elif state in ("FAILED", "OUT_OF_MEMORY") and all(c is None for c in codes):
            # The wrapper never ran (bad setup line, container image): Slurm's code for all.
            code = int(fields.get("ExitCode", "1:0").split(":")[0] or 1)
            codes = [code or 1] * len(codes)
            out = self._req.paths.dir / job_output(str(self.job_id))  # srun's own words
            self._verdict = self._verdict or failed_before_nodes(str(self.job_id), out)
        self._codes = {k: c for k, c in enumerate(codes) if c is not None}
        self._finish_slurm(timed_out=state in ("TIMEOUT", "DEADLINE"),
                           cancelled=state == "CANCELLED", survivors=None)  # fmt: skip

    def _end_from_files(self, why: str) -> None:
        codes = self._exit_files()
        if None in codes:
            self._errors.update({k: why for k, c in enumerate(codes) if c is None})
        self._codes = {k: c for k, c in enumerate(codes) if c is not None}
        self._finish_slurm(timed_out=False, cancelled=False, survivors=None)

    def _exit_files(self) -> list[int | None]:
        codes: list[int | None] = []
        for k in range(len(self._req.hosts)):
            path = self._req.paths.dir / f"node-{k}.exit"
            text = path.read_text().strip() if path.exists() else ""
            codes.append(int(text) if text.isdigit() else None)
        return codes

    def _kill_all(self, *, cancelled: bool, timed_out: bool) -> None:
        """``scancel``, wait until Slurm has ended the job, then the token reaper here."""
        if self.job_id is not None:
            try:
                self._cmd.cancel(self.job_id)
                if not self._cmd.wait_gone(self.job_id, self._ex.cancel_timeout_s):
                    logger.error("%s: Slurm job %s did not end", self._req.what,
                                 self.job_id)  # fmt: skip
            except LaunchError as exc:
                logger.error("%s: %s", self._req.what, exc)
        survivors = [f"localhost: {s}" for s in self._ex._reap_here(
            self._req, self.token, self._ex.grace_s)]  # fmt: skip
        codes = self._exit_files()
        self._codes = {k: c for k, c in enumerate(codes) if c is not None}
        self._finish_slurm(timed_out=timed_out, cancelled=cancelled, survivors=survivors)

    def _finish_slurm(
        self, *, timed_out: bool, cancelled: bool, survivors: list[str] | None
    ) -> None:
        if survivors is None:
            survivors = [f"localhost: {s}" for s in self._ex._reap_here(
                self._req, self.token, 1.0)]  # fmt: skip
        self._finish(timed_out=timed_out, cancelled=cancelled, survivors=survivors)
        assert self._result is not None
        # Report the hosts Slurm picked, not the pool's slots: a node error must never
        # quarantine a slot (Slurm itself stops scheduling onto a failed node).
        hosts = self.slurm_hosts or tuple(f"job-{self.job_id}" for _ in self._req.hosts)
        errors = tuple((hosts[k] if k < len(hosts) else hosts[0], r)
                       for k, r in sorted(self._errors.items()))  # fmt: skip
        accounting = self._accounting
        if not accounting and self.job_id is not None:
            accounting = self._ex.accounting.final(self.job_id, self._fields)
        self._result = dataclasses.replace(
            self._result, hosts=hosts, node_errors=errors, job_id=self.job_id,
            scheduler_verdict=self._verdict, accounting=accounting,
        )  # fmt: skip
        write_atomic(
            self._req.paths.result_json, json.dumps(self._result.to_json(), indent=2) + "\n"
        )
