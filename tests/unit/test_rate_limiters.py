"""Unit tests for pykcm.workqueue's rate limiters and the rate-limiting queue: the retry
back-off controllers get (client-go's DefaultControllerRateLimiter), on a fake clock.
"""

from __future__ import annotations

import asyncio

import pytest

from pykcm.workqueue import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    RateLimitingQueue,
    default_controller_rate_limiter,
)
from tests.unit.test_workqueue import SOON, FakeClock


def test_exponential_backoff_doubles_from_5ms_up_to_the_cap():
    limiter = ItemExponentialFailureRateLimiter()
    delays = [limiter.when("a") for _ in range(25)]
    assert delays[:5] == pytest.approx([0.005, 0.010, 0.020, 0.040, 0.080])
    assert delays[17] == pytest.approx(0.005 * 2**17)  # 655 s, still under the cap
    assert delays[18:] == [1000.0] * 7
    assert limiter.num_requeues("a") == 25


def test_exponential_backoff_survives_huge_failure_counts():
    limiter = ItemExponentialFailureRateLimiter(cap=60)
    for _ in range(5000):
        delay = limiter.when("a")
    assert delay == 60


def test_exponential_backoff_is_per_item_and_reset_by_forget():
    limiter = ItemExponentialFailureRateLimiter()
    limiter.when("a")
    limiter.when("a")
    assert limiter.when("b") == pytest.approx(0.005)
    assert limiter.num_requeues("a") == 2

    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == pytest.approx(0.005)


def test_bucket_limiter_allows_the_burst_then_spaces_by_qps():
    clock = FakeClock()
    limiter = BucketRateLimiter(qps=10, burst=100, clock=clock)
    assert [limiter.when(i) for i in range(100)] == [0.0] * 100
    assert limiter.when("x") == pytest.approx(0.1)
    assert limiter.when("y") == pytest.approx(0.2)

    clock.step(1.0)  # refills 10 tokens, 2 of them already owed
    assert [limiter.when(i) for i in range(8)] == [0.0] * 8
    assert limiter.when("z") == pytest.approx(0.1)
    assert limiter.num_requeues("x") == 0


def test_max_of_limiter_takes_the_longest_delay_and_forwards_forget():
    clock = FakeClock()
    exponential = ItemExponentialFailureRateLimiter(0.001, 1.0)
    limiter = MaxOfRateLimiter(exponential, BucketRateLimiter(qps=1, burst=1, clock=clock))

    assert limiter.when("a") == pytest.approx(0.001)  # bucket had a token
    assert limiter.when("a") == pytest.approx(1.0)  # bucket empty: 1 s beats 2 ms
    clock.step(10)
    assert limiter.when("a") == pytest.approx(0.004)  # the item's own backoff kept counting
    assert limiter.num_requeues("a") == 3

    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert exponential.num_requeues("a") == 0


def test_default_controller_rate_limiter_caps_per_item_backoff():
    limiter = default_controller_rate_limiter(cap=60.0)
    delays = [limiter.when("ns/a") for _ in range(20)]
    assert delays[0] == pytest.approx(0.005)
    assert delays[-1] == 60.0
    assert limiter.num_requeues("ns/a") == 20


def test_default_controller_rate_limiter_bucket_bites_after_100_items():
    limiter = default_controller_rate_limiter()
    for i in range(100):
        assert limiter.when(f"ns/{i}") == pytest.approx(0.005)
    # The 101st distinct item has no failures of its own but the overall bucket is empty.
    # About 0.1 s (one token at 10 qps), less whatever the bucket refilled while we looped.
    assert 0.05 < limiter.when("ns/next") <= 0.1


# --- RateLimitingQueue --------------------------------------------------------------------------


async def test_rate_limited_retries_until_success_then_forget():
    q: RateLimitingQueue[str] = RateLimitingQueue(rate_limiter=ItemExponentialFailureRateLimiter(0.001, 1))
    attempts: list[int] = []

    async def worker() -> None:
        while True:
            key, shutdown = await q.get()
            if shutdown:
                return
            attempts.append(q.num_requeues(key))
            if len(attempts) < 3:
                q.add_rate_limited(key)  # failed: retry with backoff
            else:
                q.forget(key)
                q.shutdown()
            q.done(key)

    q.add("ns/a")
    await asyncio.wait_for(worker(), SOON)
    assert attempts == [0, 1, 2]
    assert q.num_requeues("ns/a") == 0


async def test_rate_limiting_queue_uses_the_default_controller_limiter():
    q: RateLimitingQueue[str] = RateLimitingQueue()
    q.add_rate_limited("a")
    assert q.num_requeues("a") == 1
    assert await asyncio.wait_for(q.get(), SOON) == ("a", False)
    q.shutdown()
