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
    """Unix seconds -> the API's second-precision RFC 3339 form (metav1.Time), as Go writes it
    for any year: four digits at least, a minus sign before year 0 (time.gmtime overflows far from
    1970, and strftime's %Y gives "1" for year 1)."""
    days, rest = divmod(math.floor(seconds), 86400)
    year, month, day = _civil_from_days(days)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    year_text = f"-{-year:04d}" if year < 0 else f"{year:04d}"
    return f"{year_text}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}Z"


def go_string(value: str) -> str:
    """An API timestamp as Go's %v prints a metav1.Time in an error ("2026-11-27 11:20:00 +0000 UTC");
    as it is when it is no second-precision UTC timestamp."""
    if len(value) < 20 or value[-1] != "Z" or value[-10] != "T":
        return value
    return f"{value[:-10]} {value[-9:-1]} +0000 UTC"


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """The proleptic Gregorian (year, month, day) `days` after 1970-01-01, in whole-number
    arithmetic for any year (Howard Hinnant's days-to-civil, in 400-year eras from 0000-03-01)."""
    shifted = days + 719_468  # days since 0000-03-01
    era = shifted // 146_097
    day_of_era = shifted - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)  # from March 1
    month_from_march = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * month_from_march + 2) // 5 + 1
    month = month_from_march + 3 if month_from_march < 10 else month_from_march - 9
    return year_of_era + era * 400 + (month <= 2), month, day


def now() -> str:
    """The current time as an API timestamp: from integer nanoseconds, truncated as Go truncates
    (time.time()'s float can round the last 240 ns of a second up to the next)."""
    return format_time(time.time_ns() // 1_000_000_000)
