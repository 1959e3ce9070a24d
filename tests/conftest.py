"""Fixtures shared by the test modules of the study loop."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tests.postgres import PostgresServer, missing_reason


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server for the module (skipped where none can run here)."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server


@pytest.fixture(autouse=True)
def _collector_unfrozen() -> Iterator[None]:
    """A read command run in this process (``tuner.cli.exiting``) freezes what is alive when
    it returns, as its process then ends: the next test gets the collector back whole."""
    yield
    gc.unfreeze()
