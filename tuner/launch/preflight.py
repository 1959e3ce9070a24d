"""Before the first trial: can every node be reached, and does it have what the trials need?

:func:`checks_for` turns a study into :class:`PreflightChecks` (the launch python, the framework
and script paths, the GPU count); :meth:`tuner.launch.base.Executor.preflight` runs them on every
node with one command per node (:data:`CHECK_SCRIPT`, POSIX sh) and returns one
:class:`Problem` per thing wrong. ``tune run`` prints each as one line and exits before launching
anything: 2 when a problem is in the study or on the nodes (a missing path, too few GPUs: fix the
study or the nodes), 1 when a node cannot be reached at all (like a failed job).

DeepSpeed studies are also checked for a stale torch-extension build lock (:class:`BuildLocks`):
``torch.utils.cpp_extension.load`` (how DeepSpeed's op builders JIT-compile an op) creates
``<build dir>/lock`` with ``O_CREAT | O_EXCL`` (``torch.utils.file_baton.FileBaton``), keeps it
open while it builds and removes it when done; every other process waits, with no timeout,
until the file is gone. A build that was killed leaves the file behind, and every later DeepSpeed
start on that node then waits forever (the trials end as ``hang``). What starts DeepSpeed without
``tune run`` (``tune profile --probe``, ``make demo-warmup``'s bare torchrun, the tools and
benchmarks that launch a study's script) runs the same check first: :func:`lock_problems` on a
study's nodes, :func:`local_lock_problems` on this machine (``tuner.cli.lockcheck``).
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from tuner.errors import NodeError
from tuner.launch.slurm_states import slurm_hint
from tuner.spec.frameworks import traits
from tuner.spec.study import StudySpec

PathKind = Literal["executable", "dir", "file"]

# $1: the directory relative paths are checked from ('' : where the command runs), $2: GPUs
# needed (0: no check), $3: report build locks older than this many minutes (0: no check), $4 and
# $5: the study's TORCH_EXTENSIONS_DIR and XDG_CACHE_HOME ('': the node's), then one kind and path
# per check. Prints one line per failure, naming the check by its index: "<i>", "workdir",
# "gpu <count>", "gpu -" (no nvidia-smi) or "lock <path>".
CHECK_SCRIPT = r"""
workdir=$1 gpus=$2 lock_min=$3
[ -n "$4" ] && TORCH_EXTENSIONS_DIR=$4
[ -n "$5" ] && XDG_CACHE_HOME=$5
shift 5
if [ -n "$workdir" ] && ! cd "$workdir" 2>/dev/null; then
  echo workdir
  exit 0
fi
i=0
while [ $# -ge 2 ]; do
  kind=$1 path=$2
  shift 2
  case $kind in
    executable)
      case $path in
        */*) [ -f "$path" ] && [ -x "$path" ] || echo "$i" ;;
        *) command -v "$path" >/dev/null 2>&1 || echo "$i" ;;
      esac ;;
    dir) [ -d "$path" ] || echo "$i" ;;
    *) [ -f "$path" ] || echo "$i" ;;
  esac
  i=$((i + 1))
done
if [ "$gpus" -gt 0 ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    [ "$n" -ge "$gpus" ] || echo "gpu $n"
  else
    echo "gpu -"
  fi
fi
# torch.utils.cpp_extension._get_build_directory: $TORCH_EXTENSIONS_DIR/<op>, else
# <user cache>/torch_extensions/py<XY>_<accelerator>/<op>; the lock is that directory's "lock".
# A lock is stale when no process has it open (/proc/*/fd; the builder keeps its fd open).
if [ "$lock_min" -gt 0 ] && [ -d /proc/self/fd ]; then
  if [ -n "${TORCH_EXTENSIONS_DIR:-}" ]; then
    root=$TORCH_EXTENSIONS_DIR depth=2
  else
    root=${XDG_CACHE_HOME:-$HOME/.cache}/torch_extensions depth=3
  fi
  if [ -d "$root" ]; then
    find "$root" -mindepth $depth -maxdepth $depth -type f -name lock -mmin +"$lock_min" \
        2>/dev/null | while IFS= read -r lock; do
      real=$(cd "${lock%/lock}" 2>/dev/null && pwd -P)/lock
      ls -l /proc/[0-9]*/fd/ 2>/dev/null | awk -v p="$real" '
        { i = index($0, " -> "); if (i && substr($0, i + 4) == p) held = 1 }
        END { exit held ? 0 : 1 }' || echo "lock $real"
    done
  fi
