"""Go's time.Duration as text: written as Duration.String() writes it (as klog shows it in KCM's logs),
and parsed as time.ParseDuration parses it (as KCM's duration flags take it)."""

from __future__ import annotations

from collections.abc import Callable

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


# Go's time.ParseDuration, on integer nanoseconds: both spellings of micro (U+00B5, U+03BC).
_UNIT_NS = {"ns": 1, "us": 1_000, "\u00b5s": 1_000, "\u03bcs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
            "m": 60_000_000_000, "h": 3_600_000_000_000}
_GO_MAX_NS, _GO_MAX = (1 << 63) - 1, "2562047h47m16.854775807s"  # time.Duration's maximum
_DIGITS = "0123456789"


class DurationError(ValueError):
    """Text that Go's time.ParseDuration refuses; the message is one line, for the user. `unit` says
    which of Go's errors it is: None "invalid duration", "" "missing unit", else "unknown unit"."""

    def __init__(self, message: str, unit: str | None = None) -> None:
        super().__init__(message)
        self.unit = unit


def parse_duration(text: str) -> float:
    """Go's time.ParseDuration: `15s`, `5m`, `1h30m`, `-1.5h`, `0`; returns seconds. What Go refuses
    is refused: a number without unit, spaces, more than time.Duration holds (about 292 years)."""
    value, negative = text, text[:1] == "-"
    if value[:1] in ("-", "+"):
        value = value[1:]
    if value == "0":
        return 0.0
    if not value:
        raise DurationError(f"invalid duration {text!r}")
    total = 0
    while value:
        whole, value = _split_while(value, lambda c: c in _DIGITS)
        fraction = ""
        if value[:1] == ".":
            fraction, value = _split_while(value[1:], lambda c: c in _DIGITS)
        unit, value = _split_while(value, lambda c: c not in _DIGITS and c != ".")
        if not (whole or fraction) or unit not in _UNIT_NS:
            raise DurationError(f"invalid duration {text!r} (use Go syntax such as 15s, 5m, 1h30m)",
                                unit if whole or fraction else None)
        if len(whole.lstrip("0")) > 19:  # more than Go's uint64 holds; int() would take its time
            total = _GO_MAX_NS + 2
            break
        fraction = fraction[:19]  # Go stops adding digits where nanoseconds end
        total += int(whole or 0) * _UNIT_NS[unit] + int(fraction or 0) * _UNIT_NS[unit] // 10 ** len(fraction)
    if total > _GO_MAX_NS + negative:
        raise DurationError(f"invalid duration {text!r}: more than Go's maximum, {_GO_MAX}")
    return (-total if negative else total) / 1e9


def _split_while(text: str, keep: Callable[[str], bool]) -> tuple[str, str]:
    """`text` cut after its longest prefix whose characters `keep` accepts."""
    end = 0
    while end < len(text) and keep(text[end]):
        end += 1
    return text[:end], text[end:]
