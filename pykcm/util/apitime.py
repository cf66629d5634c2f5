"""API timestamps (metav1.Time): second-precision RFC 3339 in UTC."""

from __future__ import annotations

import datetime
import time

_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def parse_time(value: str | None) -> float | None:
    """RFC 3339 API timestamp -> Unix seconds; None when absent or unparseable (Go's zero time)."""
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def format_time(seconds: float) -> str:
    """Unix seconds -> the API's second-precision RFC 3339 form (metav1.Time)."""
    return datetime.datetime.fromtimestamp(int(seconds), datetime.UTC).strftime(_FORMAT)


def now() -> str:
    """The current time as an API timestamp."""
    return format_time(time.time())
