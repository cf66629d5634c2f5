"""Work queues for controllers: client-go's ``util/workqueue`` on one asyncio event loop.

Read top to bottom, the module follows client-go's files:

- ``Queue`` (queue.go): a FIFO of keys with two sets, ``dirty`` and ``processing``. Together they
  give the two promises every controller relies on: N adds while an item waits produce one
  item, and a key is never handed to two workers at once.
- ``DelayingQueue`` (delaying_queue.go): ``add_after`` parks items on a heap until they are due.
- Rate limiters (default_rate_limiters.go): per-item exponential backoff, an overall token
  bucket, and the max of several.
- ``RateLimitingQueue`` (rate_limiting_queue.go): ``add_rate_limited`` = ``add_after`` with the
  limiter's delay; ``forget`` ends an item's backoff.

Everything runs on one event loop and no method awaits between reading and updating state, so
there are no locks: each synchronous method is atomic with respect to the others.

Metrics (``pykcm.metrics``) are reported only for queues with a non-empty name, as in client-go.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

from pykcm import metrics
from pykcm.flowcontrol import TokenBucket

T = TypeVar("T", bound=Hashable)

Clock = Callable[[], float]


# --------------------------------------------------------------------------------------------
# metrics.go
# --------------------------------------------------------------------------------------------


class _NoMetrics:
    """What an unnamed queue reports: nothing."""

    def add(self, item: Hashable) -> None:
        pass

    def get(self, item: Hashable) -> None:
        pass

    def done(self, item: Hashable) -> None:
        pass

    def retry(self) -> None:
        pass

    def processing_start_times(self) -> list[float]:
        return []


class _QueueMetrics(_NoMetrics):
    """client-go's defaultQueueMetrics: depth, adds, time queued, time worked, retries.

    Depth counts dirty items (incremented on every accepted add, decremented on get), so an
    item re-added while it is being processed counts as waiting even before done() requeues it.
    """

    def __init__(self, name: str, clock: Clock) -> None:
        self._clock = clock
        self._depth = metrics.workqueue_depth.labels(name)
        self._adds = metrics.workqueue_adds.labels(name)
        self._queue_duration = metrics.workqueue_queue_duration.labels(name)
        self._work_duration = metrics.workqueue_work_duration.labels(name)
        self._retries = metrics.workqueue_retries.labels(name)
        self._add_times: dict[Hashable, float] = {}
        self._start_times: dict[Hashable, float] = {}

    def add(self, item: Hashable) -> None:
        self._adds.inc()
        self._depth.inc()
        self._add_times.setdefault(item, self._clock())

    def get(self, item: Hashable) -> None:
        now = self._clock()
        self._depth.dec()
        added = self._add_times.pop(item, None)
        if added is not None:
            self._queue_duration.observe(now - added)
        self._start_times[item] = now

    def done(self, item: Hashable) -> None:
        started = self._start_times.pop(item, None)
        if started is not None:
            self._work_duration.observe(self._clock() - started)

    def retry(self) -> None:
        self._retries.inc()

    def processing_start_times(self) -> list[float]:
        # One C-level copy: safe even if a scrape runs on the metrics server's thread.
        return list(self._start_times.values())


# --------------------------------------------------------------------------------------------
# queue.go
# --------------------------------------------------------------------------------------------


class Queue(Generic[T]):
    """A deduplicating FIFO work queue.

    An item is in ``dirty`` from add() until a worker get()s it, and in ``processing`` from get()
    until done(). An add() while the item is processing only marks it dirty; done() then puts it
    back on the FIFO, so the next worker sees it only after the current one has finished.
    """

    def __init__(self, name: str = "", *, clock: Clock = time.monotonic) -> None:
        self.name = name
        self._clock = clock
        self._queue: deque[T] = deque()  # every element is dirty and not processing
        self._dirty: set[T] = set()
        self._processing: set[T] = set()
        self._shutting_down = False
        self._drain = False
        self._getters: deque[asyncio.Future[None]] = deque()
        self._drainers: list[asyncio.Future[None]] = []
        self._metrics: _NoMetrics = _QueueMetrics(name, clock) if name else _NoMetrics()
        if name:
            metrics.workqueue_progress.queues.add(self)

    def add(self, item: T) -> None:
        """Mark item as needing processing."""
        if self._shutting_down or item in self._dirty:
            return
        self._metrics.add(item)
        self._dirty.add(item)
        if item in self._processing:
            return  # done() requeues it
        self._queue.append(item)
        self._wake_one_getter()

    def __len__(self) -> int:
        """Items waiting for a worker (not those being processed). Informational only."""
        return len(self._queue)

    async def get(self) -> tuple[T | None, bool]:
        """Wait for an item; return ``(item, False)``, or ``(None, True)`` once shut down and empty.

        The caller must call done(item) when it has finished with it.
        """
        while not self._queue and not self._shutting_down:
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()  # no-op if we had already been woken
                with contextlib.suppress(ValueError):
                    self._getters.remove(getter)
                # We were woken for an item but are leaving without it: pass the wake-up on.
                if self._queue and not getter.cancelled():
                    self._wake_one_getter()
                raise
        if not self._queue:
            return None, True  # shutting down and nothing left
        item = self._queue.popleft()
        self._metrics.get(item)
        self._processing.add(item)
        self._dirty.discard(item)
        return item, False

    def done(self, item: T) -> None:
        """Finish processing item; if it was added again meanwhile, queue it again."""
        if item not in self._processing:
            # Not handed out by get(): requeueing a dirty item here would put a second copy
            # on the FIFO (client-go would), breaking "one copy per key".
            return
        self._metrics.done(item)
        self._processing.discard(item)
        if item in self._dirty:
            self._queue.append(item)
            self._wake_one_getter()
        elif not self._processing:
            self._wake_drainers()

    def shutdown(self) -> None:
        """Ignore new adds; getters get ``shutdown=True`` once the queue is empty.

        Also ends a pending shutdown_with_drain() without waiting for in-flight items.
        """
        self._drain = False
        self._begin_shutdown()
        self._wake_drainers()

    async def shutdown_with_drain(self) -> None:
        """Ignore new adds and wait until every item handed out by get() is done().

        Workers must keep calling done() after shutdown starts, or this waits forever;
        shutdown() from elsewhere ends the wait early.
        """
        self._drain = True
        self._begin_shutdown()
        while self._processing and self._drain:
            drainer = asyncio.get_running_loop().create_future()
            self._drainers.append(drainer)
            try:
                await drainer
            finally:
                with contextlib.suppress(ValueError):
                    self._drainers.remove(drainer)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def processing_start_times(self) -> list[float]:
        """When each in-flight item was handed out, on the ``time.monotonic()`` scale.

        The progress collector subtracts these from ``time.monotonic()``; translating from the
        queue's own clock keeps its gauges right even for a queue built with another clock.
        """
        starts = self._metrics.processing_start_times()
        if not starts:
            return []
        offset = time.monotonic() - self._clock()
        return [start + offset for start in starts]

    def _begin_shutdown(self) -> None:
        self._shutting_down = True
        # Every blocked getter re-checks: it still takes queued items, else returns shutdown.
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)

    def _wake_one_getter(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():  # skip getters cancelled while waiting
                getter.set_result(None)
                return

    def _wake_drainers(self) -> None:
        for drainer in self._drainers:
            if not drainer.done():
                drainer.set_result(None)


# --------------------------------------------------------------------------------------------
# delaying_queue.go
# --------------------------------------------------------------------------------------------

# Insurance against a missed wake-up or a clock that drifts from the loop's: the waiting loop
# never sleeps longer than this before re-checking the heap (client-go's heartbeat).
_MAX_WAIT = 10.0


class DelayingQueue(Queue[T]):
    """A Queue that can also add an item once a delay has passed.

    Waiting items sit on a heap keyed by ready time; one background task (started on the
    running loop by the first delayed add) sleeps until the earliest is due and adds it.
    An item waits at most once: a second add_after keeps whichever ready time is earlier.
    Waiting items are dropped on shutdown.
    """

    def __init__(self, name: str = "", *, clock: Clock = time.monotonic) -> None:
        super().__init__(name, clock=clock)
        # (ready_at, tie-breaker, item); entries whose ready_at no longer matches _ready_at
        # are stale (the item was given an earlier time) and skipped when they surface.
        self._heap: list[tuple[float, int, T]] = []
        self._ready_at: dict[T, float] = {}
        self._sequence = itertools.count()
        self._wakeup = asyncio.Event()
        self._next_wakeup: float | None = None  # what the waiting loop is sleeping until
        self._waiting_loop_task: asyncio.Task[None] | None = None

    def add_after(self, item: T, delay: float) -> None:
        """Add item after ``delay`` seconds (now if ``delay <= 0``). Call from the event loop."""
        if self.shutting_down:
            return
        self._metrics.retry()  # client-go counts every AddAfter as a retry, delayed or not
        if delay <= 0:
            self.add(item)
            return
        ready_at = self._clock() + delay
        current = self._ready_at.get(item)
        if current is not None and current <= ready_at:
            return  # already due sooner
        self._ready_at[item] = ready_at
        heapq.heappush(self._heap, (ready_at, next(self._sequence), item))
        self._ensure_waiting_loop()
        if self._next_wakeup is None or ready_at < self._next_wakeup:
            self._wakeup.set()

    def shutdown(self) -> None:
        self._stop_waiting_loop()
        super().shutdown()

    async def shutdown_with_drain(self) -> None:
        self._stop_waiting_loop()
        await super().shutdown_with_drain()

    def _ensure_waiting_loop(self) -> None:
        if self._waiting_loop_task is None or self._waiting_loop_task.done():
            self._waiting_loop_task = asyncio.get_running_loop().create_task(
                self._waiting_loop(), name=f"workqueue-delay:{self.name or 'unnamed'}"
            )

    def _stop_waiting_loop(self) -> None:
        if self._waiting_loop_task is not None:
            self._waiting_loop_task.cancel()
            self._waiting_loop_task = None
        self._heap.clear()
        self._ready_at.clear()

    async def _waiting_loop(self) -> None:
        while not self.shutting_down:
            next_ready = self._add_due_items(self._clock())
            timeout = _MAX_WAIT if next_ready is None else min(next_ready - self._clock(), _MAX_WAIT)
            self._next_wakeup = next_ready
            # No await since reading the heap, so clearing here cannot lose a wake-up.
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()

    def _add_due_items(self, now: float) -> float | None:
        """Add every item due by ``now``; return the next ready time, if any item still waits."""
        while self._heap:
            ready_at, _, item = self._heap[0]
            if self._ready_at.get(item) != ready_at:
                heapq.heappop(self._heap)  # stale: superseded by an earlier time
                continue
            if ready_at > now:
                return ready_at
            heapq.heappop(self._heap)
            del self._ready_at[item]
            self.add(item)
        return None


# --------------------------------------------------------------------------------------------
# default_rate_limiters.go
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# rate_limiting_queue.go
# --------------------------------------------------------------------------------------------


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
