"""Before the first trial: can every node be reached, and does it have what the trials need?

:func:`checks_for` turns a study into :class:`PreflightChecks` (the launch python, the framework
and script paths, the GPU count); :meth:`tuner.launch.base.Executor.preflight` runs them on every
node with one command per node (:data:`CHECK_SCRIPT`, POSIX sh) and returns one
:class:`Problem` per thing wrong. ``tune run`` prints each as one line and exits before launching
anything: 2 when a problem is in the study or on the nodes (a missing path, too few GPUs: fix the
study or the nodes), 1 when a node cannot be reached at all (like a failed job).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tuner.errors import NodeError
from tuner.spec import StudySpec

PathKind = Literal["executable", "dir", "file"]

# $1: the directory relative paths are checked from ('' : where the command runs), $2: GPUs
# needed (0: no check), then one kind and path per check. Prints one line per failure, naming the
# check by its index: "<i>", "workdir", "gpu <count>" or "gpu -" (no nvidia-smi).
CHECK_SCRIPT = r"""
workdir=$1 gpus=$2
shift 2
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
exit 0
"""


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
class PreflightChecks:
    """What every node must offer before trials are launched on it."""

    paths: tuple[PathCheck, ...] = ()
    workdir: str | None = None
    """Relative paths are checked from here (``launch.workdir``); it must exist too."""
    gpus: int = 0
    """``nvidia-smi -L`` must list at least this many GPUs (0: no GPU check)."""
    gpu_field: str = "cluster.gpus_per_node"

    def argv(self) -> list[str]:
        """The command that checks one node (for ``sh``: no quoting has happened yet)."""
        args = [self.workdir or "", str(self.gpus)]
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
            tail = (err.strip().splitlines() or [f"exit status {code}"])[-1]
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


def checks_for(spec: StudySpec) -> PreflightChecks:
    """The checks a study's trials need on every node.

    Only paths the study sets are checked (a template's own requirements are its error to
    report). GPUs are counted on remote nodes when ``cluster.gpu`` is not ``cpu``; the local
    executor runs on this machine, where the tests' Megatron stand-in plays a GPU cluster on
    CPUs, so it is not asked for GPUs.
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
    return PreflightChecks(paths=tuple(paths), workdir=launch.workdir, gpus=gpus)


def exit_code(problems: Sequence[Problem]) -> int:
    """0 without problems; 2 when one is in the study or on a node; 1 when all are unreachable
    nodes."""
    if not problems:
        return 0
    return 2 if any(p.config for p in problems) else 1
