"""Unit tests for pykcm.workqueue: the queue contract controllers rely on.

Delays that must really elapse are a few tens of milliseconds; everything that can be decided
without waiting uses a fake clock.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from prometheus_client import REGISTRY

from pykcm.workqueue import (
    DelayingQueue,
    ItemExponentialFailureRateLimiter,
    Queue,
    RateLimitingQueue,
    metrics,
)

# Generous upper bound for "this should happen soon"; tests finish long before it.
SOON = 2.0


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def queue_name() -> str:
    # Metric children outlive a test; a fresh name keeps each test's samples its own.
    return f"test_{uuid.uuid4().hex[:12]}"


def sample(metric: str, name: str) -> float | None:
    return REGISTRY.get_sample_value(metric, {"name": name})


async def settle() -> None:
    """Let every runnable task take its next step."""
    for _ in range(5):
        await asyncio.sleep(0)


# --- Queue ------------------------------------------------------------------------------------


async def test_adds_while_queued_collapse_into_one_item():
    q: Queue[str] = Queue()
    for _ in range(5):
        q.add("ns/a")
    q.add("ns/b")
    assert len(q) == 2

    assert await q.get() == ("ns/a", False)
    assert await q.get() == ("ns/b", False)
    assert len(q) == 0


async def test_items_come_out_in_fifo_order():
    q: Queue[str] = Queue()
    for key in ["c", "a", "b"]:
        q.add(key)
    assert [(await q.get())[0] for _ in range(3)] == ["c", "a", "b"]


async def test_readd_during_processing_waits_for_done_then_runs_again():
    q: Queue[str] = Queue()
    q.add("a")
    item, _ = await q.get()

    q.add("a")
    assert len(q) == 0, "a key being processed must not be handed out again"

    assert q.in_flight() == ["a"]
    q.done(item)
    assert len(q) == 1 and q.in_flight() == []
    assert await q.get() == ("a", False)
    q.done("a")
    assert len(q) == 0


async def test_done_without_readd_does_not_requeue():
    q: Queue[str] = Queue()
    q.add("a")
    await q.get()
    q.done("a")
    assert len(q) == 0


async def test_done_for_an_item_never_handed_out_is_ignored():
    q: Queue[str] = Queue()
    q.add("a")
    q.done("a")  # a is dirty but not processing: must not be pushed a second time
    assert len(q) == 1


async def test_one_key_is_never_processed_by_two_workers_at_once():
    q: Queue[str] = Queue()
    keys = ["a", "b", "c"]
    active: set[str] = set()
    overlaps: list[str] = []
    handled: dict[str, int] = dict.fromkeys(keys, 0)

    async def worker() -> None:
        while True:
            key, shutdown = await q.get()
            if shutdown:
                return
            assert key is not None
            if key in active:
                overlaps.append(key)
            active.add(key)
            handled[key] += 1
            for _ in range(3):  # hold the key across several loop turns while adds keep coming
                await asyncio.sleep(0)
            active.discard(key)
            q.done(key)

    workers = [asyncio.create_task(worker()) for _ in range(5)]
    for _ in range(50):
        for key in keys:
            q.add(key)
        await asyncio.sleep(0)
    await q.shutdown_with_drain()
    await asyncio.wait_for(asyncio.gather(*workers), SOON)

    assert overlaps == []
    assert all(count >= 1 for count in handled.values())
    assert sum(handled.values()) < 150, "adds while queued must have been collapsed"


async def test_get_blocks_until_an_item_is_added():
    q: Queue[str] = Queue()
    getter = asyncio.create_task(q.get())
    await settle()
    assert not getter.done()

    q.add("a")
    assert await asyncio.wait_for(getter, SOON) == ("a", False)


async def test_cancelled_getter_passes_its_wakeup_on():
    q: Queue[str] = Queue()
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await settle()

    q.add("a")  # wakes the first getter...
    first.cancel()  # ...which leaves before taking the item
    assert await asyncio.wait_for(second, SOON) == ("a", False)
    assert first.cancelled()


async def test_shutdown_wakes_every_blocked_getter():
    q: Queue[str] = Queue()
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await settle()
    assert not any(g.done() for g in getters)

    q.shutdown()
    assert q.shutting_down
    assert await asyncio.wait_for(asyncio.gather(*getters), SOON) == [(None, True)] * 3


async def test_shutdown_still_hands_out_queued_items_then_reports_shutdown():
    q: Queue[str] = Queue()
    q.add("a")
    q.shutdown()
    assert await q.get() == ("a", False)
    assert await q.get() == (None, True)


async def test_adds_after_shutdown_are_ignored():
    q: RateLimitingQueue[str] = RateLimitingQueue(rate_limiter=ItemExponentialFailureRateLimiter(0.001, 1))
    q.shutdown()
    q.add("a")
    q.add_after("b", 0)
    q.add_after("c", 0.01)
    q.add_rate_limited("d")
    await asyncio.sleep(0.03)
    assert len(q) == 0
    assert await q.get() == (None, True)


async def test_item_readded_during_processing_is_still_served_after_shutdown():
    q: Queue[str] = Queue()
    q.add("a")
    await q.get()
    q.add("a")  # dirty again before shutdown
    q.shutdown()
    q.done("a")
    assert await q.get() == ("a", False)


async def test_shutdown_with_drain_waits_for_in_flight_items():
    q: Queue[str] = Queue()
    q.add("a")
    q.add("b")
    await q.get()
    await q.get()

    drain = asyncio.create_task(q.shutdown_with_drain())
    await settle()
    assert q.shutting_down
    assert not drain.done()

    q.done("a")
    await settle()
    assert not drain.done(), "b is still in flight"

    q.done("b")
    await asyncio.wait_for(drain, SOON)


async def test_a_drain_ends_when_nothing_is_in_flight_even_if_the_last_item_was_requeued():
    q: Queue[str] = Queue()
    q.add("a")
    await q.get()
    q.add("a")  # added again while processing: done() queues it once more
    drain = asyncio.create_task(q.shutdown_with_drain())
    await settle()
    q.done("a")
    await asyncio.wait_for(drain, SOON)  # as client-go's Done signals the drain on both paths


async def test_shutdown_with_drain_returns_at_once_when_idle():
    q: Queue[str] = Queue()
    await asyncio.wait_for(q.shutdown_with_drain(), SOON)
    assert q.shutting_down


async def test_shutdown_ends_a_pending_drain():
    q: Queue[str] = Queue()
    q.add("a")
    await q.get()
    drain = asyncio.create_task(q.shutdown_with_drain())
    await settle()
    assert not drain.done()

    q.shutdown()
    await asyncio.wait_for(drain, SOON)


# --- DelayingQueue ------------------------------------------------------------------------------


async def test_add_after_non_positive_delay_adds_now():
    q: DelayingQueue[str] = DelayingQueue()
    q.add_after("a", 0)
    q.add_after("b", -1)
    assert len(q) == 2


async def test_add_after_fires_once_the_delay_has_passed():
    q: DelayingQueue[str] = DelayingQueue()
    q.add_after("a", 0.03)
    await settle()
    assert len(q) == 0

    started = time.monotonic()
    assert await asyncio.wait_for(q.get(), SOON) == ("a", False)
    assert time.monotonic() - started > 0.01


async def test_add_after_fires_in_ready_time_order():
    q: DelayingQueue[str] = DelayingQueue()
    q.add_after("late", 0.06)
    q.add_after("early", 0.02)
    q.add_after("middle", 0.04)
    got = [(await asyncio.wait_for(q.get(), SOON))[0] for _ in range(3)]
    assert got == ["early", "middle", "late"]


async def test_add_after_keeps_the_earlier_deadline():
    q: DelayingQueue[str] = DelayingQueue()
    # A sooner deadline replaces a later one, and wakes the waiting loop early to honour it.
    q.add_after("a", 60)
    await settle()  # the waiting loop is now asleep until the heartbeat
    q.add_after("a", 0.02)
    # A later deadline does not push back an earlier one.
    q.add_after("b", 0.02)
    q.add_after("b", 60)

    got = {(await asyncio.wait_for(q.get(), SOON))[0] for _ in range(2)}
    assert got == {"a", "b"}
    await asyncio.sleep(0.03)
    assert len(q) == 0, "each item waited once: no second copy fires"


async def test_an_item_given_ever_earlier_times_keeps_the_heap_small():
    """A ReplicaSet's availability check re-adds one key a little earlier on every sync: the
    superseded entries must not pile up until their own times (client-go fixes one entry in place)."""
    clock = FakeClock()
    q: DelayingQueue[str] = DelayingQueue(clock=clock)
    for i in range(10_000):
        q.add_after("rs", 60 - i * 0.001)
        q.add_after(f"other-{i % 10}", 30)
    assert len(q._ready_at) == 11
    assert len(q._heap) <= 2 * 11 + 65
    clock.step(60)
    assert q._add_due_items(clock()) is None  # all due: each added once
    assert len(q) == 11
    q.shutdown()


async def test_delayed_item_already_queued_is_deduplicated():
    q: DelayingQueue[str] = DelayingQueue()
    q.add("a")
    q.add_after("a", 0.01)
    await asyncio.sleep(0.03)
    assert len(q) == 1


async def test_shutdown_drops_waiting_items_and_stops_the_waiting_loop():
    q: DelayingQueue[str] = DelayingQueue(name="")
    q.add_after("a", 0.01)
    await settle()
    assert any(t.get_name().startswith("workqueue-delay") for t in asyncio.all_tasks())

    q.shutdown()
    await asyncio.sleep(0.03)
    assert len(q) == 0
    assert not any(t.get_name().startswith("workqueue-delay") for t in asyncio.all_tasks())


# --- metrics ------------------------------------------------------------------------------------


async def test_named_queue_reports_depth_adds_and_durations(queue_name):
    clock = FakeClock()
    q: Queue[str] = Queue(queue_name, clock=clock)
    q.add("a")
    q.add("a")  # duplicate: not counted
    q.add("b")
    assert sample("workqueue_adds_total", queue_name) == 2
    assert sample("workqueue_depth", queue_name) == 2

    clock.step(2.0)
    await q.get()
    assert sample("workqueue_depth", queue_name) == 1
    assert sample("workqueue_queue_duration_seconds_count", queue_name) == 1
    assert sample("workqueue_queue_duration_seconds_sum", queue_name) == pytest.approx(2.0)

    clock.step(3.0)
    q.done("a")
    assert sample("workqueue_work_duration_seconds_count", queue_name) == 1
    assert sample("workqueue_work_duration_seconds_sum", queue_name) == pytest.approx(3.0)


async def test_readd_while_processing_counts_as_depth_until_served_again(queue_name):
    q: Queue[str] = Queue(queue_name)
    q.add("a")
    await q.get()
    q.add("a")
    assert sample("workqueue_depth", queue_name) == 1
    assert sample("workqueue_adds_total", queue_name) == 2
    q.done("a")
    await q.get()
    assert sample("workqueue_depth", queue_name) == 0


async def test_every_add_after_counts_as_a_retry(queue_name):
    q: RateLimitingQueue[str] = RateLimitingQueue(queue_name, rate_limiter=ItemExponentialFailureRateLimiter(0.001, 1))
    q.add_after("a", 0)
    q.add_after("b", 60)
    q.add_after("b", 60)
    q.add_rate_limited("c")
    assert sample("workqueue_retries_total", queue_name) == 4
    q.shutdown()
    q.add_after("d", 0)  # ignored once shutting down, like client-go
    assert sample("workqueue_retries_total", queue_name) == 4


async def test_in_flight_work_shows_in_the_progress_gauges(queue_name):
    clock = FakeClock()
    q: Queue[str] = Queue(queue_name, clock=clock)
    q.add("a")
    await q.get()
    clock.step(3.0)

    # Start times come back on the time.monotonic() scale whatever clock the queue uses.
    [start] = q.processing_start_times()
    assert time.monotonic() - start == pytest.approx(3.0, abs=0.5)
    assert sample("workqueue_longest_running_processor_seconds", queue_name) == pytest.approx(3.0, abs=0.5)
    assert sample("workqueue_unfinished_work_seconds", queue_name) == pytest.approx(3.0, abs=0.5)

    q.done("a")
    assert q.processing_start_times() == []
    assert sample("workqueue_unfinished_work_seconds", queue_name) == 0


async def test_unnamed_queue_reports_nothing():
    q: RateLimitingQueue[str] = RateLimitingQueue(rate_limiter=ItemExponentialFailureRateLimiter(0.001, 1))
    q.add("a")
    q.add_after("b", 0)
    q.add_rate_limited("c")
    await q.get()
    assert q.processing_start_times() == []
    assert q not in metrics.workqueue_progress.queues
    for metric in (
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_retries_total",
        "workqueue_queue_duration_seconds_count",
        "workqueue_unfinished_work_seconds",
    ):
        assert sample(metric, "") is None, metric
    q.shutdown()
