"""Loopback SSH "nodes" for tests and benchmarks: the dev tool ``tools/loopback_sshd.py``.

Each node is a real sshd on its own address 127.0.0.x with its own host key; one client key is
authorised everywhere. The cluster gets an ssh config (node-k -> 127.0.0.x:port) and a
known_hosts file, so the executor is exercised exactly as it would be on a real cluster. The set-up
lives in the tool (``make demo-ssh`` uses it too); this module only re-exports it.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # tools/ is not part of the installed package
    sys.path.insert(0, str(REPO))

from tools.loopback_sshd import (  # noqa: E402
    LoopbackCluster,
    Node,
    descendants,
    end_tree,
    keygen,
    login_problem,
    sshd_missing_reason,
)

_keygen = keygen

__all__ = [
    "LoopbackCluster",
    "Node",
    "_keygen",
    "descendants",
    "end_tree",
    "keygen",
    "login_problem",
    "sshd_missing_reason",
]
