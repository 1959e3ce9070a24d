"""How ``tune`` shows what tuner logs: a warning or error of tuner's own as the command line's
other lines (``tune: warning: ...``), everything else (``-v``'s progress, ``--debug``'s details,
another library's records) with the time, level and logger."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""A progress or debug record, or another library's."""


class LineFormatter(logging.Formatter):
    """``tune: warning: SIGINT: still stopping; ...`` for a tuner warning, as the CLI's other
    messages read (it was ``2026-01-05 10:12:03,114 WARNING tuner.study.loop: SIGINT: ...``);
    a traceback attached to the record (``--debug``) still follows it."""

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        ours = record.name == "tuner" or record.name.startswith("tuner.")
        if ours and record.levelno >= logging.WARNING:
            level = "warning" if record.levelno == logging.WARNING else "error"
            return f"tune: {level}: {record.message}"
        return super().formatMessage(record)
