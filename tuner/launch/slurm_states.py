"""What Slurm says about a trial's job, turned into facts the study can use (no job handling).

* **Pending reasons** (``squeue %r`` / ``scontrol``'s ``Reason=``): some can never clear while the
  job stays as submitted (more nodes than the partition has, an account that does not exist, a
  GRES limit of the association or QOS): :func:`never_starts` says so, and the job is cancelled
  at once instead of waiting for the trial's limit. Temporary reasons (Resources, Priority,
  Dependency, ...) wait up to ``cluster.slurm.pending_limit_min``. Reason names: Slurm's
  ``squeue(1)`` "JOB REASON CODES" and ``src/common/slurm_protocol_defs.c`` (job_reason_string).
* **Final records** from ``sacct`` (State, ExitCode, Elapsed, MaxRSS of the steps) where
  accounting storage exists; without it (no slurmdbd: ``sacct`` fails with "accounting storage
  is disabled") the fields ``scontrol show job`` still had are used, and the log says so once.
* **Outcomes** decided by Slurm itself (:func:`scheduler_verdict`): the host killed the job for
  memory, the job was preempted or cancelled by someone else. Everything else is judged from the
  nodes' exit codes and logs.
* **Failures before the nodes' logs**: a job whose ``srun`` stopped before the wrapper ran
  (conflicting options, a container that would not start, a failing setup line) left its words
  only in the job's own output file (``--output``): :func:`output_failure` picks them out.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tuner.outcome import Outcome

logger = logging.getLogger(__name__)

Run = Callable[[Sequence[str]], tuple[int, str, str]]
"""Runs one Slurm client command: argv -> (exit code, stdout, stderr)."""

QUEUED = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"})
ACTIVE = QUEUED | {"RUNNING", "COMPLETING", "STOPPED", "SIGNALING", "STAGE_OUT"}
NODE_LOST = frozenset({"NODE_FAIL", "BOOT_FAIL"})
"""Terminal states that are the cluster's fault, not the config's: retried as node errors
(PREEMPTED is ``interrupted``: the nodes are fine, someone else needed them)."""
ENDED = NODE_LOST | {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "DEADLINE",
                     "OUT_OF_MEMORY", "PREEMPTED"}  # fmt: skip
"""The states in which a job has ended (squeue(1), "JOB STATE CODES"). Any other that is not
:data:`ACTIVE` (``RESV_DEL_HOLD``, ``SPECIAL_EXIT``: held, and run unwatched once released;
``REQUEUE_FED``, ``REVOKED``; a state a later Slurm adds) is no end: the job is cancelled."""

NO_CONFIG = "Could not establish a configuration source"
"""The Slurm commands' words when this machine has no Slurm configuration (no ``slurm.conf``,
no ``SLURM_CONF``, no configless ``slurmd`` to ask): tune was started off the login nodes."""


def parse_job(text: str) -> dict[str, str]:
    """``scontrol show job -o ID`` output as key -> value (the first job only)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    fields: dict[str, str] = {}
    # Values may hold spaces (Command=, WorkDir=, StdOut= with a hostile path): a key starts
    # where " Key=" begins, keys are CamelCase words (some with ':' or '/').
    for m in re.finditer(r"(?:^| )([A-Z][A-Za-z:/_]*)=(.*?)(?= [A-Z][A-Za-z:/_]*=|$)", line):
        fields.setdefault(m.group(1), m.group(2))
    return fields


def job_state(fields: Mapping[str, str]) -> str:
    """The state word (``CANCELLED by 0`` -> ``CANCELLED``)."""
    return fields.get("JobState", "UNKNOWN").split()[0]


def run_seconds(text: str) -> float:
    """Slurm's ``[D-]HH:MM:SS`` (or ``MM:SS``) in seconds; 0 when unreadable."""
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or not (days or "0").isdigit():
        return 0.0
    total = 0
    for p in parts:
        total = total * 60 + int(p)
    return float(total + int(days or 0) * 86400)


