"""One number format per quantity, for every table and line ``tune`` prints (the JSON and CSV
forms keep full precision)."""

from __future__ import annotations

import math

from tuner.space.cost import node_hours as node_hours  # one format, the cost's


def seconds(value: float) -> str:
    """Seconds to four significant digits, never in exponent form: ``1.538``, ``0.01234``,
    ``12.35``, ``1,235``."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    digits = min(max(0, 3 - math.floor(math.log10(abs(value)))), 6)
    return f"{value:,.{digits}f}"


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
