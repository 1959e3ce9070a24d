"""SIGINT / SIGTERM / SIGHUP during ``tune run``: the study loop stops cleanly instead of dying."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.study.loop import StudyLoop

logger = logging.getLogger("tuner.study.loop")


def stopping_signals() -> tuple[signal.Signals, ...]:
    """The signals that stop a command cleanly: Ctrl-C, ``kill``, and the hang-up sent when the
    terminal or the ssh session to the login node closes. Python's default for SIGHUP ends the
    process without unwinding: a running trial's processes (in their own sessions) ran on and
    its row stayed ``running``. SIGHUP is left alone where it is ignored (``nohup tune run``
    asks to outlive the terminal)."""
    hang_up = signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN
    return (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hang_up else ()))


@contextmanager
def stop_on_signals(loop: StudyLoop) -> Iterator[None]:
    """SIGINT / SIGTERM / SIGHUP (:func:`stopping_signals`) stop the loop cleanly (running
    trials cancelled, marked interrupted).

    A second signal while stopping is noted, not acted on: the cleanup must finish (the
    reapers run in their own sessions, so a terminal's Ctrl-C does not reach them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in stopping_signals()}

    def handler(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if loop.stop_requested is not None:
            logger.warning("%s: still stopping; the running trials are being cleaned up", name)
        loop.request_stop(f"interrupted by {name}")

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        if loop.stop_requested is None:
            for sig, old in previous.items():
                signal.signal(sig, old)
        # else: stopping; a late second Ctrl-C must not kill the process while it closes down
        # (a KeyboardInterrupt while the interpreter joins its threads ends it by SIGINT).
