"""The token bucket as golang.org/x/time/rate behaves for client-go: reservations, Allow and cancellation."""

from __future__ import annotations

import asyncio

import pytest

from pykcm.util.flowcontrol import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reservations_queue_up_behind_the_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, 2, clock)
    assert [bucket.reserve() for _ in range(4)] == [0.0, 0.0, pytest.approx(0.1), pytest.approx(0.2)]
    clock.now += 0.2
    assert bucket.reserve() == pytest.approx(0.1)


def test_allow_spends_nothing_when_refused() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1, 1, clock)
    assert bucket.allow()
    assert not bucket.allow()
    clock.now += 0.5
    assert not bucket.allow()
    clock.now += 0.5  # a refusal did not push the next token further out
    assert bucket.allow()


def test_cancelling_the_newest_reservation_gives_its_token_back() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, 1, clock)
    bucket.reserve()
    delay = bucket.reserve()
    bucket.cancel(clock.now + delay)
    assert bucket.reserve() == pytest.approx(0.1)  # as if the cancelled one had never asked


def test_cancelling_keeps_the_tokens_later_reservations_count_on() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, 1, clock)
    bucket.reserve()
    first = clock.now + bucket.reserve()  # due at +0.1
    bucket.reserve()  # due at +0.2, counting on the token before it
    bucket.cancel(first)
    assert bucket.reserve() == pytest.approx(0.3)


def test_a_due_reservation_is_not_given_back() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, 1, clock)
    bucket.reserve()
    due = clock.now + bucket.reserve()
    clock.now += 0.15
    bucket.cancel(due)
    assert bucket.reserve() == pytest.approx(0.05)


async def test_a_cancelled_wait_does_not_delay_the_next_request() -> None:
    bucket = TokenBucket(2, 1)
    await bucket.wait()
    waiter = asyncio.create_task(bucket.wait())
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await bucket.wait() == pytest.approx(0.45, abs=0.05)  # the cancelled 0.5 s slot is free again
