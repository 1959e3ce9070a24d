"""A throwaway PostgreSQL server for storage tests: initdb into a temp dir, start, remove.

Needs the PostgreSQL server binaries (``initdb``, ``pg_ctl``) and the ``psycopg2`` driver. The
server refuses to run as root, so under root it runs as the ``postgres`` system user.
"""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def missing_reason() -> str | None:
    """Why a server cannot be started here, or None."""
    for tool in ("initdb", "pg_ctl"):
        if shutil.which(tool) is None:
            return f"PostgreSQL's {tool} is not installed"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "the psycopg2 driver is not installed"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One server on 127.0.0.1; ``url(db)`` is a SQLAlchemy URL. Use as a context manager."""

    def __init__(self) -> None:
        # Not under pytest's tmp tree: as root that is private to root, and the server runs as
        # the postgres user.
        self.base = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
        self.data = self.base / "data"
        self.port = _free_port()
        self.user = "postgres" if os.geteuid() == 0 else getpass.getuser()

    def _run(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, *cmd], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr or done.stdout}")
        return done

    def __enter__(self) -> PostgresServer:
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", self.user, "--no-sync")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w",
                  "-o", f"-h 127.0.0.1 -p {self.port} -k {self.data}", "start")  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """Create ``name`` and return its URL."""
        import psycopg2

        deadline = time.monotonic() + 30
        while True:
            try:
                conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user,
                                        dbname="postgres")  # fmt: skip
                break
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/{name}"
