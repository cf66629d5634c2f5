"""client-go's delaying_queue.go: ``add_after`` parks items on a heap until they are due."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time

from pykcm.workqueue.queue import Clock, Queue, T

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
        if len(self._heap) > 2 * len(self._ready_at) + 64:
            # An item re-added ever earlier (a ReplicaSet's availability check) leaves stale entries
            # until their own, later time; client-go fixes the entry in place. Rebuilding at twice
            # the live count keeps the heap O(items) at amortised O(log n) per add.
            self._heap = [entry for entry in self._heap if self._ready_at.get(entry[2]) == entry[0]]
            heapq.heapify(self._heap)
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
