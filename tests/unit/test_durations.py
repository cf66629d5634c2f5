"""Go's time.Duration as text: written as Duration.String() writes it (logs, /flagz), parsed as
time.ParseDuration parses it (duration flags)."""

from __future__ import annotations

import pytest

from pykcm.app.flagz import pflag_text
from pykcm.util.durations import DurationError, go_duration, parse_duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (1e-9, "1ns"),
        (1.5e-6, "1.5µs"),
        (0.0123, "12.3ms"),
        (0.001234567, "1.234567ms"),
        (1, "1s"),
        (1.234567891, "1.234567891s"),
        (60, "1m0s"),
        (90.5, "1m30.5s"),
        (3725, "1h2m5s"),
        (-0.5, "-500ms"),
    ],
)
def test_as_go_writes_it(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


@pytest.mark.parametrize(("given", "shown"), [("500ms", "500ms"), ("90s", "1m30s"), ("2s", "2s"), ("1.5m", "1m30s")])
def test_flagz_shows_a_duration_flag_as_kcms_pflag_does(given: str, shown: str) -> None:
    assert pflag_text("leader-elect-retry-period", given) == shown


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15s", 15.0),
        ("0", 0.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("-1.5h", -5400.0),
        ("+2s", 2.0),
        ("300ms", 0.3),
        ("10us", 10e-6),
        ("10µs", 10e-6),
        ("7ns", 7e-9),
        (".5s", 0.5),
        ("2h45m10.5s", 9910.5),
    ],
)
def test_parse_duration_accepts_go_syntax(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "15", "1d", "5 m", "s", "1h-5m", "--1s", "abc", "1.2.3s", ".s", "+", "\u0661s"])
def test_parse_duration_rejects_what_go_rejects(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


@pytest.mark.parametrize(("text", "seconds"), [
    ("2562047h47m16.854775807s", 9223372036.854775807),  # time.Duration's maximum
    ("-2562047h47m16.854775808s", -9223372036.854775808),  # and its minimum
    ("9223372036s", 9223372036.0),
    ("1.s", 1.0),
    ("10\u03bcs", 10e-6),  # Go's other micro sign
    ("1.0000000001999999999999s", 1.0),  # digits past the nanosecond are dropped
])
def test_parse_duration_accepts_go_durations_to_the_limits(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-9)


@pytest.mark.parametrize("text", [
    "99999999999h", "2562047h47m16.854775808s", "-2562047h47m16.854775809s", "9223372037s", "1" + "0" * 40 + "h",
    "1" + "0" * 5000 + "s",  # no int() of a huge number: a one-line error at once
])
def test_parse_duration_refuses_more_than_go_holds(text: str) -> None:
    # KCM: invalid argument "99999999999h" for "--leader-elect-lease-duration" flag: time: invalid duration ...
    with pytest.raises(DurationError, match=r"more than Go's maximum, 2562047h47m16\.854775807s"):
        parse_duration(text)


@pytest.mark.parametrize("text", [" 15s", "15s ", "\t15s", "15s\n"])
def test_parse_duration_does_not_strip_spaces_as_go_does_not(text: str) -> None:
    # KCM: invalid argument " 15s" for "--leader-elect-lease-duration" flag: time: invalid duration " 15s"
    with pytest.raises(DurationError, match="invalid duration"):
        parse_duration(text)
