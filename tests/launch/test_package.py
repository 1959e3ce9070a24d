"""The launch package's names: SSHExecutor (and paramiko behind it) loaded on first use."""

from __future__ import annotations

import subprocess
import sys


def test_the_package_loads_no_paramiko_until_ssh_executor_is_asked_for() -> None:
    # The read commands (leaderboard, best, report) import tuner.launch.megatron_flags, and
    # a local or Slurm study never opens an SSH connection: none of them pays paramiko's import.
    code = (
        "import sys; import tuner.launch, tuner.launch.megatron_flags; "
        "print('paramiko' in sys.modules); from tuner.launch import SSHExecutor; "
        "import tuner.launch.ssh as ssh; print(SSHExecutor is ssh.SSHExecutor); "
        "print('paramiko' in sys.modules); print(tuner.launch.SSHExecutor is SSHExecutor)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True", "True"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    import tuner.launch

    try:
        tuner.launch.NoSuchExecutor  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchExecutor" in str(exc)
    else:
        raise AssertionError("an unknown name was given a value")
