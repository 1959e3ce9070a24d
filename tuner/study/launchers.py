"""What the loop launches trials with: the study's template rendered for a node group (the
default launcher) and the executor its cluster section names."""

from __future__ import annotations

from typing import Any

from tuner.config.parallel import ParallelConfig
from tuner.launch.base import LaunchRequest
from tuner.spec.study import StudySpec


def template_launcher(spec: StudySpec, config: ParallelConfig, number: int, group: Any,
                      paths: Any, master_addr: str) -> Any:  # fmt: skip
    """The default :data:`Launcher`: render the study's template for the node group."""
    from tuner.launch import render_launch

    trial_dir = str(paths.dir.resolve())
    rendered = render_launch(
        spec, config, hosts=group.hosts, master_addr=master_addr,
        master_port=group.master_port, trial_dir=trial_dir,
    )  # fmt: skip
    return LaunchRequest(
        trial=number, hosts=tuple(group.hosts), scripts=rendered.scripts, paths=paths,
        files=rendered.files, timeout_s=None,  # the loop sets the config's limit
    )  # fmt: skip


def make_executor(spec: StudySpec) -> Any:
    """The executor the study's cluster section names."""
    from tuner.launch import LocalExecutor, SSHExecutor

    if spec.cluster.executor == "local":
        return LocalExecutor()
    if spec.cluster.executor == "ssh":
        return SSHExecutor(spec.cluster.ssh)
    from tuner.launch.slurm_alloc import make_slurm_executor

    return make_slurm_executor(spec.cluster.slurm, spec.node_names)
