"""client-go's rate_limiting_queue.go: ``add_rate_limited`` is ``add_after`` with the limiter's
delay; ``forget`` ends an item's backoff."""

from __future__ import annotations

import time

from pykcm.workqueue.delaying_queue import DelayingQueue
from pykcm.workqueue.queue import Clock, T
from pykcm.workqueue.rate_limiters import RateLimiter, default_controller_rate_limiter


class RateLimitingQueue(DelayingQueue[T]):
    """A DelayingQueue whose retries are spaced by a rate limiter.

    The usual worker: on error ``add_rate_limited(key)``; on success ``forget(key)``; always
    ``done(key)``.
    """

    def __init__(
        self,
        name: str = "",
        rate_limiter: RateLimiter | None = None,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(name, clock=clock)
        self.rate_limiter: RateLimiter = default_controller_rate_limiter() if rate_limiter is None else rate_limiter

    def add_rate_limited(self, item: T) -> None:
        """Add item once the rate limiter says it may be retried."""
        self.add_after(item, self.rate_limiter.when(item))

    def forget(self, item: T) -> None:
        """Reset item's failure count. It does not remove item from the queue."""
        self.rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        return self.rate_limiter.num_requeues(item)
