"""The Slurm executor on a real local Slurm (tools/local_slurm.py): the executor contract, the
batch script (golden file) and Slurm's own states."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.launch import Executor
from tuner.launch.slurm import SlurmExecutor
from tuner.spec import SlurmSpec

from .contract import ExecutorContract
from .slurm import LocalSlurm, local_slurm

__all__ = ["local_slurm"]

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


@pytest.mark.usefixtures("local_slurm")
class TestSlurmExecutor(ExecutorContract):
    hosts = ("slurm-0", "slurm-1")

    def make_executor(self, **kwargs: Any) -> Executor:
        return SlurmExecutor(SlurmSpec(poll_interval_s=0.2), **kwargs)


def test_cluster_is_up(local_slurm: LocalSlurm) -> None:
    assert local_slurm.conf.exists()
