"""A throw-away real Slurm on this machine: munged, slurmctld and N slurmd, all under one DIR.

    python tools/local_slurm.py start --dir DIR [--nodes 2]
    python tools/local_slurm.py stop --dir DIR

``start`` makes a private munge key and socket, a ``slurm.conf`` (nodes ``n1..nN``, all
``NodeAddr=127.0.0.1`` on distinct ports, one partition ``debug``, cons_tres, linuxproc, no
accounting) and starts the daemons without systemd; their pids go to ``DIR/cluster.json``. Client
commands reach this cluster with ``SLURM_CONF=DIR/slurm.conf`` (printed). The system's
``/etc/munge`` and ``/etc/slurm`` are never touched. Use a fresh DIR per run: an old state
directory makes slurmctld recover old jobs.

``stop`` cancels every job, ends the daemons (SIGTERM, then SIGKILL) and verifies that nothing of
the cluster is left: no daemon, no slurmstepd and no job process (found by their
``SLURM_CONF`` environment); it exits 1 naming any survivor. A recorded pid is only signalled
while its command line or environment still names this DIR, so a recycled pid is never hit.

The tests (``tests/launch/slurm.py``) and ``make demo-slurm`` use :class:`LocalSlurm` from here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

STATE_FILE = "cluster.json"
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "srun")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin")


def slurm_missing_reason() -> str | None:
    """Why a local Slurm cannot start here (a missing binary), or None."""
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        return (
            f"Slurm is not installed (missing {', '.join(missing)}): apt-get install -y "
            "--no-install-recommends slurmctld slurmd slurm-client munge"
        )
    return None


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out as an outgoing connection's source port."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def _free_port(taken: set[int]) -> int:
    """A port below the kernel's ephemeral range that nothing listens on now.

    The daemons bind their ports seconds after the configuration is written. A port from the
    ephemeral range (what ``bind(0)`` returns) can be taken meanwhile as the source port of any
    outgoing connection (slurmctld's own pings, the suite's SSH and gloo traffic), and the daemon
    then dies before writing its pid file; below the range only a listener can take it."""
    high = max(LOWEST_PORT + 1, _ephemeral_low())
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(LOWEST_PORT, high)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError(f"local Slurm: no free port in {LOWEST_PORT}..{high - 1}")


class LocalSlurm:
    """One throw-away Slurm cluster under ``dir`` (see the module docstring)."""

    def __init__(
        self, dir: Path, nodes: int = 2, *, cpus: int = 4, kill_wait_s: int = 2,
        min_job_age_s: int = 300,
    ) -> None:  # fmt: skip
        """``min_job_age_s``: how long Slurm keeps an ended job's record (``MinJobAge``), which
        is what ``scontrol show job`` reads: there is no accounting."""
        if not 1 <= nodes <= 16:
            raise ValueError(f"nodes must be 1..16, got {nodes}")
        self.dir = Path(dir).resolve()
        self.nodes = tuple(f"n{i + 1}" for i in range(nodes))
        self.cpus = cpus
        self.kill_wait_s = kill_wait_s
        self.min_job_age_s = min_job_age_s
        self.pids: dict[str, int] = {}

    @property
    def conf(self) -> Path:
        """The ``slurm.conf``; export ``SLURM_CONF`` as this path to use the cluster."""
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` pointing at the cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- start ------------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> None:
        """Write the configuration, start munged, slurmctld and every slurmd; wait until every
        node is idle. On any failure whatever was started is stopped again."""
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> None:
        for sub in ("munge", "state", "log", "spool"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)  # other users' client commands read slurm.conf
        key = self.dir / "munge" / "munge.key"
        if not key.exists():
            subprocess.run([_need("mungekey"), "-c", "-k", str(key)], check=True)
        key.chmod(0o400)
        m = self.dir / "munge"
        self._run_daemon("munged", [
            _need("munged"), "--force", f"--key-file={key}", f"--socket={m / 'munge.sock'}",
            f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
            f"--seed-file={m / 'munge.seed'}",
        ], m / "munged.pid", timeout_s)  # fmt: skip
        self._wait(lambda: (m / "munge.sock").exists(), timeout_s, "munged's socket")
        self.conf.write_text(self._slurm_conf())
        self._run_daemon(
            "slurmctld",
            [_need("slurmctld"), "-f", str(self.conf)],
            self.dir / "slurmctld.pid",
            timeout_s,
        )
        for node in self.nodes:
            self._run_daemon(
                f"slurmd-{node}",
                [_need("slurmd"), "-f", str(self.conf), "-N", node],
                self.dir / f"slurmd-{node}.pid",
                timeout_s,
            )
        self._save()
        self._wait(self._all_idle, timeout_s, "every node idle (see DIR/log)")

    def _slurm_conf(self) -> str:
        d = self.dir
        taken: set[int] = set()
        lines = [
            "ClusterName=tunerlocal",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={_free_port(taken)}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={d / 'munge' / 'munge.sock'}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool' / '%n'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1",
            f"KillWait={self.kill_wait_s}",
            "InactiveLimit=0",
            f"MinJobAge={self.min_job_age_s}",
        ]
        for node in self.nodes:
            lines.append(
                f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 "
                f"Port={_free_port(taken)} CPUs={self.cpus} RealMemory=1000 State=UNKNOWN"
            )
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _run_daemon(self, name: str, argv: list[str], pid_file: Path, timeout_s: float) -> None:
        # The daemons fork into the background themselves; their own session keeps a terminal's
        # Ctrl-C from taking them down while tune still needs them to cancel its jobs.
        log = self.dir / "log" / f"{name}.start.log"
        with log.open("ab") as out:
            subprocess.run(
                argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, check=True,
                stdin=subprocess.DEVNULL, start_new_session=True, timeout=30,
            )  # fmt: skip
        try:
            self._wait(lambda: _read_pid(pid_file) is not None, timeout_s, f"{name}'s pid file")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; {self._log_tail(name, log)}") from None
        pid = _read_pid(pid_file)
        assert pid is not None  # _wait returned
        self.pids[name] = pid

    def _log_tail(self, name: str, start_log: Path, lines: int = 5) -> str:
        """The last lines of what ``name`` logged (its own log file, else its start-up output),
        so a daemon that died before writing its pid file says why."""
        # munged's --log-file; slurm.conf's SlurmctldLogFile and SlurmdLogFile (slurmd-%n.log)
        log = self.dir / ("munge/munged.log" if name == "munged" else f"log/{name}.log")
        for path in (log, start_log):
            try:
                text = path.read_text(errors="replace").strip().splitlines()
            except OSError:
                continue
            if text:
                return f"{path.name} ends: " + " | ".join(text[-lines:])
        return f"neither {log.name} nor {start_log.name} says anything"

    def _all_idle(self) -> bool:
        done = subprocess.run(
            [_need("sinfo"), "-h", "-N", "-o", "%N %T"],
            env=self.env, capture_output=True, text=True, check=False, timeout=10,
        )  # fmt: skip
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return done.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

    @staticmethod
    def _wait(predicate: object, timeout_s: float, what: str) -> None:
        assert callable(predicate)
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise RuntimeError(f"local Slurm: timed out waiting for {what}")
            time.sleep(0.1)

    # -- state ------------------------------------------------------------------------------

    def _save(self) -> None:
        state = {"nodes": list(self.nodes), "pids": self.pids, "conf": str(self.conf)}
        (self.dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def from_state(cls, dir: Path) -> LocalSlurm:
        """The cluster recorded in ``dir/cluster.json`` by ``start``."""
        state = json.loads((Path(dir) / STATE_FILE).read_text())
        cluster = cls(Path(dir), len(state["nodes"]))
        cluster.pids = {str(k): int(v) for k, v in state["pids"].items()}
        return cluster

    # -- stop -------------------------------------------------------------------------------

    def stop(self, grace_s: float = 5.0) -> list[str]:
        """Cancel every job, end the daemons and every process of the cluster; returns the
        survivors as ``"pid args"`` (empty when nothing is left)."""
        controller = self.pids.get("slurmctld")
        # scancel needs the controller: against a dead one it only retries until its timeout
        # (a second stop, or a start that failed after slurmctld ended).
        if (
            self.conf.exists()
            and controller is not None
            and self._ours(controller)
            and _which("scancel")
        ):
            subprocess.run(
                [_need("scancel"), "--full", "--user", str(os.getuid())], env=self.env,
                capture_output=True, check=False, timeout=30,
            )  # fmt: skip
            self._wait_quietly(lambda: not self._our_processes(jobs_only=True), 5.0)
        order = [n for n in self.pids if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            pid = self.pids.get(name)
            if pid is not None and self._ours(pid):
                _signal(pid, signal.SIGTERM)
                self._wait_quietly(lambda pid=pid: not self._ours(pid), grace_s)
        for pid in self._our_processes():
            _signal(pid, signal.SIGTERM)
        self._wait_quietly(lambda: not self._our_processes(), grace_s)
        for pid in self._our_processes():
            _signal(pid, signal.SIGKILL)
        self._wait_quietly(lambda: not self._our_processes(), grace_s)
        return [f"{pid} {_cmdline(pid)}" for pid in self._our_processes()]

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` is alive (not a zombie) and belongs to this cluster: a recorded
        daemon still naming this DIR, or a slurmstepd or job process of this cluster (its
        environment holds this ``SLURM_CONF``). Never a process only naming the DIR in its
        command line (the shell that runs ``stop``)."""
        if _state(pid) in (None, "Z"):
            return False
        if pid in self.pids.values():
            return str(self.dir) in _cmdline(pid)
        env = _environ(pid)
        if f"SLURM_CONF={self.conf}".encode() not in env:
            return False
        return _cmdline(pid).startswith("slurmstepd") or any(
            e.startswith(b"SLURM_JOB_ID=") for e in env
        )

    def _our_processes(self, *, jobs_only: bool = False) -> list[int]:
        """Live processes of this cluster: daemons, slurmstepd and job processes (never this
        process or one it runs under)."""
        daemons = set(self.pids.values())
        mine = _ancestors(os.getpid())
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in mine:
                continue
            pid = int(entry.name)
            if self._ours(pid) and not (jobs_only and pid in daemons):
                found.append(pid)
        return found

    @staticmethod
    def _wait_quietly(predicate: object, timeout_s: float) -> None:
        assert callable(predicate)
        deadline = time.monotonic() + timeout_s
        while not predicate() and time.monotonic() < deadline:
            time.sleep(0.05)


