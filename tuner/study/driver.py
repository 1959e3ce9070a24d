"""The database driver's arguments for every engine tuner opens on a study's storage URL (the
study's and the node leases'): how long a connection may wait, and how soon a dead one is
noticed. Kept apart from :mod:`tuner.study.storage` so that they are defined once, here."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

CONNECT_TIMEOUT_S = 10
"""Seconds a PostgreSQL server has to answer a new connection. libpq waits for ever by
default: a host that drops packets, or a port where something accepts and never speaks, held
``tune`` without a word; the kernel's own retries give up only after about two minutes."""

SQLITE_BUSY_TIMEOUT_S = 60
"""Seconds an SQLite writer waits for another worker's lock before the write fails."""

LIBPQ_DRIVERS = frozenset({"psycopg2", "psycopg"})
"""SQLAlchemy's PostgreSQL drivers built on libpq, which take libpq's connection parameters
as keyword arguments (pg8000 and asyncpg take others: they are given none)."""

KEEPALIVE = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
             "keepalives_count": 3, "tcp_user_timeout": 60_000}  # fmt: skip
"""libpq's parameters that bound how long a connected server may go silent before the
connection fails (and the worker stops as for any failed write: docs/storage-failures.md).
Without them a host that vanished (powered off, cut off by the network) was noticed by the
kernel's defaults: an idle connection after 2 h 11 min (the first probe after 7,200 s, then 9
at 75 s), a statement in flight after about 15 min of retransmissions (``tcp_retries2``).
Here an idle connection fails after 30 + 3 x 10 = 60 s unanswered, and a statement whose bytes
the server has not acknowledged for 60 s (``tcp_user_timeout``, milliseconds) fails then:
both within two of the default 30 s heartbeats, before the four missed beats after which the
other workers take this one's leases over. A server whose host still answers TCP but whose
process does not (stopped, deadlocked) is not bounded by them."""


def connect_args(url: str) -> dict[str, Any]:
    """The driver's arguments for ``url``: a busy timeout for SQLite; for PostgreSQL through
    libpq a connect timeout and the :data:`KEEPALIVE` bounds. A parameter the URL names itself
    (``?connect_timeout=3&keepalives_idle=5``) is left to the URL: SQLAlchemy would let the
    arguments given here override it."""
    if url.startswith("sqlite"):
        return {"timeout": SQLITE_BUSY_TIMEOUT_S}
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "postgresql" or parsed.get_driver_name() not in LIBPQ_DRIVERS:
        return {}
    ours = {"connect_timeout": CONNECT_TIMEOUT_S, **KEEPALIVE}
    return {k: v for k, v in ours.items() if k not in parsed.query}
