"""The event-loop lag histogram sees a loop that was blocked."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

from pykcm.app.looplag import LAG_BUCKETS, BlockedLoopWatch, LoopHeartbeat, measure_event_loop_lag


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


class _StallingPlugin:
    """Stands for a plugin's controller that calls blocking code from its sync."""

    def sync_sleeping(self, seconds: float) -> None:
        time.sleep(seconds)  # a blocking call: the thread waits

    def sync_computing(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # a CPU-bound bug: the thread computes
            pass


def _stall_under_watch(caplog, stall: Callable[[], None]) -> list[logging.LogRecord]:
    """Run `stall` on this thread (the "loop" thread, as it built the watch) without heartbeats."""
    heartbeat = LoopHeartbeat()
    watch = BlockedLoopWatch(heartbeat, after=0.3, period=0.05)
    watch.start()
    with caplog.at_level(logging.INFO, logger="pykcm.event-loop"):
        try:
            stall()
            heartbeat.beat()  # the loop runs again
            time.sleep(0.3)
        finally:
            watch.stop()
    return [r for r in caplog.records if r.name == "pykcm.event-loop"]


def test_a_stalled_loop_is_reported_once_naming_the_blocking_sync_then_its_end(caplog) -> None:
    records = _stall_under_watch(caplog, lambda: _StallingPlugin().sync_sleeping(1.0))
    assert [r.getMessage() for r in records] == ["Event loop blocked", "Event loop runs again"]
    blocked, again = records[0].kv, records[1].kv
    assert blocked["at"].startswith("test_looplag.py:") and blocked["at"].endswith(" in _StallingPlugin.sync_sleeping")
    assert any(frame.endswith(" in _stall_under_watch") for frame in blocked["stack"])
    assert blocked["state"] == "waiting"
    assert 0.3 <= float(blocked["blocked_for"].rstrip("s")) < 1.0
    assert 0.9 <= float(again["blocked_for"].rstrip("s")) < 2.0


def test_a_loop_stalled_by_computation_says_so(caplog) -> None:
    records = _stall_under_watch(caplog, lambda: _StallingPlugin().sync_computing(1.0))
    assert records[0].getMessage() == "Event loop blocked"
    assert records[0].kv["at"].endswith(" in _StallingPlugin.sync_computing")
    assert records[0].kv["state"] == "computing"


def test_a_loop_that_keeps_beating_is_not_reported(caplog) -> None:
    def beating() -> None:
        for _ in range(10):
            time.sleep(0.05)
            heartbeat.beat()

    heartbeat = LoopHeartbeat()
    watch = BlockedLoopWatch(heartbeat, after=0.3, period=0.05)
    watch.start()
    with caplog.at_level(logging.INFO, logger="pykcm.event-loop"):
        beating()
    watch.stop()
    assert not [r for r in caplog.records if r.name == "pykcm.event-loop"]


def _library_call(depth: int) -> None:
    """Stands for a synchronous client library: many frames between a sync and the blocking call."""
    if depth:
        _library_call(depth - 1)
    else:
        time.sleep(0.8)


def test_a_sync_blocked_deep_in_a_library_is_still_named(caplog) -> None:
    async def plugin_sync() -> None:
        _library_call(12)

    async def worker() -> None:
        await plugin_sync()

    records = _stall_under_watch(caplog, lambda: asyncio.run(worker()))
    stack = records[0].kv["stack"]
    assert records[0].kv["at"].endswith(" in _library_call") and "..." in stack
    # The outermost frames are the task's own, ending at its coroutine: what runs the loop is left out.
    assert stack[-2].endswith(" in test_a_sync_blocked_deep_in_a_library_is_still_named.<locals>.plugin_sync")
    assert stack[-1].endswith(" in test_a_sync_blocked_deep_in_a_library_is_still_named.<locals>.worker")
