"""Durations written as Go's time.Duration.String() writes them, as klog shows them in KCM's logs."""

from __future__ import annotations

_UNITS = ((1_000, "ns"), (1_000_000, "µs"), (1_000_000_000, "ms"))


def go_duration(seconds: float) -> str:
    """1.5 -> `1.5s`, 0.0123 -> `12.3ms`, 3725 -> `1h2m5s`, 0 -> `0s` (to the nanosecond)."""
    ns = round(seconds * 1e9)
    if ns < 0:
        return "-" + go_duration(-seconds)
    if ns == 0:
        return "0s"
    for limit, unit in _UNITS:
        if ns < limit:
            return _decimal(ns, limit // 1000) + unit
    hours, ns = divmod(ns, 3_600_000_000_000)
    minutes, ns = divmod(ns, 60_000_000_000)
    text = _decimal(ns, 1_000_000_000) + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def _decimal(value: int, unit: int) -> str:
    """value / unit with the fraction's trailing zeros dropped: (1500, 1000) -> `1.5`."""
    whole, fraction = divmod(value, unit)
    if not fraction:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{fraction:0{digits}d}".rstrip("0")