def slurm_hint(line: str) -> str:
    """A Slurm command's error line, with what to do where its words alone do not say it."""
    if NO_CONFIG in line:
        return (f"{line} (this machine has no Slurm configuration: run tune on a login node "
                "where sinfo works, or point SLURM_CONF at the cluster's slurm.conf)")  # fmt: skip
    return line


NEVER_STARTS = frozenset({
    "PartitionConfig",  # asks for more than the partition's configuration allows
    "PartitionNodeLimit",  # more (or fewer) nodes than the partition's limits
    "PartitionTimeLimit",  # --time above the partition's MaxTime
    "PartitionDown", "PartitionInactive",  # no job of it starts until an admin acts
    "BadConstraints",  # no node has the features asked for
    "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
    "QOSMaxGRESPerJob", "QOSMaxNodePerJobLimit", "QOSMaxCpuPerJobLimit",
    "QOSMaxWallDurationPerJobLimit", "AssocMaxGRESPerJob", "AssocMaxNodesPerJob",
    "AssocMaxWallDurationPerJobLimit", "AssocGrpGRES", "AssocGrpNodeLimit",
    "AssocGrpCpuLimit", "QOSGrpGRES", "QOSGrpNodeLimit",
    # *Grp* limits cap the whole group's usage: a job asking more than the cap alone never
    # fits; Slurm gives the same reason while others' jobs hold the cap, which is a
    # permanent "no" for a tuner that submits the same shape again and again.
    "JobHeldAdmin",  # held by an administrator: not ours to release
})  # fmt: skip
"""Pending reasons that cannot clear while the job waits as submitted (module docstring)."""

_DOWN = re.compile(r"\bState=\S*(DOWN|DRAIN|FAIL|FUTURE|NOT_RESPONDING)")


_SUBMITTED = re.compile(r"(\d+)(?:;\S+)?|Submitted batch job (\d+)(?: on cluster \S+)?")
"""``sbatch --parsable``'s line (the job id, then ``;cluster`` on a multi-cluster setup), or
sbatch's line without ``--parsable`` (a site's wrapper that drops it): sbatch(1)."""


def submitted_job_id(stdout: str) -> str | None:
    """The job id sbatch printed: on its last non-empty line (a site's wrapper of sbatch may
    print its own lines first), None when that line names none."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    m = _SUBMITTED.fullmatch(lines[-1]) if lines else None
    return (m.group(1) or m.group(2)) if m else None


def pending_reason(fields: Mapping[str, str]) -> str:
    """The reason word of a pending job (``ReqNodeNotAvail, UnavailableNodes:n3`` keeps all)."""
    return fields.get("Reason", "None").strip()


def never_starts(reason: str, run: Run) -> bool:
    """Whether a job pending for ``reason`` can never start. ``ReqNodeNotAvail`` is permanent
    only when every node it names is down or drained (a reservation or a busy node clears)."""
    word = reason.split(",")[0].strip()
    if word in NEVER_STARTS:
        return True
    if word != "ReqNodeNotAvail":
        return False
    m = re.search(r"UnavailableNodes:(\S+)", reason)
    if m is None:
        return False
    code, out, _err = run(["scontrol", "show", "node", "-o", m.group(1)])
    lines = [line for line in out.splitlines() if line.strip()]
    return code == 0 and bool(lines) and all(_DOWN.search(line) for line in lines)


class Accounting:
    """Final job records from ``sacct``, or from ``scontrol`` where accounting is absent."""

    FIELDS = ("State", "ExitCode", "Elapsed", "MaxRSS")

    def __init__(self, run: Run) -> None:
        self._run = run
        self.disabled: str | None = None
        """Why ``sacct`` cannot be used here (set after the first failure), else None."""
        self._lock = threading.Lock()

    def final(self, job_id: str, fields: Mapping[str, str] | None) -> dict[str, str]:
        """State, ExitCode, Elapsed, MaxRSS (where known) and ``source`` (sacct | scontrol).

        ``fields``: what ``scontrol show job`` last said (None once Slurm forgot the job)."""
        if self.disabled is None:
            record = self._sacct(job_id)
            if record:
                return record
        out = {"source": "scontrol"}
        if fields:
            out["State"] = fields.get("JobState", "UNKNOWN")
            out["ExitCode"] = fields.get("ExitCode", "")
            out["Elapsed"] = fields.get("RunTime", "")
        return out

    def _sacct(self, job_id: str) -> dict[str, str]:
        argv = ["sacct", "-n", "-P", "-j", job_id, "-o", "JobID," + ",".join(self.FIELDS)]
        try:
            code, out, err = self._run(argv)
        except Exception as exc:  # no sacct binary: the same as no accounting
            code, out, err = 127, "", str(exc)
        if code != 0:
            self._disable(err.strip().splitlines()[-1] if err.strip() else f"exit {code}")
            return {}
        record: dict[str, str] = {}
        rss = 0
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) != 1 + len(self.FIELDS):
                continue
            if parts[0] == job_id:
                record.update(zip(self.FIELDS[:3], parts[1:4], strict=True))
            rss = max(rss, _bytes(parts[4]))
        if not record:  # not (yet) in the database: slurmdbd gets records with a delay
            return {}
        if rss:
            record["MaxRSS"] = str(rss)
        record["source"] = "sacct"
        return record

    def _disable(self, why: str) -> None:
        with self._lock:
            if self.disabled is None:
                self.disabled = why
                logger.warning(
                    "sacct cannot be used (%s): final job states come from scontrol and squeue "
                    "(no MaxRSS); configure Slurm accounting (slurmdbd) to get them",
                    why,
                )


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _bytes(text: str) -> int:
    """``sacct``'s MaxRSS (``2048K``, ``1.5G``) in bytes; 0 when empty or unreadable."""
    m = re.fullmatch(r"([0-9.]+)([KMGT]?)", text.strip())
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else 0


