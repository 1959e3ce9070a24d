"""One error hierarchy for the whole package.

Every error that reaches the user is a :class:`TunerError`; the CLI prints its one-line message and
exits 2 (bad input) or 1 (the job failed). Library code never calls ``exit()``.
"""

from __future__ import annotations


class TunerError(Exception):
    """Base class of every error tuner raises on purpose."""

    exit_code: int = 1


class ConfigError(TunerError):
    """A study file, preset or command-line value is wrong.

    ``path`` is the YAML path of the offending field (``space.tp[2]``), or empty when the
    problem is with the whole file. The message always names it.
    """

    exit_code = 2

    def __init__(self, message: str, *, path: str = "", file: str = "") -> None:
        self.path = path
        self.file = file
        where = ""
        if file:
            where = f"{file}: "
        if path:
            where += f"{path}: "
        super().__init__(f"{where}{message}")
        self.reason = message


class UnknownKeyError(ConfigError):
    """A file's mapping holds a key its section has no field for: ``key``, and the ``allowed``
    ones, for a reader that knows where the key does belong (a study: another section)."""

    def __init__(self, key: str, allowed: tuple[str, ...], *, path: str, hint: str = "") -> None:
        self.key = key
        self.allowed = allowed
        super().__init__(f"unknown key {key!r}{hint} (allowed: {', '.join(allowed)})", path=path)


class ValidationError(ConfigError):
    """A parallel configuration breaks one of the framework's own rules."""


class LaunchError(TunerError):
    """A trial could not be rendered or started (template error, missing file, bad executor)."""


class TemplateError(LaunchError):
    """A launch template cannot be read or rendered: the user's own file is wrong (a Jinja
    syntax error, an undefined name, bytes that are not UTF-8), which is bad input."""

    exit_code = 2


class RemoteCommandError(LaunchError):
    """A command on a node failed; carries the host, the command and the tail of its stderr."""

    def __init__(self, host: str, command: str, exit_code: int | None, stderr_tail: str) -> None:
        self.host = host
        self.command = command
        self.remote_exit_code = exit_code
        self.stderr_tail = stderr_tail
        tail = stderr_tail.strip().splitlines()[-1:] if stderr_tail.strip() else []
        detail = f": {tail[0]}" if tail else ""
        super().__init__(f"{host}: command exited with {exit_code}{detail}")


class NodeError(LaunchError):
    """A node could not be reached (connection refused, auth refused, dropped connection)."""

    def __init__(self, host: str, reason: str) -> None:
        self.host = host
        self.reason = reason
        super().__init__(f"{host}: {reason}")


class UnreachableNodes(LaunchError):
    """A job's nodes that could not be reached to end its processes (``Executor.reap_lost``)."""

    def __init__(self, what: str, errors: tuple[tuple[str, str], ...]) -> None:
        self.errors = errors
        """``(host, reason)`` of each node that could not be cleaned up."""
        super().__init__(f"{what}: cannot clean up {'; '.join(f'{h}: {r}' for h, r in errors)}")


class SplitError(Exception):
    """A pipeline split the framework refuses (:mod:`tuner.spec.pipeline_split`,
    :mod:`tuner.spec.deepspeed_partition`): a stable rule id and the framework's own message.

    Not a :class:`TunerError`: it never reaches the user as is; the validity rules report it as
    a rule violation and the per-stage views raise :class:`ValidationError` with its message.
    """

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message


class ParseError(TunerError):
    """A log file could not be read or parsed."""


class StudyError(TunerError):
    """The study storage does not match the spec (changed spec on resume, bad storage URL)."""

    exit_code = 2


class StorageError(TunerError):
    """The study storage failed while the study ran (a full disk, a lost database server); the
    message names the real cause. Finished trials are recovered from their files next time."""
