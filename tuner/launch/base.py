"""Where trials run: the Executor / Job abstraction shared by the local, SSH and Slurm backends.

An :class:`Executor` turns a :class:`LaunchRequest` (one shell script per node, extra files, a time
limit) into a running :class:`Job`. The job owns the trial's processes on every node until they are
gone: :meth:`Job.wait` / :meth:`Job.poll` give a :class:`JobResult`, :meth:`Job.cancel` ends the
whole process tree on every node and then verifies that nothing of the trial is left.

Every process of a trial carries ``TUNER_TRIAL_TOKEN=<uuid>`` in its environment. torchrun puts
each worker in its own session, so killing the launcher's process group is not enough; the token
finds the workers wherever they went. One small shell program (:data:`PROCESS_SCRIPT`) terminates
and verifies them, in a single command per node, on this machine and over SSH.

What is submitted and what comes back (:class:`LaunchRequest`, :class:`JobResult`, the token's
variable) are values of their own, in :mod:`tuner.launch.request`.

Backends fill four hooks: ``_prepare_node`` (place files), ``_start_node`` (start the script and
stream its output), ``_reap_node`` (run :data:`PROCESS_SCRIPT` on the node) and ``_run_check``
(one command, for :meth:`Executor.preflight`).
"""

from __future__ import annotations

import abc
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from tuner.errors import LaunchError, NodeError, UnreachableNodes
from tuner.launch.preflight import PreflightChecks, Problem
from tuner.launch.request import ENDED_MARK, ended_how
from tuner.launch.request import TOKEN_ENV as TOKEN_ENV
from tuner.launch.request import JobResult as JobResult
from tuner.launch.request import LaunchRequest as LaunchRequest
from tuner.layout import TrialPaths
from tuner.layout import write_atomic as write_atomic  # report/ imports it from here

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
T = TypeVar("T")
R = TypeVar("R")

# Ends the processes of one trial on one node and prints what survives. POSIX sh, procps, GNU grep.
# $1: token, $2: pid file holding the node script's process group, $3: grace seconds.
# A process belongs to the trial when its environment holds the token, or when it is in the node
# script's process group and that group had a token-carrying member when first seen (guards against
# a reused pid). SIGTERM to all, up to $3 s for them to go, SIGKILL to the rest, up to 5 s more;
# prints the survivors as "pid stat args" (zombies are not survivors). One command: over SSH each
# command costs a login-shell start, which may be slow (~0.3 s with pyenv/conda in .bashrc).
PROCESS_SCRIPT = r"""
tok=$1 pidfile=$2 grace=$3 pg= pg_ok=
[ -r "$pidfile" ] && pg=$(cat "$pidfile" 2>/dev/null)
case $pg in ''|*[!0-9]*) pg= ;; esac
find_pids() {
  pids=$(grep -lzx "TUNER_TRIAL_TOKEN=$tok" /proc/[0-9]*/environ 2>/dev/null \
         | sed -e 's|^/proc/||' -e 's|/environ$||' | tr '\n' ' ')
  if [ -n "$pg" ] && [ -z "$pg_ok" ] && [ -n "$pids" ]; then
    ps -o pgid= -p "$(echo $pids | tr ' ' ,)" 2>/dev/null | grep -qx " *$pg" && pg_ok=1
  fi
  if [ -n "$pg_ok" ]; then
    pids="$pids $(ps -e -o pid= -o pgid= -o stat= \
                  | awk -v g="$pg" '$2 == g && $3 !~ /^Z/ {print $1}' | tr '\n' ' ')"
  fi
  pids=$(echo $pids)
}
wait_gone() {
  n=0
  while [ "$n" -lt "$1" ]; do
    find_pids
    [ -z "$pids" ] && return 0
    sleep 0.1
    n=$((n + 1))
  done
  find_pids
}
find_pids
if [ -n "$pids" ]; then
  kill -s TERM $pids 2>/dev/null
  wait_gone "$(awk -v g="$grace" 'BEGIN { print int(g * 10) }')"
fi
if [ -n "$pids" ]; then
  kill -s KILL $pids 2>/dev/null
  wait_gone 50
fi
[ -z "$pids" ] && exit 0
ps -ww -o pid= -o stat= -o args= -p "$(echo $pids | tr ' ' ,)" 2>/dev/null | awk '$2 !~ /^Z/'
exit 0
"""


def new_token() -> str:
    """The mark a job's processes carry, by which :meth:`Executor.reap_lost` finds them."""
    return uuid.uuid4().hex


