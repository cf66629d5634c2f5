"""API timestamps (metav1.Time): second-precision RFC 3339 in UTC."""

from __future__ import annotations

import datetime
import math
import time


def parse_time(value: str | None) -> float | None:
    """RFC 3339 API timestamp -> Unix seconds; None when absent or unparseable (Go's zero time)."""
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def format_time(seconds: float) -> str:
    """Unix seconds -> the API's second-precision RFC 3339 form (metav1.Time), the year in four
    digits as Go writes it (strftime's %Y gives "1" for year 1)."""
    t = time.gmtime(math.floor(seconds))
    return f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}Z"


def now() -> str:
    """The current time as an API timestamp."""
    return format_time(time.time())
