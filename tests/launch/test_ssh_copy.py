"""How a failed copy over SFTP is reported, on a session that refuses everything (no sshd): for a
trial's files and for a file sent to a running job alike, a node error; the node's file system
refusing names the folder, a lost or timed-out connection says the copy failed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
import pytest

from tuner.errors import NodeError
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
    ("exc", "says"),
    [
        (PermissionError(13, "Permission denied"), "cannot write files into "),
        (TimeoutError(), "copying files failed: timed out"),
        (EOFError("closed"), "copying files failed: closed"),
        (paramiko.SSHException("gone"), "copying files failed: gone"),
    ],
)
def test_a_failed_copy_is_a_node_error_saying_what_failed(
    exc: BaseException, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = SSHExecutor(SSHSpec())
    monkeypatch.setattr(ex, "connection", lambda host: _Connection(exc))
    paths = ResultsLayout(tmp_path, "copy").trial(0)
    request = LaunchRequest(trial=0, hosts=("n0", "n1"), scripts=("true", "true"), paths=paths)
    with pytest.raises(NodeError) as prepared:
        ex._prepare_node(request, 1)
    assert prepared.value.host == "n1" and says in str(prepared.value)
    with pytest.raises(NodeError) as sent:
        ex.send_files(request, {"go.txt": "3 1\n"})
    assert sent.value.host == "n0" and says in str(sent.value)
    ex.close()
