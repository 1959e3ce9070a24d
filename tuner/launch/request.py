"""What an executor is given and what it gives back: plain values, no processes.

A :class:`LaunchRequest` is one trial to run (a shell script per node, extra files, a time
limit); a :class:`JobResult` is how its processes ended, node by node. Every process of a trial
carries :data:`TOKEN_ENV` in its environment, which is how :mod:`tuner.launch.base` finds and
ends them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from tuner.errors import LaunchError
from tuner.layout import TrialPaths
from tuner.outcome import Outcome

TOKEN_ENV = "TUNER_TRIAL_TOKEN"
"""The environment variable that marks every process of a trial."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchRequest:
    """Everything an executor needs to run one trial."""

    trial: int
    """The trial number (names the directory and appears in messages)."""
    hosts: tuple[str, ...]
    """The nodes, in node-rank order."""
    scripts: tuple[str, ...]
    """The text of the bash script node ``k`` runs (one per host)."""
    paths: TrialPaths
    """The trial's files on this machine: logs are streamed here, scripts and files copied here."""
    files: Mapping[str, str] = field(default_factory=dict)
    """Extra files (name -> content) placed in the trial directory on every node."""
    node_dir: str | None = None
    """The trial directory on the nodes; None means the same path as ``paths.dir``."""
    timeout_s: float | None = None
    """Wall-clock limit of the trial; past it the job is killed and reported ``timed_out``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables set for the node scripts (on top of the node's own)."""
    label: str | None = None
    """What messages call the job (``tune profile``'s jobs are no trial); None: ``trial N``."""

    def __post_init__(self) -> None:
        if not self.hosts:
            raise LaunchError(f"{self.what}: no nodes to run on")
        if len(self.scripts) != len(self.hosts):
            raise LaunchError(
                f"{self.what}: {len(self.scripts)} scripts for {len(self.hosts)} nodes"
            )
        for name in self.files:
            self.paths.file(name)  # raises on a name that is a path

    @property
    def what(self) -> str:
        """The job as messages and logs name it: its label, or ``trial N``."""
        return self.label if self.label is not None else f"trial {self.trial}"

    @property
    def remote_dir(self) -> PurePosixPath:
        """The trial directory on the nodes."""
        return PurePosixPath(self.node_dir if self.node_dir is not None else str(self.paths.dir))

    def remote_script(self, node_rank: int) -> PurePosixPath:
        """Where node ``node_rank``'s script lives on that node."""
        return self.remote_dir / self.paths.launch_script(node_rank).name

    def remote_pid_file(self, node_rank: int) -> PurePosixPath:
        """Where node ``node_rank`` records its script's process group."""
        return self.remote_dir / self.paths.pid_file(node_rank).name

    def shell_command(self, node_rank: int, token: str, *, exec_: bool = False) -> str:
        """The shell line that starts node ``node_rank``'s script on a node: in the trial
        directory, as the leader of its own process group (recorded in the pid file), with the
        token and the request's environment. The token goes inside ``setsid``, so setsid itself
        is never signalled and reports the script's exit status. ``exec_``: setsid replaces the
        calling shell (a job step whose own exit status is the script's)."""
        env = " ".join(shlex.quote(f"{k}={v}") for k, v in {**self.env, TOKEN_ENV: token}.items())
        return (
            f"cd {shlex.quote(str(self.remote_dir))} && {'exec ' if exec_ else ''}setsid -w "
            f"env {env} bash -c "
            + shlex.quote('echo $$ >"$0" && exec bash "$1"')
            + f" {shlex.quote(str(self.remote_pid_file(node_rank)))}"
            + f" {shlex.quote(str(self.remote_script(node_rank)))}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    """How a trial's processes ended, node by node."""

    trial: int
    hosts: tuple[str, ...]
    exit_codes: tuple[int | None, ...]
    """Exit code of each node's script; None when it never started or its node was lost."""
    timed_out: bool
    """Killed because it ran past ``LaunchRequest.timeout_s``."""
    cancelled: bool
    """Killed by :meth:`Job.cancel` (also set when the job was killed for a time out)."""
    node_errors: tuple[tuple[str, str], ...]
    """``(host, reason)`` for every node that could not be reached or was lost."""
    duration_s: float
    """From submission to the end of the last process, by the executor's clock."""
    logs: tuple[Path, ...]
    """The ``node-<k>.log`` files, in node-rank order."""
    survivors: tuple[str, ...] = ()
    """``"host: pid stat args"`` of processes still alive after killing; empty when clean."""
    job_id: str | None = None
    """The batch scheduler's id of the job (Slurm), so it can be found again; else None."""
    scheduler_verdict: tuple[str, str] | None = None
    """``(outcome, reason)`` the batch scheduler decided (host memory limit, preemption, a job
    that can never start); None when the exit codes and logs decide."""
    accounting: Mapping[str, str] = field(default_factory=dict)
    """The batch scheduler's final record (Slurm: State, ExitCode, Elapsed, MaxRSS, source)."""
    stopped: str | None = None
    """Why the tuner ended the trial early because its measurement was complete (``precise``,
    ``raced``: :meth:`Job.stop`); None otherwise. Such a job is also ``cancelled``."""

    @property
    def ok(self) -> bool:
        """Every node's script exited 0, nothing was killed and no node was lost."""
        return (
            not self.timed_out
            and not self.cancelled
            and not self.node_errors
            and all(code == 0 for code in self.exit_codes)
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``result.json`` in the trial directory)."""
        return {
            "trial": self.trial,
            "hosts": list(self.hosts),
            "exit_codes": list(self.exit_codes),
            "timed_out": self.timed_out,
            "cancelled": self.cancelled,
            "node_errors": [list(e) for e in self.node_errors],
            "duration_s": self.duration_s,
            "logs": [str(p) for p in self.logs],
            "survivors": list(self.survivors),
            "job_id": self.job_id,
            "scheduler_verdict": None
            if self.scheduler_verdict is None
            else list(self.scheduler_verdict),
            "accounting": dict(self.accounting),
            "stopped": self.stopped,
        }


ENDED_MARK = "[tune] the tuner ended this trial: "
"""How the line the executor appends to every node log of a trial it ended begins, followed by
:func:`ended_how`'s word: torchrun's traceback of the SIGTERM that follows reads as a crash, and
a log copied out without its ``result.json`` said so in ``tune parse-log``."""


def ended_how(*, timed_out: bool, cancelled: bool, stopped: str | None) -> str | None:
    """How the tuner ended a trial: ``stopped``'s word (``precise``, ``raced``: its measurement
    was complete), ``limit`` (its time limit), ``cancelled`` (the study was stopped); None when
    its processes ended by themselves (or the tuner ended a node's peers after it failed)."""
    if stopped:
        return stopped
    if timed_out:
        return "limit"
    return "cancelled" if cancelled else None


def ended_verdict(*, node_errors: Sequence[Sequence[str]], scheduler_verdict: Sequence[str] | None,
                  how: str | None) -> tuple[Outcome, str] | None:  # fmt: skip
    """The outcome the executor's account decides before any log is read (None: the logs
    decide): a lost or unreachable node, the batch scheduler's verdict, a trial cancelled
    because the study stopped (``how``: :func:`ended_how`). The study's judgement of a finished
    job and ``tune parse-log`` of a trial's log both read it."""
    if node_errors:
        return Outcome.NODE_ERROR, "; ".join(f"{e[0]}: {e[1]}" for e in node_errors)
    if scheduler_verdict is not None:  # Slurm killed it for host memory, preempted it...
        return Outcome(scheduler_verdict[0]), scheduler_verdict[1]
    if how == "cancelled":
        return Outcome.INTERRUPTED, "the study was stopped"
    return None
