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


def test_master_port_moves_off_a_port_someone_holds() -> None:
    import socket

    ex = LocalExecutor()
    try:
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            taken = held.getsockname()[1]
            port = ex.master_port(("local-0",), taken)
            assert port != taken
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port))  # it really is free
        assert ex.master_port(("local-0",), taken) == taken  # released: preferred again
    finally:
        ex.close()
