"""A stored UTC time as local time (``tuner.study.reader.local_time``) is what ``astimezone``
gives, in zones with and without summer time, half-hour and odd offsets, across their changes
(each second either side), before 1970 and with microseconds."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Iterator

import pytest

from tuner.study.reader import local_time

ZONES = ("UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kolkata",
         "America/St_Johns", "Pacific/Chatham", "Africa/Casablanca")  # fmt: skip
STEADY = ("UTC", "Asia/Kolkata")
"""The zones of :data:`ZONES` without a change of offset in 2025."""


@pytest.fixture
def zone() -> Iterator[None]:
    before = os.environ.get("TZ")
    yield
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


def _astimezone(utc: datetime.datetime) -> datetime.datetime:
    return utc.replace(tzinfo=datetime.UTC).astimezone().replace(tzinfo=None)


def _offset(utc: datetime.datetime) -> datetime.timedelta:
    return _astimezone(utc) - utc


def _changes(start: datetime.datetime, days: int) -> list[datetime.datetime]:
    """The seconds at which the zone's offset changes over ``days`` from ``start`` (half a day
    at a time, then halved down to the second)."""
    out = []
    for h in range(0, 24 * days, 12):
        low, high = start + datetime.timedelta(hours=h), start + datetime.timedelta(hours=h + 12)
        if _offset(low) == _offset(high):
            continue
        while high - low > datetime.timedelta(seconds=1):
            mid = low + (high - low) / 2
            low, high = (mid, high) if _offset(mid) == _offset(low) else (low, mid)
        out.append(high.replace(microsecond=0))
    return out


def _times() -> list[datetime.datetime]:
    """Each second about the zone's changes over a year (where it can go wrong), with and
    without microseconds, a time every ten days, and some before 1970."""
    start = datetime.datetime(2025, 1, 1)
    out = [start + datetime.timedelta(days=10 * d, minutes=7 * d) for d in range(37)]
    for at in _changes(start, 365):
        for s in (-2, -1, 0, 1, 2):
            moment = at + datetime.timedelta(seconds=s)
            out += [moment, moment.replace(microsecond=999_999), moment.replace(microsecond=1)]
    out += [datetime.datetime(1969, 12, 31, 23, 59, 59, 500_000),
            datetime.datetime(1950, 6, 1, 12, 0, 0, 1), datetime.datetime(1970, 1, 1)]  # fmt: skip
    return out


@pytest.mark.skipif(not hasattr(time, "tzset"), reason="zones set through TZ")
def test_local_time_is_astimezones(zone: None) -> None:
    for name in ZONES:
        os.environ["TZ"] = name
        time.tzset()
        times = _times()
        assert len(times) > 40 or name in STEADY, name  # the zone's changes are among them
        got = [local_time(t) for t in times]
        assert got == [_astimezone(t) for t in times], name
        assert all(g is not None and g.tzinfo is None and g.fold == 0 for g in got)
    assert local_time(None) is None
    aware = datetime.datetime(2026, 3, 8, 7, 30, tzinfo=datetime.UTC)
    assert local_time(aware) == _astimezone(aware)
