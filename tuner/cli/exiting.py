"""A read command's objects left to the process's exit, not to the cyclic garbage collector.

``tune leaderboard``, ``tune best`` and ``tune report`` build many objects and no reference
cycles (the stored trials, kept for the process by ``tuner.report.leaderboard``; the rows, the
report's views), and the process ends when the command returns. The collector's passes while
it runs find nothing, and the interpreter's last collection at exit walks every object still
alive: at 10,000 stored trials about 0.6 s of ``tune leaderboard``'s CPU and 1 s of
``tune report``'s. So the collector is paused while such a command runs and, when it returns,
what is alive is frozen (``gc.freeze``: left out of every later collection, the exit's
included; memory is still freed by reference counting). Every other command (``tune run``,
hours of a loop that makes and drops cycles) is left as it was.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from tuner.space.collection import paused_collection

READ_COMMANDS = frozenset({"leaderboard", "best", "report"})
"""The commands that read a study, print or write it, and end."""


@contextmanager
def kept_to_exit(command: str) -> Iterator[None]:
    """Run ``command``'s handler with the collector paused and freeze what is alive when it
    returns, for a :data:`READ_COMMANDS` command; as it is for any other."""
    if command not in READ_COMMANDS:
        yield
        return
    with paused_collection():
        yield
        gc.freeze()
