"""Durations in logs as Go's time.Duration.String() writes them."""

from __future__ import annotations

import pytest

from pykcm.app.flagz import pflag_text
from pykcm.util.durations import go_duration


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
