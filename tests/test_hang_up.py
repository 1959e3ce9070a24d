"""SIGHUP, sent when the terminal or the ssh session to the login node closes: ``tune`` stops
as on Ctrl-C (the running trials cancelled and recorded ``interrupted``), unless ``nohup`` asked
it to outlive the terminal. Python's default ended the process without unwinding: a trial's
processes (in their own sessions) ran on and its row stayed ``running``."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any, cast

import pytest

from tuner.cli.failure import terminate_as_interrupt
from tuner.study.signals import stop_on_signals


class _Loop:
    """What :func:`stop_on_signals` uses of the study loop."""

    def __init__(self) -> None:
        self.stop_requested: str | None = None

    def request_stop(self, why: str) -> None:
        self.stop_requested = self.stop_requested or why


@pytest.fixture
def hang_up_default() -> Iterator[None]:
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, previous)


def _caught() -> bool:
    """Whether a SIGHUP sent now would reach a handler (checked before one is sent: the default
    would end the test run)."""
    return signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN, None)


@pytest.mark.usefixtures("hang_up_default")
def test_a_hang_up_stops_the_study_loop_as_ctrl_c_does() -> None:
    loop = _Loop()
    with stop_on_signals(cast(Any, loop)):
        assert _caught(), "SIGHUP would end tune run without cleaning up its trials"
        os.kill(os.getpid(), signal.SIGHUP)
    assert loop.stop_requested == "interrupted by SIGHUP"


@pytest.mark.usefixtures("hang_up_default")
def test_a_hang_up_unwinds_a_command_as_ctrl_c_does() -> None:
    """``tune profile --probe``'s job is cancelled on the way out, as on SIGTERM."""
    with pytest.raises(KeyboardInterrupt, match="SIGHUP"), terminate_as_interrupt():
        assert _caught(), "SIGHUP would end tune without cancelling the job it started"
        os.kill(os.getpid(), signal.SIGHUP)
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL


@pytest.mark.usefixtures("hang_up_default")
def test_under_nohup_a_hang_up_is_still_ignored() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with stop_on_signals(cast(Any, _Loop())), terminate_as_interrupt():
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
