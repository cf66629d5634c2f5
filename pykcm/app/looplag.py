"""Event-loop lag: how late the one asyncio loop runs a callback that was due.

Everything (informers, queues, workers, the Lease renewal) shares one loop, so anything that
blocks it delays everything: this measures by how much. A task asks to wake every `interval`
seconds and records how much later than asked it actually ran.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import Gauge, Histogram, disable_created_metrics

disable_created_metrics()

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SAMPLE_INTERVAL = 0.1

event_loop_lag = Histogram(
    "pykcm_event_loop_lag_seconds",
    "How much later than due the event loop ran a periodic timer; high values mean something blocked the loop.",
    buckets=LAG_BUCKETS,
)
event_loop_lag_max = Gauge(
    "pykcm_event_loop_lag_max_seconds", "The highest event-loop lag observed since the process started."
)


async def measure_event_loop_lag(
    interval: float = SAMPLE_INTERVAL,
    histogram: Histogram = event_loop_lag,
    maximum: Gauge = event_loop_lag_max,
    on_tick: Callable[[], None] = lambda: None,
) -> None:
    """Run until cancelled, observing each wake-up's lateness (and the highest so far); `on_tick`
    runs at each wake-up (a heartbeat)."""
    highest = 0.0
    while True:
        due = time.monotonic() + interval
        await asyncio.sleep(interval)
        lag = max(0.0, time.monotonic() - due)
        histogram.observe(lag)
        if lag > highest:
            highest = lag
            maximum.set(lag)
        on_tick()
