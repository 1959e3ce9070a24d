"""Running trials on nodes: executors (local, SSH, Slurm) behind one Executor/Job abstraction, the
node pool, preflight checks and launch templates (with the frameworks' flags).

May import: :mod:`tuner.config`, :mod:`tuner.spec` and below. Never a model, the search, the
loop, the report or the CLI: a launcher never sees Optuna.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner import lazy_getattr
from tuner.launch.base import (
    TOKEN_ENV,
    Executor,
    Job,
    JobResult,
    LaunchRequest,
    NodeProcess,
    new_token,
)
from tuner.launch.local import LocalExecutor
from tuner.launch.pool import NodeGroup, NodePool
from tuner.launch.templates import (
    RenderedLaunch,
    TemplateRenderer,
    deepspeed_config,
    render_launch,
)

if TYPE_CHECKING:
    from tuner.launch.ssh import SSHExecutor


__getattr__ = lazy_getattr(__name__, {"SSHExecutor": "tuner.launch.ssh"})
"""``SSHExecutor`` on first use: it imports paramiko (about 0.4 s), which a command that only
reads a study (the leaderboard, the report, ``tune best``) or runs trials on local or Slurm
nodes never needs."""


__all__ = [
    "TOKEN_ENV",
    "Executor",
    "Job",
    "JobResult",
    "LaunchRequest",
    "LocalExecutor",
    "NodeGroup",
    "NodePool",
    "NodeProcess",
    "RenderedLaunch",
    "SSHExecutor",
    "TemplateRenderer",
    "deepspeed_config",
    "new_token",
    "render_launch",
]
