"""Preflight against nodes that never answer: how long `tune run` waits before it says so.

    python benchmarks/preflight_unreachable.py [--nodes 8] [--timeout 3]

Runs itself again inside a network namespace of its own (needs unshare and ip; root, or user
namespaces): half the nodes are addresses routed into the loopback link, where packets to an
address nobody holds are dropped (TCP connect timeout), half are sockets that accept and never
say a word (SSH banner timeout). Prints the preflight's wall time; the nodes are checked at once,
so the target is one ``connect_timeout_s`` plus a fraction of a second, whatever the node count.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.launch.preflight import PreflightChecks  # noqa: E402
from tuner.launch.ssh import SSHExecutor  # noqa: E402
from tuner.spec.study import SSHSpec  # noqa: E402

SETUP = 'ip link set lo up && ip route add 10.77.0.0/24 dev lo && exec "$@"'
INSIDE = "TUNER_BENCH_IN_NETNS"


def measure(nodes: int, timeout_s: float) -> None:
    ports = [2201 + k for k in range(nodes - nodes // 2)]
    listeners = [socket.create_server(("127.0.0.1", p), backlog=16) for p in ports]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "ssh_config"
        config.write_text("".join(f"Host silent-{p}\n  HostName 127.0.0.1\n  Port {p}\n"
                                  for p in ports))  # fmt: skip
        hosts = [f"10.77.0.{2 + k}" for k in range(nodes // 2)] + [f"silent-{p}" for p in ports]
        spec = SSHSpec(config_file=str(config), connect_timeout_s=timeout_s,
                       known_hosts=str(Path(tmp) / "known_hosts"))  # fmt: skip
        with SSHExecutor(spec) as ex:
            t0 = time.monotonic()
            problems = ex.preflight(hosts, PreflightChecks())
            took = time.monotonic() - t0
    for s in listeners:
        s.close()
    assert len(problems) == nodes, problems
    print(f"preflight of {nodes} unreachable nodes ({nodes // 2} dropping packets, "
          f"{len(ports)} silent), connect_timeout_s={timeout_s:g}: {took:.2f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args()
    if os.environ.get(INSIDE):
        measure(args.nodes, args.timeout)
        return
    prefix = ["unshare", "--net"] + (["--map-root-user"] if os.geteuid() != 0 else [])
    env = {**os.environ, INSIDE: "1"}
    command = [*prefix, "sh", "-c", SETUP, "sh", sys.executable, *sys.argv]
    sys.exit(subprocess.run(command, env=env, check=False).returncode)


if __name__ == "__main__":
    main()