class NodeProcess(abc.ABC):
    """The running script of one node, as a backend sees it."""

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The exit code once the script has ended and its output is in the log, else None.

        Raises :class:`NodeError` when the node is lost (dropped connection).
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the process holds on this side (log file, channel)."""


class Executor(abc.ABC):
    """Starts trials on nodes. Subclasses fill the ``_*_node`` hooks.

    ``clock`` measures the trial time limit and durations (tests pass a fake one to fast-forward);
    ``grace_s`` is how long killed processes get between SIGTERM and SIGKILL.
    """

    def __init__(
        self,
        *,
        clock: Clock = time.monotonic,
        grace_s: float = 10.0,
        poll_interval_s: float = 0.1,
        peer_exit_grace_s: float = 60.0,
        max_parallel: int = 64,
    ) -> None:
        self.clock = clock
        self.grace_s = grace_s
        self.poll_interval_s = poll_interval_s
        self.peer_exit_grace_s = peer_exit_grace_s
        self._threads = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="tuner")

    def submit(self, request: LaunchRequest, token: str | None = None) -> Job:
        """Place the files, start the script on every node and return the running job, marked
        with ``token`` (:func:`new_token`; a fresh one when None). A caller that records the
        token before the processes start can always find them again if it dies meanwhile.

        Never raises for an unreachable node: the job then ends at once with a node error.
        """
        self._write_local_copies(request)
        job = Job(self, request, token=token or new_token())
        job._start()
        return job

    def reap_lost(self, request: LaunchRequest, token: str) -> list[str]:
        """End every process of a trial whose :class:`Job` is gone (its tuner process died), on
        every node of ``request`` (its scripts are not used). Returns the survivors as
        ``"host: pid stat args"``; raises :class:`UnreachableNodes` naming nodes not reached."""
        found = self._fanout(
            lambda k: self._reap_node(request, k, token, self.grace_s), range(len(request.hosts))
        )
        survivors: list[str] = []
        unreachable: list[tuple[str, str]] = []
        for host, lines in zip(request.hosts, found, strict=True):
            if isinstance(lines, NodeError):
                unreachable.append((host, lines.reason))
            elif isinstance(lines, BaseException):
                unreachable.append((host, str(lines)))
            else:
                survivors.extend(f"{host}: {line}" for line in lines)
        if unreachable:
            raise UnreachableNodes(request.what, tuple(unreachable))
        return survivors

    def preflight(self, hosts: Sequence[str], checks: PreflightChecks) -> list[Problem]:
        """Before the first trial: reach every node and run ``checks`` there (one command per
        node, in parallel). One :class:`Problem` per thing wrong, in host order; an unreachable
        node is a problem too (``config=False``), never an exception."""
        return checks.collect(
            hosts, self._fanout(lambda h: self._run_check(h, checks.argv()), hosts)
        )

    def master_addr(self, hosts: Sequence[str]) -> str:
        """The address other nodes use to reach ``hosts[0]`` (the rendezvous host)."""
        return hosts[0]

    def master_port(self, hosts: Sequence[str], preferred: int) -> int:
        """The rendezvous port for a trial on ``hosts``: ``preferred`` (the node pool keeps the
        groups of one worker apart; the nodes' ports are not visible from here)."""
        return preferred

    def send_files(self, request: LaunchRequest, files: Mapping[str, str]) -> None:
        """Write ``files`` into the directory of ``request``'s running job on every node (what
        its scripts wait for: the framework probe's verdict on what to measure again). Here, the
        trial directory, which this machine's "nodes" and a Slurm job's share with it, and the
        nodes' own directory where it is another; over SSH each node's
        (:mod:`tuner.launch.ssh`)."""
        from pathlib import Path

        for name, content in files.items():
            write_atomic(request.paths.file(name), content)
            there = Path(request.remote_dir) / name
            if there.parent.resolve() != request.paths.dir.resolve():
                write_atomic(there, content)

    def close(self) -> None:
        """Release connections and threads. Jobs must be finished first."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- hooks --------------------------------------------------------------------------------

    @abc.abstractmethod
    def _prepare_node(self, request: LaunchRequest, node_rank: int) -> None:
        """Put the script and extra files into the trial directory of node ``node_rank``."""

    @abc.abstractmethod
    def _start_node(self, request: LaunchRequest, node_rank: int, token: str) -> NodeProcess:
        """Start node ``node_rank``'s script with the token in its environment."""

    @abc.abstractmethod
    def _reap_node(
        self, request: LaunchRequest, node_rank: int, token: str, grace_s: float
    ) -> list[str]:
        """End every process of the trial on the node (SIGTERM, ``grace_s``, SIGKILL).

        Returns the survivors as ``"pid stat args"`` lines (empty when clean).
        """

    @abc.abstractmethod
    def _run_check(self, host: str, argv: Sequence[str]) -> tuple[int, str, str]:
        """Run ``argv`` on ``host`` as a node's trial would see it: (exit code, stdout, stderr).

        Raises :class:`NodeError` when the node cannot be reached.
        """

    # ----- helpers for Job and subclasses -------------------------------------------------------

    def _fanout(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R | BaseException]:
        """``fn`` over ``items`` in parallel; an exception is returned in place of its result."""
        futures = [self._threads.submit(fn, item) for item in items]
        out: list[R | BaseException] = []
        for f in futures:
            exc = f.exception()
            out.append(exc if exc is not None else f.result())
        return out

    def _write_local_copies(self, request: LaunchRequest) -> None:
        paths = request.paths
        paths.dir.mkdir(parents=True, exist_ok=True)
        for k, script in enumerate(request.scripts):
            write_atomic(paths.launch_script(k), script, mode=0o755)
        for name, content in request.files.items():
            write_atomic(paths.file(name), content)


class Job:
    """One trial running on a group of nodes. Thread-safe; created by :meth:`Executor.submit`."""

    def __init__(self, executor: Executor, request: LaunchRequest, *, token: str) -> None:
        self._ex = executor
        self._req = request
        self.token = token
        """The value of ``TUNER_TRIAL_TOKEN`` carried by every process of the trial."""
        self._lock = threading.RLock()
        self._procs: dict[int, NodeProcess] = {}
        self._codes: dict[int, int | None] = {}
        self._errors: dict[int, str] = {}
        self._started_at = executor.clock()
        self._first_exit_at: float | None = None
        self._result: JobResult | None = None
        self._stopped: str | None = None

    @property
    def paths(self) -> TrialPaths:
        """The trial's files on this machine."""
        return self._req.paths

    @property
    def request(self) -> LaunchRequest:
        """What was submitted."""
        return self._req

    @property
    def done(self) -> bool:
        """True once a result is available."""
        return self._result is not None

    def _start(self) -> None:
        ranks = range(len(self._req.hosts))
        prepared = self._ex._fanout(lambda k: self._ex._prepare_node(self._req, k), ranks)
        self._note_failures(prepared)
        if self._errors:  # do not start half a group: the others would wait for rendezvous
            self._finish(timed_out=False, cancelled=False)
            return
        started = self._ex._fanout(lambda k: self._ex._start_node(self._req, k, self.token), ranks)
        for k, outcome in enumerate(started):
            if isinstance(outcome, NodeProcess):
                self._procs[k] = outcome
        self._note_failures(started)
        if self._errors:
            self._kill_all(cancelled=False, timed_out=False)

    def _note_failures(self, outcomes: Sequence[object]) -> None:
        for k, outcome in enumerate(outcomes):
            if isinstance(outcome, NodeError):
                self._errors[k] = outcome.reason
            elif isinstance(outcome, BaseException):
                # An unexpected failure on one node must not leave the others running unwatched.
                logger.error("%s node %s: %r", self._req.what, self._req.hosts[k], outcome)
                self._errors[k] = f"{type(outcome).__name__}: {outcome}"

    def poll(self) -> JobResult | None:
        """The result if the trial has ended (or was just killed for its time limit), else None."""
        with self._lock:
            if self._result is not None:
                return self._result
            self._collect()
            now = self._ex.clock()
            limit = self._req.timeout_s
            if self._errors:
                self._kill_all(cancelled=False, timed_out=False)
            elif len(self._codes) == len(self._req.hosts):
                self._finish(timed_out=False, cancelled=False)
            elif limit is not None and now - self._started_at > limit:
                logger.warning("%s ran past its limit of %.0f s", self._req.what, limit)
                self._kill_all(cancelled=True, timed_out=True)
            elif self._peers_stuck(now):
                logger.warning("%s: a node failed; ending the others", self._req.what)
                self._kill_all(cancelled=False, timed_out=False)
            return self._result

    def _collect(self) -> None:
        for k, proc in self._procs.items():
            if k in self._codes or k in self._errors:
                continue
            try:
                code = proc.poll()
            except NodeError as e:
                self._errors[k] = e.reason
                continue
            if code is not None:
                self._codes[k] = code
                proc.close()
                if code != 0 and self._first_exit_at is None:
                    self._first_exit_at = self._ex.clock()

    def _peers_stuck(self, now: float) -> bool:
        # One node failed; the others usually fail soon after (lost rendezvous). If they hang
        # instead, do not hold the nodes until the trial's time limit.
        return (
            self._first_exit_at is not None
            and now - self._first_exit_at > self._ex.peer_exit_grace_s
        )

    def wait(self, timeout: float | None = None) -> JobResult:
        """Block until the trial ends; :class:`TimeoutError` if ``timeout`` seconds pass first.

        The trial's own time limit is enforced here too: past it the job is killed and its result
        says ``timed_out``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            result = self.poll()
            if result is not None:
                return result
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self._req.what} still running after {timeout} s")
            time.sleep(self._ex.poll_interval_s)

    def cancel(self) -> None:
        """End the trial's whole process tree on every node and verify nothing of it is left.

        Raises :class:`LaunchError` naming the survivors if some process could not be killed (they
        are also in ``result.survivors``). Does nothing if the trial has already ended.
        """
        with self._lock:
            if self._result is None:
                self._kill_all(cancelled=True, timed_out=False)
            result = self._result
        if result is not None and result.cancelled and result.survivors:
            raise LaunchError(
                f"{self._req.what}: processes survived cancel: " + "; ".join(result.survivors)
            )

    def stop(self, why: str) -> None:
        """End the trial because its measurement is complete (``why``: ``precise`` or
        ``raced``): killed as :meth:`cancel` does, with ``result.stopped`` saying why, so the
        log is judged as a measurement and not as an interrupted run. Does nothing if the
        trial has already ended."""
        with self._lock:
            if self._result is None:
                self._stopped = why
                self._kill_all(cancelled=True, timed_out=False)

    def result(self) -> JobResult | None:
        """The result if the trial has ended, without polling."""
        return self._result

    def _kill_all(self, *, cancelled: bool, timed_out: bool) -> None:
        """End everything on every node (one command per node), then freeze the result."""
        live = [k for k in self._procs if k not in self._codes and k not in self._errors]
        survivors = self._reap(self._ex.grace_s)
        self._drain(live, seconds=5.0)
        self._finish(timed_out=timed_out, cancelled=cancelled, survivors=survivors)

    def _drain(self, ranks: Sequence[int], *, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._collect()
            if all(k in self._codes or k in self._errors for k in ranks):
                return
            time.sleep(0.02)

    def _finish(
        self, *, timed_out: bool, cancelled: bool, survivors: list[str] | None = None
    ) -> None:
        """Freeze the result; without ``survivors`` (the trial ended by itself) sweep first.

        Even a trial that ended by itself may leave processes behind (a daemonised helper, a
        worker torchrun lost track of); they would hold the node's GPUs.
        """
        if survivors is None:
            survivors = self._reap(1.0) if self._procs else []
        for proc in self._procs.values():
            proc.close()
        req = self._req
        self._result = JobResult(
            trial=req.trial,
            hosts=req.hosts,
            exit_codes=tuple(self._codes.get(k) for k in range(len(req.hosts))),
            timed_out=timed_out,
            cancelled=cancelled,
            node_errors=tuple((req.hosts[k], r) for k, r in sorted(self._errors.items())),
            duration_s=self._ex.clock() - self._started_at,
            logs=tuple(req.paths.node_log(k) for k in range(len(req.hosts))),
            survivors=tuple(survivors),
            stopped=self._stopped,
        )
        write_atomic(req.paths.result_json, json.dumps(self._result.to_json(), indent=2) + "\n")
        self._mark_logs(ended_how(timed_out=timed_out, cancelled=cancelled, stopped=self._stopped))
        if survivors:
            logger.error("%s: processes survive: %s", req.what, "; ".join(survivors))

    def _mark_logs(self, how: str | None) -> None:
        """End every node log of a trial the tuner ended with a line that says so
        (:data:`ENDED_MARK`): the SIGTERM's traceback above it is the tuner's, which a log copied
        out without its ``result.json`` did not say."""
        if how is None:
            return
        for k in range(len(self._req.hosts)):
            log = self._req.paths.node_log(k)
            try:
                if log.is_file():
                    with log.open("a") as out:  # after a line the kill may have cut short
                        out.write(f"\n{ENDED_MARK}{how}\n")
            except OSError as exc:
                logger.warning("%s: cannot mark %s: %s", self._req.what, log, exc)

    def _reap(self, grace_s: float) -> list[str]:
        """Run the reaper on every node that was started, lost ones too (the connection may be
        back); a node that cannot be reached is logged, not reported as a survivor."""
        ranks = list(self._procs)
        found = self._ex._fanout(
            lambda k: self._ex._reap_node(self._req, k, self.token, grace_s), ranks
        )
        survivors: list[str] = []
        for k, lines in zip(ranks, found, strict=True):
            host = self._req.hosts[k]
            if isinstance(lines, BaseException):
                level = logging.INFO if k in self._errors else logging.ERROR
                logger.log(level, "%s: cannot check %s: %s", self._req.what, host, lines)
            else:
                survivors.extend(f"{host}: {line}" for line in lines)
        return survivors
