"""API timestamps as Go's metav1.Time writes and reads them."""

import pytest

from pykcm.util.apitime import format_time, go_string, parse_time


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (1_790_000_000.9, "2026-09-21T14:13:20Z"),  # whole seconds, as JSON carries them
        (-315_619_200, "1960-01-01T00:00:00Z"),  # the apiserver takes times before 1970
        (-62_135_596_799, "0001-01-01T00:00:01Z"),  # four digits of year, as Go writes them
        (-0.5, "1969-12-31T23:59:59Z"),  # rounded down, as Go's Time.Unix
    ],
)
def test_format_and_parse(seconds: float, text: str) -> None:
    assert format_time(seconds) == text
    assert parse_time(text) == float(seconds // 1)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-62_167_219_200 - 3600, "-0001-12-31T23:00:00Z"),  # the apiserver takes 0000-01-01T00:00:00+01:00
        (1 << 60, "36534630048-05-13T13:56:16Z"),  # a protobuf client may write it; time.gmtime overflows
    ],
)
def test_years_outside_1_to_9999_as_go_writes_them(seconds: int, text: str) -> None:
    assert format_time(seconds) == text


def test_absent_or_unparseable_is_none() -> None:
    assert parse_time(None) is None and parse_time("") is None and parse_time("yesterday") is None


def test_as_go_prints_a_time_in_an_error() -> None:
    """KCM's "has just been deleted at %v": time.Time's String(), not the API's form."""
    assert go_string("2026-11-27T11:20:00Z") == "2026-11-27 11:20:00 +0000 UTC"
    assert go_string("-0001-12-31T23:00:00Z") == "-0001-12-31 23:00:00 +0000 UTC"
    assert go_string("soon") == "soon"
