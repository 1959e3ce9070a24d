"""The frame lines of the framework probe's node logs (``TUNER_STACK_POINT <k> <word>``) when
another process's output runs into one: one :class:`LaunchError` quoting it, never a
traceback, a point that is none, or a point's lines left unread."""

from __future__ import annotations

import pytest

from tuner.errors import LaunchError
from tuner.profile.probe_logs import ended, split_points

WHOLE = "TUNER_STACK_POINT 0 start\na\nTUNER_STACK_POINT 0 end rc=0\n"


@pytest.mark.parametrize(
    "garbled",
    [
        "TUNER_STACK_POINT x start",  # was int()'s ValueError: a traceback out of tune profile
        "TUNER_STACK_POINT \uff14 start",  # a full-width 4: was point 4
        "TUNER_STACK_POINT 1 startTUNER_STACK_POINT 2 start",  # was point 1's lines unread
        "TUNER_STACK_POINT 1[rank0]: iteration 3 start",
        "TUNER_STACK_POINT",
    ],
)
def test_a_garbled_frame_line_is_one_error_quoting_it(garbled: str) -> None:
    log = WHOLE + garbled + "\nb\n"
    for read in (split_points, ended):
        with pytest.raises(LaunchError, match="a garbled TUNER_STACK_POINT line") as raised:
            read(log)
        assert repr(garbled[:80]) in str(raised.value) and "\n" not in str(raised.value)


def test_a_frame_line_still_being_written_is_not_read_yet() -> None:
    """The watch reads the logs while the probe writes them: a last frame line without its
    line break is not garbled, only not whole yet; a content line is kept as it was."""
    assert ended(WHOLE + "TUNER_STACK_POINT 1 st") == 1
    assert split_points(WHOLE + "TUNER_STACK_POINT 1 start\nc") == {0: "a\n", 1: "c\n"}
