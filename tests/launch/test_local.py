"""The local executor against the executor contract."""

from __future__ import annotations

from typing import Any

from tuner.launch import Executor, LocalExecutor

from .contract import ExecutorContract


class TestLocalExecutor(ExecutorContract):
    hosts = ("local-0", "local-1")

    def make_executor(self, **kwargs: Any) -> Executor:
        return LocalExecutor(**kwargs)

    def test_master_addr_is_loopback(self) -> None:
        assert LocalExecutor().master_addr(self.hosts) == "127.0.0.1"
