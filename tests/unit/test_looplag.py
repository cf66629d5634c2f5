"""The event-loop lag histogram sees a loop that was blocked."""

from __future__ import annotations

import asyncio
import contextlib
import time

from prometheus_client import CollectorRegistry, Histogram

from pykcm.app.looplag import LAG_BUCKETS, measure_event_loop_lag


async def test_a_blocked_loop_shows_as_lag() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("lag_seconds", "test", buckets=LAG_BUCKETS, registry=registry)
    task = asyncio.create_task(measure_event_loop_lag(interval=0.02, histogram=histogram))
    await asyncio.sleep(0.1)  # a few on-time samples
    time.sleep(0.3)  # block the loop, as a long synchronous step would
    await asyncio.sleep(0.1)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    count = registry.get_sample_value("lag_seconds_count")
    under_quarter_second = registry.get_sample_value("lag_seconds_bucket", {"le": "0.25"})
    assert count is not None and count >= 3
    assert under_quarter_second is not None and under_quarter_second == count - 1  # exactly one late wake-up