fi
exit 0
"""

SHOWN_HOSTS = 3
"""At most this many nodes sharing one problem get a line each; more share one line."""
STALE_LOCK_MINUTES = 5
"""A build lock older than this that no process holds is stale. Why the age too: a build in
another PID namespace (a container sharing the home directory) holds the lock unseen; DeepSpeed's
CPU ops build in well under a minute, so a lock this old is almost never a build in progress."""


@dataclass(frozen=True, slots=True)
class PathCheck:
    """A path every node must have."""

    field: str
    """The study field it comes from (``launch.python``), for the message."""
    path: str
    kind: PathKind
    """``executable`` (a bare name is looked up on the node's PATH), ``dir`` or ``file``."""

    def problem(self) -> str:
        if self.kind == "executable" and "/" not in self.path:
            return f"{self.field}: {self.path!r} is not on the node's PATH"
        what = {"executable": "an executable file", "dir": "a directory", "file": "a file"}
        return f"{self.field}: {self.path} is not {what[self.kind]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildLocks:
    """Look for stale torch-extension build locks (DeepSpeed's JIT-built ops)."""

    minutes: int = STALE_LOCK_MINUTES
    """Only locks older than this, and held by no process, are stale."""
    extensions_dir: str = ""
    """The study's ``launch.env`` TORCH_EXTENSIONS_DIR ('': the node's environment)."""
    cache_home: str = ""
    """The study's ``launch.env`` XDG_CACHE_HOME ('': the node's environment)."""

    @staticmethod
    def problem(path: str) -> str:
        """One line naming the stale lock and how to clear it."""
        return (
            f"stale torch-extension build lock {path} (an op build was killed; every DeepSpeed "
            f"start on this node would wait on it forever): remove it with rm {shlex.quote(path)}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PreflightChecks:
    """What every node must offer before trials are launched on it."""

    paths: tuple[PathCheck, ...] = ()
    workdir: str | None = None
    """Relative paths are checked from here (``launch.workdir``); it must exist too."""
    gpus: int = 0
    """``nvidia-smi -L`` must list at least this many GPUs (0: no GPU check)."""
    gpu_field: str = "cluster.gpus_per_node"
    locks: BuildLocks | None = None
    """Stale torch-extension build locks are a problem (DeepSpeed studies); None: not checked."""

    def argv(self) -> list[str]:
        """The command that checks one node (for ``sh``: no quoting has happened yet)."""
        locks = self.locks
        args = [self.workdir or "", str(self.gpus)]
        if locks is None:
            args += ["0", "", ""]
        else:
            args += [str(locks.minutes), locks.extensions_dir, locks.cache_home]
        for check in self.paths:
            args += [check.kind, check.path]
        return ["sh", "-c", CHECK_SCRIPT, "tuner-preflight", *args]

    def collect(
        self, hosts: Sequence[str], outcomes: Sequence[tuple[int, str, str] | BaseException]
    ) -> list[Problem]:
        """The problems of every node, in host order, from each node's (exit code, stdout,
        stderr) of :meth:`argv` or the exception that kept it from running."""
        problems: list[Problem] = []
        for host, out in zip(hosts, outcomes, strict=True):
            if isinstance(out, NodeError):
                problems.append(Problem(host, out.reason, config=False))
            elif isinstance(out, BaseException):
                problems.append(Problem(host, f"{type(out).__name__}: {out}", config=False))
            else:
                problems += self.problems(host, *out)
        return problems

    def problems(self, host: str, code: int, out: str, err: str) -> list[Problem]:
        """The problems one node's run of :meth:`argv` reports."""
        if code != 0:
            tail = slurm_hint((err.strip().splitlines() or [f"exit status {code}"])[-1])
            return [Problem(host, f"the preflight check could not run: {tail}", config=False)]
        found: list[Problem] = []
        for line in out.split("\n"):
            word, _, rest = line.strip().partition(" ")
            if word.isdigit() and int(word) < len(self.paths):
                found.append(Problem(host, self.paths[int(word)].problem()))
            elif word == "workdir":
                found.append(Problem(host, f"launch.workdir: {self.workdir} is not a directory"))
            elif word == "gpu":
                found.append(Problem(host, self._gpu_problem(rest)))
            elif word == "lock" and rest:
                found.append(Problem(host, BuildLocks.problem(rest)))
        return found

    def _gpu_problem(self, count: str) -> str:
        if count == "-":
            return f"nvidia-smi not found, but {self.gpu_field} asks for {self.gpus} GPUs"
        return f"nvidia-smi -L lists {count} GPUs, but {self.gpu_field} asks for {self.gpus}"


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong on one node, as one line: ``host: what``."""

    host: str
    message: str
    config: bool = True
    """True: fix the study or the node (exit 2); False: the node could not be reached (exit 1)."""

    def __str__(self) -> str:
        return f"{self.host}: {self.message}"


def problem_lines(problems: Sequence[Problem]) -> list[str]:
    """One ``host: what`` line per problem, except that a message more than
    :data:`SHOWN_HOSTS` nodes share is one line naming the first and last of them
    (``slurm-0, slurm-1, ..., slurm-15 (16 nodes): srun: fatal: ...``): a Slurm that could not be
    reached printed the same line for every slot of the pool."""
    hosts: dict[str, list[str]] = {}
    for problem in problems:
        hosts.setdefault(problem.message, []).append(problem.host)
    lines = []
    for problem in problems:  # in the executor's order; a shared line where it first occurs
        names = hosts[problem.message]
        if len(names) <= SHOWN_HOSTS:
            lines.append(str(problem))
        elif problem.host == names[0]:
            where = f"{', '.join(names[:2])}, ..., {names[-1]} ({len(names)} nodes)"
            lines.append(f"{where}: {problem.message}")
    return lines


def checks_for(spec: StudySpec) -> PreflightChecks:
    """The checks a study's trials need on every node.

    Only paths the study sets are checked (a template's own requirements are its error to
    report); DeepSpeed studies are checked for stale build locks where the trials would build
    their ops (the study's TORCH_EXTENSIONS_DIR / XDG_CACHE_HOME, else the node's). GPUs are
    counted on remote nodes when ``cluster.gpu`` is not ``cpu``; the local executor runs on this
    machine, where the tests' Megatron stand-in plays a GPU cluster on CPUs, so it is not asked
    for GPUs.
    """
    launch = spec.launch
    paths = [PathCheck("launch.python", launch.python, "executable")]
    if launch.megatron_path:
        paths.append(PathCheck("launch.megatron_path", launch.megatron_path, "dir"))
        if launch.template in ("megatron_gpt", "megatron_deepspeed_gpt"):
            script = f"{launch.megatron_path.rstrip('/')}/pretrain_gpt.py"
            paths.append(PathCheck("launch.megatron_path", script, "file"))
    if launch.script:
        paths.append(PathCheck("launch.script", launch.script, "file"))
    remote = spec.cluster.executor != "local"
    gpus = spec.cluster.gpus_per_node if remote and spec.cluster.gpu != "cpu" else 0
    t = traits(spec.framework)
    locks = None
    if t.deepspeed_optimizer or t.deepspeed_pipeline:  # DeepSpeed JIT-builds its ops
        env = launch.env
        locks = BuildLocks(extensions_dir=env.get("TORCH_EXTENSIONS_DIR", ""),
                           cache_home=env.get("XDG_CACHE_HOME", ""))  # fmt: skip
    return PreflightChecks(paths=tuple(paths), workdir=launch.workdir, gpus=gpus, locks=locks)


def exit_code(problems: Sequence[Problem]) -> int:
    """0 without problems; 2 when one is in the study or on a node; 1 when all are unreachable
    nodes."""
    if not problems:
        return 0
    return 2 if any(p.config for p in problems) else 1


class Preflights(Protocol):
    """What runs a check on nodes (:meth:`tuner.launch.base.Executor.preflight`)."""

    def preflight(self, hosts: Sequence[str], checks: PreflightChecks) -> list[Problem]: ...


def lock_problems(spec: StudySpec, executor: Preflights) -> list[Problem]:
    """The stale build locks on the study's nodes, as ``tune run``'s preflight finds them ([]
    for a study that does not start DeepSpeed): for what launches the study's script without
    that preflight (``tune profile --probe``, tools, benchmarks)."""
    locks = checks_for(spec).locks
    if locks is None:
        return []
    return executor.preflight(spec.node_names, PreflightChecks(locks=locks))


def local_lock_problems(host: str = "localhost") -> list[Problem]:
    """The stale build locks of this machine, where a DeepSpeed started here would build its ops
    (this process's TORCH_EXTENSIONS_DIR / XDG_CACHE_HOME / HOME): for a bare ``torchrun``."""
    checks = PreflightChecks(locks=BuildLocks())
    done = subprocess.run(checks.argv(), capture_output=True, text=True, check=False)
    return checks.problems(host, done.returncode, done.stdout, done.stderr)