def _need(name: str) -> str:
    path = _which(name)
    if path is None:
        raise RuntimeError(f"{name} not found: {slurm_missing_reason()}")
    return path


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _ancestors(pid: int) -> set[int]:
    """``pid`` and every process it runs under."""
    found = set()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# ----------------------------------------------------------------------------- command line


def _start(args: argparse.Namespace) -> int:
    reason = slurm_missing_reason()
    if reason is not None:
        print(f"local_slurm: {reason}", file=sys.stderr)
        return 2
    base = Path(args.dir)
    if (base / STATE_FILE).exists():
        print(f"local_slurm: {base} holds a cluster; stop it and use a fresh dir", file=sys.stderr)
        return 1
    cluster = LocalSlurm(base, args.nodes)
    try:
        cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"local_slurm: {exc}", file=sys.stderr)
        return 1
    for name, pid in cluster.pids.items():
        print(f"{name}: pid {pid}")
    print(f"export SLURM_CONF={cluster.conf}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    base = Path(args.dir)
    if not (base / STATE_FILE).exists():
        print(f"local_slurm: nothing recorded in {base / STATE_FILE}; nothing to stop")
        return 0
    cluster = LocalSlurm.from_state(base)
    survivors = cluster.stop()
    if survivors:
        print("local_slurm: still running after SIGKILL:", file=sys.stderr)
        for line in survivors:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"stopped munged, slurmctld and {len(cluster.nodes)} slurmd (none left)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``start`` or ``stop`` a local Slurm; the exit status says whether it worked."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start munged, slurmctld and the slurmd nodes")
    start.add_argument("--dir", required=True, help="where keys, configs, state and pids go")
    start.add_argument("--nodes", type=int, default=2, help="how many nodes (n1, n2, ...)")
    stop = sub.add_parser("stop", help="stop the cluster in --dir and verify nothing is left")
    stop.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    return _start(args) if args.command == "start" else _stop(args)


if __name__ == "__main__":
    raise SystemExit(main())