def scheduler_verdict(state: str, raw_state: str) -> tuple[str, str] | None:
    """(outcome, reason) Slurm decided for a job that ended without the tuner cancelling it;
    None when the nodes' exit codes and logs decide. ``raw_state``: ``CANCELLED by 1000``."""
    if state == "OUT_OF_MEMORY":
        # The node's cgroup memory limit killed a step (host RAM, not the GPU's).
        return str(Outcome.OOM), f"Slurm: {raw_state} (host memory limit of the job)"
    if state == "PREEMPTED":
        return str(Outcome.INTERRUPTED), "Slurm preempted the job"
    if state == "CANCELLED":
        who = raw_state.removeprefix("CANCELLED").strip() or "outside the tuner"
        return str(Outcome.INTERRUPTED), f"Slurm job cancelled {who} (not by the tuner)"
    return None


_FAILURE_LINE = re.compile(r"\b(fatal|error)\b", re.IGNORECASE)
_OWN_LINE = re.compile(r"tuner: job \S+ on ")
"""The batch script's own line (``slurm_script``'s master address), never the failure."""
MAX_FAILURE_CHARS = 300


def output_failure(text: str) -> str | None:
    """What a job's output file says went wrong before its nodes' wrappers ran: the first line
    naming an error (``srun: fatal: ...``, ``slurmstepd: error: pyxis: ...``), else its last
    line (a setup command's complaint); None when the file says nothing but the script's own
    line. Long lines are cut to :data:`MAX_FAILURE_CHARS`."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not _OWN_LINE.match(ln)]
    if not lines:
        return None
    line = next((ln for ln in lines if _FAILURE_LINE.search(ln)), lines[-1])
    return line if len(line) <= MAX_FAILURE_CHARS else line[: MAX_FAILURE_CHARS - 3] + "..."


def failed_before_nodes(job_id: str, output: Path) -> tuple[str, str] | None:
    """(launch error, reason) of a job that failed before its nodes' wrappers ran, in the words
    of its ``output`` file; None when the file is missing or says nothing."""
    try:
        said = output_failure(output.read_text(errors="replace"))
    except OSError:
        return None
    if said is None:
        return None
    reason = f"Slurm job {job_id} failed before the trial started: {said} ({output.name})"
    return str(Outcome.LAUNCH_ERROR), reason
