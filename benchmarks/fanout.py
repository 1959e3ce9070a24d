"""Fan-out: start one trial on 32 loopback SSH nodes and cancel it, and time both.

    python benchmarks/fanout.py [--nodes 32] [--rounds 3]

Starts sshd on 127.0.0.2 ... 127.0.0.33 (needs root and openssh-server), then per round: submit a
trial whose every node prints a line and sleeps, until every node's log shows the line ("started":
all running), then cancel it until every process is gone and verified ("gone"). Round 1 includes
opening the 32 SSH connections; later rounds reuse them. Targets: started < 2 s, gone < 5 s.

Every remote command starts the login user's shell, and bash sources ~/.bashrc for commands run by
sshd: a .bashrc running `pyenv init` or `conda init` costs ~0.35 s of CPU per command, which 32
"nodes" sharing one small machine pay in series. ``--user`` logs in as another existing user (e.g.
one whose shell is /bin/sh, password field not locked) to measure tuner's own fan-out.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.launch.sshd import LoopbackCluster, sshd_missing_reason  # noqa: E402
from tuner.launch import LaunchRequest, SSHExecutor  # noqa: E402
from tuner.layout import ResultsLayout  # noqa: E402
from tuner.spec.study import SSHSpec  # noqa: E402

SCRIPT = "echo running on $(hostname) pid $$\nsleep 600 & sleep 601\n"


def one_round(
    ex: SSHExecutor, layout: ResultsLayout, hosts: tuple[str, ...], n: int
) -> tuple[float, float]:
    # The nodes' trial directory: a separate tree, writable by the --user login.
    node_dir = layout.rebase(layout.root.parent / "nodes").trial(n).dir
    request = LaunchRequest(
        trial=n,
        hosts=hosts,
        scripts=(SCRIPT,) * len(hosts),
        paths=layout.trial(n),
        node_dir=str(node_dir),
    )
    t0 = time.monotonic()
    job = ex.submit(request)
    logs = [request.paths.node_log(k) for k in range(len(hosts))]
    while not all(p.exists() and "running on" in p.read_text() for p in logs):
        if job.poll() is not None:
            raise RuntimeError(f"trial ended early: {job.result()}")
        time.sleep(0.02)
    started = time.monotonic() - t0
    t1 = time.monotonic()
    job.cancel()  # raises if anything survives the verification scan
    gone = time.monotonic() - t1
    result = job.result()
    assert result is not None and result.cancelled and not result.survivors
    return started, gone


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--user",
        default="",
        help="log in as this (existing) user; its shell's rc files run once per remote command",
    )
    args = parser.parse_args()
    reason = sshd_missing_reason()
    if reason:
        print(f"skipped: {reason}")
        return 2
    with tempfile.TemporaryDirectory(prefix="tuner-fanout-") as tmp:
        base = Path(tmp)
        if args.user:  # the other user reads the key files and writes the trial directory
            base.chmod(0o755)
            (base / "nodes").mkdir()
            (base / "nodes").chmod(0o777)
        with LoopbackCluster(base / "sshd", args.nodes, user=args.user) as cluster:
            spec = SSHSpec(
                config_file=str(cluster.ssh_config), known_hosts=str(cluster.known_hosts)
            )
            layout = ResultsLayout(base / "results", "fanout")
            with SSHExecutor(spec, grace_s=5.0, poll_interval_s=0.02) as ex:
                print(
                    f"{args.nodes} loopback ssh nodes as {cluster.user}, "
                    "target: started < 2 s, gone < 5 s"
                )
                for n in range(args.rounds):
                    started, gone = one_round(ex, layout, cluster.names, n)
                    note = "(connects)" if n == 0 else "(cached connections)"
                    print(f"round {n + 1}: started {started:.2f} s, gone {gone:.2f} s {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
