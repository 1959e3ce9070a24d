"""The enumeration pauses the cyclic collector, which finds nothing there: it leaves the
collector as it found it, and a whole enumeration, ranking and stream make no reference cycles
(so nothing waits for a collection while paused)."""

from __future__ import annotations

import gc

import pytest

from tuner.space.collection import paused_collection
from tuner.space.enumerate import enumerate_space
from tuner.space.stream import stream_space
from tuner.spec.file import load_study


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_left_as_found(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with paused_collection():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError), paused_collection():
            raise RuntimeError("inside")
        assert gc.isenabled() is enabled
        enumerate_space(load_study("llama3-8b")).ranked()
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_an_enumeration_makes_no_reference_cycles() -> None:
    spec = load_study("mixtral-8x7b")
    enumerate_space(spec, keep_oom=True).ranked()  # first use: imports, caches
    was = gc.isenabled()
    gc.disable()
    try:
        # Until nothing is left: a collection runs the finalizers and weakref callbacks of what
        # it frees, which may leave garbage of their own (SQLAlchemy's class registry, after a
        # storage an earlier test opened): not the enumeration's.
        while gc.collect():
            pass
        report = enumerate_space(spec, keep_oom=True, fast=False)
        report.ranked()
        report = enumerate_space(spec, keep_oom=True)
        report.ranked()
        stream_space(spec, top=5)
        del report
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()
