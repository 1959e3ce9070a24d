"""The files a Slurm trial runs: the batch script and the per-node wrapper (pure text, no I/O).

The batch script holds only safe values in its ``#SBATCH`` lines; everything naming a path
(``--output``, ``--chdir``) goes on the ``sbatch`` command line (:func:`sbatch_argv`), where no
shell or option parser re-reads it. Node scripts are rendered before Slurm picks the nodes, so
their master address is the placeholder :data:`MASTER_PLACEHOLDER`; the wrapper replaces it with
the address of the job's first node (its ``NodeAddr``) in a copy it runs.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from tuner.launch.base import TOKEN_ENV, LaunchRequest
from tuner.spec.bounds import MASTER_PLACEHOLDER as MASTER_PLACEHOLDER
from tuner.spec.study import SlurmSpec

BATCH_SCRIPT = "slurm-job.sh"
JOB_OUTPUT = "slurm-%j.out"
"""The job's own output file in the trial directory (``sbatch --output``; ``%j``: the job id):
the batch script's lines and whatever ``srun`` says before the nodes' wrappers run."""
NODE_WRAPPER = "slurm-node.sh"
DEFAULT_MARGIN_MIN = 5
"""Slurm's own limit is the tuner's trial limit plus this (the tuner's limit fires first)."""

# Runs on every node of the job as one srun task: picks this node's script by SLURM_NODEID,
# fills in the master address, streams its output into node-<k>.log and records its exit code
# (srun reports only the worst one). $1: the trial directory on the nodes.
NODE_WRAPPER_TEXT = r"""#!/bin/bash
# Written by tuner: runs node $SLURM_NODEID's script of this trial (see slurm-job.sh).
cd "$1" || exit 97
k=${SLURM_NODEID:?not inside a Slurm job step}
addr=${TUNER_MASTER_ADDR:-}
case $addr in ''|*[!A-Za-z0-9._:-]*) echo "tuner: bad master address '$addr'" >&2; exit 98 ;; esac
sed "s/@TUNER_MASTER_ADDR@/$addr/g" "launch-node-$k.sh" > ".launch-node-$k.slurm.sh" || exit 99
bash ".launch-node-$k.slurm.sh" >> "node-$k.log" 2>&1
code=$?
echo "$code" > "node-$k.exit"
exit "$code"
"""

# The first host of the job and its address (NodeAddr may differ from the node name: one
# machine running several slurmd, or names that do not resolve).
SLURM_FIRST_NODE = r"""first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol show node "$first" 2>/dev/null | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')"""
"""Sets ``first`` (the allocation's first node) and ``addr`` (its NodeAddr, maybe empty)."""
_MASTER = "\n".join([
    SLURM_FIRST_NODE,
    "export TUNER_MASTER_ADDR=${addr:-$first}",
    'echo "tuner: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, master $TUNER_MASTER_ADDR"',
    "",
])  # fmt: skip


def job_name(request: LaunchRequest, token: str) -> str:
    """The Slurm job name of a trial: finds the job again from its token alone."""
    return f"tuner-t{request.trial}-{token}"


def time_limit_min(spec: SlurmSpec, request: LaunchRequest) -> int:
    """Slurm ``--time`` in minutes (at least 1, Slurm's minimum)."""
    if spec.time_limit_min is not None:
        return spec.time_limit_min
    trial_min = (request.timeout_s or 0.0) / 60
    return max(1, int(trial_min + 0.999) + DEFAULT_MARGIN_MIN)


def sbatch_lines(spec: SlurmSpec, request: LaunchRequest, token: str) -> list[str]:
    """The ``#SBATCH`` options (no paths: those are on the command line)."""
    lines = [
        f"--job-name={job_name(request, token)}",
        f"--nodes={len(request.hosts)}",
        "--ntasks-per-node=1",
        f"--time={time_limit_min(spec, request)}",
    ]
    if spec.exclusive:
        lines.append("--exclusive")
    for opt in ("partition", "account", "qos"):
        value = getattr(spec, opt)
        if value is not None:
            lines.append(f"--{opt}={value}")
    if spec.gpus_per_node:
        lines.append(f"--gres=gpu:{spec.gpus_per_node}")
    lines.extend(spec.extra_sbatch)
    return lines


def srun_argv(spec: SlurmSpec, node_dir: str, extra: Sequence[str] = ()) -> list[str]:
    """The ``srun`` that starts the wrapper once per node of the job."""
    argv = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=0", *extra, *_container(spec)]
    return [*argv, "bash", f"{node_dir}/{NODE_WRAPPER}", node_dir]


def batch_script(spec: SlurmSpec, request: LaunchRequest, token: str) -> str:
    """The ``sbatch`` script of one trial (submit mode)."""
    node_dir = str(request.remote_dir)
    out = ["#!/bin/bash", f"# Written by tuner for trial {request.trial}."]
    out += [f"#SBATCH {line}" for line in sbatch_lines(spec, request, token)]
    out += [f"export {TOKEN_ENV}={shlex.quote(token)}"]
    out += [f"export {k}={shlex.quote(v)}" for k, v in sorted(request.env.items())]
    return "\n".join(out + _body(spec, node_dir)) + "\n"


def _body(spec: SlurmSpec, node_dir: str) -> list[str]:
    """Setup lines, the master address and the ``srun`` of the wrapper on every node."""
    out = ["# cluster.slurm.setup", *spec.setup] if spec.setup else []
    out += [f"cd {shlex.quote(node_dir)} || exit 97", _MASTER.rstrip("\n")]
    return [*out, shlex.join(srun_argv(spec, node_dir))]


def best_batch_script(
    spec: SlurmSpec, *, study: str, comments: Sequence[str], nodes: int, node_script: str
) -> str:
    """A ready-to-submit batch script for a full run (``tune best --emit sbatch``): the trial's
    options without the trial's time limit, starting ``node_script`` once on every node of the
    job (it finds its rank in ``SLURM_NODEID`` and the master address in the allocation).
    ``comments``: the header's lines, each a shell comment already."""
    name = study if re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", study) else "tuner"
    lines = [f"--job-name={name}-best", f"--nodes={nodes}", "--ntasks-per-node=1"]
    if spec.exclusive:
        lines.append("--exclusive")
    lines += [f"--{o}={getattr(spec, o)}" for o in ("partition", "account", "qos")
              if getattr(spec, o) is not None]  # fmt: skip
    if spec.gpus_per_node:
        lines.append(f"--gres=gpu:{spec.gpus_per_node}")
    out = [
        "#!/bin/bash",
        *comments,
        "# Submit with: sbatch <this file>. No --time: the partition's default limit applies;",
        "# add '#SBATCH --time=...' for a run longer than that.",
        *(f"#SBATCH {line}" for line in [*lines, *spec.extra_sbatch]),
    ]
    out += ["# cluster.slurm.setup", *spec.setup] if spec.setup else []
    out += [  # here, not on the nodes: a container (pyxis) there may have no scontrol; and
        # always: a MASTER_ADDR sbatch carried over from the login node is not this job's
        "# the master address: the first node of the job (its NodeAddr), for every node",
        *SLURM_FIRST_NODE.splitlines(),
        "export MASTER_ADDR=${addr:-$first}",
    ]
    argv = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *_container(spec)]
    return "\n".join([*out, shlex.join([*argv, "bash", node_script])]) + "\n"


def _container(spec: SlurmSpec) -> list[str]:
    out = [f"--container-image={spec.container_image}"] if spec.container_image else []
    if spec.container_mounts:
        out.append(f"--container-mounts={','.join(spec.container_mounts)}")
    return out


def job_output(job_id: str) -> str:
    """The name of job ``job_id``'s output file (:data:`JOB_OUTPUT`)."""
    return JOB_OUTPUT.replace("%j", job_id)


def sbatch_argv(request: LaunchRequest) -> list[str]:
    """``sbatch`` with the options that name paths, reading the script from the trial dir."""
    node_dir = str(request.remote_dir)
    return [
        "sbatch", "--parsable", f"--chdir={node_dir}", f"--output={node_dir}/{JOB_OUTPUT}",
        f"{node_dir}/{BATCH_SCRIPT}",
    ]  # fmt: skip
