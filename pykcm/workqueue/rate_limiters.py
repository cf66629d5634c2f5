"""client-go's default_rate_limiters.go: per-item exponential backoff, an overall token bucket,
and the max of several."""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Protocol

from pykcm.util.flowcontrol import TokenBucket
from pykcm.workqueue.queue import Clock


class RateLimiter(Protocol):
    def when(self, item: Hashable) -> float:
        """How long to wait before item may be processed again; records a failure."""
        ...

    def forget(self, item: Hashable) -> None:
        """Stop tracking item, e.g. after it succeeded, so its next failure starts afresh."""
        ...

    def num_requeues(self, item: Hashable) -> int:
        """How many failures are recorded for item."""
        ...


class ItemExponentialFailureRateLimiter:
    """Per-item backoff: ``base * 2**failures`` seconds, capped at ``cap``."""

    def __init__(self, base: float = 0.005, cap: float = 1000.0) -> None:
        self.base = base
        self.cap = cap
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        failures = self._failures.get(item, 0)
        self._failures[item] = failures + 1
        # Long past any sane cap, 2.0**failures would overflow a float; stop growing it.
        return min(self.cap, self.base * 2.0 ** min(failures, 1000))

    def forget(self, item: Hashable) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)


class BucketRateLimiter:
    """One token bucket for all items: bounds the overall retry rate, whatever the item."""

    def __init__(self, qps: float = 10, burst: int = 100, *, clock: Clock = time.monotonic) -> None:
        self._bucket = TokenBucket(qps, burst, clock)

    def when(self, item: Hashable) -> float:
        return self._bucket.reserve()

    def forget(self, item: Hashable) -> None:
        pass

    def num_requeues(self, item: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    """The longest delay any of its limiters asks for. Every limiter sees every call."""

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one limiter")
        self.limiters = limiters

    def when(self, item: Hashable) -> float:
        # A list, not a generator: every limiter must record the failure, not just the first.
        return max([limiter.when(item) for limiter in self.limiters])

    def forget(self, item: Hashable) -> None:
        for limiter in self.limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return max(limiter.num_requeues(item) for limiter in self.limiters)


def default_controller_rate_limiter(cap: float = 1000.0) -> MaxOfRateLimiter:
    """client-go's DefaultControllerRateLimiter: per-item 5 ms doubling to ``cap``, overall 10 qps
    with a burst of 100 (the bucket only bites when many items fail at once)."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, cap),
        BucketRateLimiter(qps=10, burst=100),
    )
