"""Where a study's storage is: the ``--storage`` URL (or the default SQLite file) resolved,
checked before anything is opened or made, and shown without its password. Kept apart from
:mod:`tuner.study.storage`, which opens what this resolves."""

from __future__ import annotations

import contextlib
import importlib.util
import re
import urllib.parse
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from tuner.errors import StudyError
from tuner.layout import ResultsLayout
from tuner.spec.bounds import LAST_PORT
from tuner.study.driver import connect_args


@dataclass(frozen=True, slots=True)
class StorageURL:
    """Where a study lives, resolved: an SQLAlchemy URL or a journal file path."""

    url: str
    journal: Path | None = None

    @property
    def local_file(self) -> Path | None:
        """The database or journal file when it is a file here (SQLite or journal)."""
        if self.journal is not None:
            return self.journal
        if self.url.startswith("sqlite:///"):
            path, _, query = self.url.removeprefix("sqlite:///").partition("?")
            if path.startswith("file:") and "uri=true" in query.split("&"):  # SQLite's own URI
                return Path(urllib.parse.unquote(urllib.parse.urlsplit(path).path))
            return Path(path)
        return None


def resolve_url(url: str | None, layout: ResultsLayout) -> StorageURL:
    """SQLite under results/ by default; an RDB URL; or a journal file (``*.log``/``journal:``)."""
    if url is None:
        return _checked(StorageURL(f"sqlite:///{layout.storage_path.resolve()}"), None)
    if url.startswith("journal:") or url.endswith((".log", ".journal")):
        if url == "journal:":  # Path("") is "."
            raise StudyError("--storage journal: needs a file: journal:FILE")
        where = StorageURL(url, journal=Path(url.removeprefix("journal:")))
    elif (problem := url_problem(url) or _in_memory(url)) is not None:
        raise StudyError(f"--storage {without_password(url)!r}: {problem}")
    else:
        where = StorageURL(postgres_driver(url))
    return _checked(where, url)


def _checked(where: StorageURL, url: str | None) -> StorageURL:
    """``where``, refused in one line when its file is there but no file: a folder (SQLite
    said "unable to open database file", naming neither), a FIFO (it would block the
    journal's reader for ever)."""
    target = where.local_file
    given = url or where.url
    try:  # stat() raises for a name the system refuses (ENAMETOOLONG)
        if target is None or not target.exists() or target.is_file():
            return where
    except OSError as exc:
        raise StudyError(f"cannot open storage {given[:100]!r}: {exc.strerror or exc}") from None
    if not target.is_dir():
        raise StudyError(f"cannot open storage {given!r}: not a regular file")
    if url is None:  # the default file's name taken by a folder
        raise StudyError(f"cannot open storage {given!r}: {str(target)!r} is a folder, where the "
                         "study's database goes; move it away, or give --storage URL")  # fmt: skip
    name = "study.log" if where.journal is not None else "study.db"
    base, sep, query = given.partition("?")  # sqlite:////d?timeout=5: the file before '?'
    raise StudyError(f"cannot open storage {given!r}: {str(target)!r} is a folder; name a file "
                     f"in it ({base.rstrip('/')}/{name}{sep}{query})")  # fmt: skip


def url_problem(url: str) -> str | None:
    """What in a database URL's host part no driver can read, None if nothing: an IPv6 host's
    '[' not closed (``postgresql://u@[::1``), a port that is no number from 0 to 65535.
    SQLAlchemy said "invalid literal for int() with base 10: ':1'", naming neither."""
    host = url.partition("://")[2].partition("/")[0].partition("?")[0].rpartition("@")[2]
    if host.startswith("["):
        if "]" not in host:
            return "the host's '[' has no closing ']' (an IPv6 host is written [::1])"
        port = host.partition("]")[2].removeprefix(":")
    else:
        port = host.partition(":")[2]
    if port and not (port.isascii() and port.isdigit() and int(port) <= LAST_PORT):
        return f"the port {port!r} is not a number from 0 to {LAST_PORT}"
    return None


def _in_memory(url: str) -> str | None:
    """Why an SQLite database in memory (``sqlite://``, ``sqlite:///:memory:``, a URI's
    ``mode=memory``) cannot hold a study, None for any other URL: ``tune run`` measured into it
    and every trial was gone when it ended, unseen by ``tune leaderboard`` or a second worker."""
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        return None  # the opening's own error names what is wrong
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or not (
        database in ("", ":memory:") or database.startswith("file::memory:")
        or parsed.query.get("mode") == "memory"
    ):  # fmt: skip
        return None
    return (
        "an SQLite database in memory keeps nothing once tune ends; give a file (sqlite:///PATH)"
    )


def check_arguments(where: StorageURL) -> None:
    """Refuse, without connecting (nothing is made), the arguments of a URL that its driver
    would ignore (``sqlite:///x.db?mode=ro``: ``uri=true`` missing) or cannot take
    (``?timeout=abc``): one-line :class:`StudyError`, as opening it says."""
    try:
        with arguments_refused():
            sa.create_engine(where.url, connect_args=connect_args(where.url)).dispose()
    except Exception as exc:  # the dialect's own errors for a bad URL are of many types
        shown = without_password(where.url)
        raise StudyError(f"cannot open storage {shown!r}: {root_cause(exc)}") from None


@contextlib.contextmanager
def arguments_refused() -> Iterator[None]:
    """SQLAlchemy's warning for a URL argument the driver ignores, raised as an error."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "Query string argument", sa.exc.SAWarning)
        yield


def without_password(url: str) -> str:
    """``postgresql://user:secret@host/db`` -> ``postgresql://user:***@host/db``: how a URL is
    shown in a message or a record (a terminal's scroll-back and CI logs keep what is printed)."""
    return re.sub(r"(//[^:/@]+:)[^@]*@", r"\1***@", url)


POSTGRES_DRIVERS = ("psycopg", "psycopg2")
"""PostgreSQL drivers SQLAlchemy knows (each its module's name); which one a bare
``postgresql://`` means is the installed SQLAlchemy's (2.1: psycopg 3, 2.0: psycopg2, which the
``postgres`` extra installs)."""


def postgres_driver(url: str) -> str:
    """A bare ``postgresql://`` URL, with the installed driver named in it where SQLAlchemy's
    default is missing (``No module named 'psycopg'`` with psycopg2 installed by the
    ``postgres`` extra); a :class:`StudyError` when no driver is installed."""
    scheme, sep, rest = url.partition("://")
    if scheme != "postgresql" or not sep:
        return url
    default = sa.dialects.registry.load("postgresql").driver
    for driver in (default, *(d for d in POSTGRES_DRIVERS if d != default)):
        if importlib.util.find_spec(driver) is not None:
            return url if driver == default else f"postgresql+{driver}://{rest}"
    raise StudyError(
        f"cannot open storage {scheme}://...: no PostgreSQL driver is installed "
        "(pip install 'paratune[postgres]' installs psycopg2)"
    )


def root_cause(exc: BaseException) -> str:
    """The first line of the innermost cause: "database or disk is full", not the wrapper's
    "(Background on this error at: ...)"."""
    inner: BaseException = exc
    while True:
        # Not __context__: that is whatever was being handled when it was raised (another
        # trial's file, say), not what made it fail.
        nxt = getattr(inner, "orig", None) or inner.__cause__
        if nxt is None or nxt is inner:
            break
        inner = nxt
    text = str(inner).strip().splitlines()
    return text[0] if text else type(inner).__name__
