"""How a failed copy over SFTP is reported, on a session that refuses everything (no sshd): a
lost connection is the node's failure for both callers; the node's file system refusing a
trial's files is a failed remote command, a file sent to a running job a node error."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
import pytest

from tuner.errors import LaunchError, NodeError, RemoteCommandError
from tuner.launch import LaunchRequest
from tuner.launch.ssh import SSHExecutor
from tuner.layout import ResultsLayout
from tuner.spec.study import SSHSpec


class _Refusing:
    """An SFTP session whose every call raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def refuse(*args: object, **kwargs: object) -> None:
            raise self.exc

        return refuse


class _Connection:
    def __init__(self, exc: BaseException) -> None:
        self.lock = threading.Lock()
        self.exc = exc

    def sftp(self) -> _Refusing:
        return _Refusing(self.exc)


@pytest.mark.parametrize(
    ("exc", "preparing", "sending"),
    [
        (PermissionError(13, "Permission denied"), RemoteCommandError, NodeError),
        (EOFError("closed"), NodeError, NodeError),
        (paramiko.SSHException("gone"), NodeError, NodeError),
    ],
)
def test_a_failed_copy_is_reported_as_each_caller_maps_it(
    exc: BaseException, preparing: type[LaunchError], sending: type[LaunchError],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    ex = SSHExecutor(SSHSpec())
    monkeypatch.setattr(ex, "connection", lambda host: _Connection(exc))
    paths = ResultsLayout(tmp_path, "copy").trial(0)
    request = LaunchRequest(trial=0, hosts=("n0", "n1"), scripts=("true", "true"), paths=paths)
    with pytest.raises(preparing) as prepared:
        ex._prepare_node(request, 1)
    assert prepared.value.host == "n1" and str(exc) in str(prepared.value)
    with pytest.raises(sending) as sent:
        ex.send_files(request, {"go.txt": "3 1\n"})
    assert sent.value.host == "n0" and str(exc) in str(sent.value)
    ex.close()
