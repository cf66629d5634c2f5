"""Work queues for controllers: client-go's ``util/workqueue`` on one asyncio event loop.

The files follow client-go's: ``queue`` (dedup FIFO), ``delaying_queue`` (add after a delay),
``rate_limiters`` and ``rate_limiting_queue`` (retries spaced by backoff), ``metrics``.
"""

from pykcm.workqueue.delaying_queue import DelayingQueue
from pykcm.workqueue.queue import Queue
from pykcm.workqueue.rate_limiters import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    default_controller_rate_limiter,
)
from pykcm.workqueue.rate_limiting_queue import RateLimitingQueue

__all__ = [
    "BucketRateLimiter",
    "DelayingQueue",
    "ItemExponentialFailureRateLimiter",
    "MaxOfRateLimiter",
    "Queue",
    "RateLimiter",
    "RateLimitingQueue",
    "default_controller_rate_limiter",
]
