"""One number format per quantity, for every table and line ``tune`` prints (the JSON and CSV
forms keep full precision)."""

from __future__ import annotations

import math

from tuner.space.cost import node_hours as node_hours  # one format, the cost's

gpu_hours = node_hours
"""GPU-hours as node-hours print (:func:`node_hours`): hours of hardware, never in exponent form
where a CPU demo spends a few GPU-seconds."""


def seconds(value: float) -> str:
    """Seconds to four significant digits, never in exponent form: ``1.538``, ``0.01234``,
    ``12.35``, ``1,235``."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    digits = min(max(0, 3 - math.floor(math.log10(abs(value)))), 6)
    return f"{value:,.{digits}f}"


def duration(seconds: float) -> str:
    """A wall time as a person says it: seconds below a minute to two significant digits
    (``0.3 s``, ``0.034 s``, ``12 s``), minutes below an hour (``1.5 min``, ``12 min``), hours
    from there (``1.4 h``, ``1,234.5 h``); never in exponent form (the report's card said
    ``9.5e-05 h wall``). Every wall time the report and ``tune`` print reads this."""
    if not math.isfinite(seconds):
        return f"{seconds} s"
    if seconds >= 3570:  # 59.5 min and up: never "60 min"
        return f"{seconds / 3600:,.1f} h"
    if seconds >= 59.5:
        minutes = seconds / 60
        return f"{minutes:.1f} min" if minutes < 9.95 else f"{minutes:.0f} min"
    if seconds == 0:
        return "0 s"
    if abs(seconds) < 0.001:  # .2g turns to exponent form below 1e-4
        return "under 0.001 s" if seconds > 0 else f"{seconds:.1e} s"
    return f"{seconds:.2g} s"


def gib(value: float) -> str:
    """GiB with one decimal, or three significant digits below 10 (``8.10``, a CPU demo's
    ``0.106``)."""
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:#.3g}"


def percent(share: float) -> str:
    """A share (0.5635) as a percent with one decimal, without the sign (the header has it)."""
    return f"{share * 100:.1f}"


def rate(value: float) -> str:
    """Tokens per second and other counts per second: whole, with thousands separators."""
    return f"{value:,.0f}"


def tflops(value: float) -> str:
    """TFLOP/s with one decimal."""
    return f"{value:.1f}"


def factor(value: float) -> str:
    """A correction or measured / predicted ratio: ``x1.023``."""
    return f"x{value:.3f}"


def switch(value: bool) -> str:
    """An on/off knob's value as a person says it: ``on`` or ``off`` (never Python's ``True``)."""
    return "on" if value else "off"


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 trial``, ``2 trials``, ``0 configs`` (``many`` for irregular plurals)."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"
