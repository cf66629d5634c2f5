"""client-go's queue.go on one asyncio event loop: a deduplicating FIFO of keys.

Two sets, ``dirty`` and ``processing``, give the two promises every controller relies on: N adds
while an item waits produce one item, and a key is never handed to two workers at once.

Everything runs on one event loop and no method awaits between reading and updating state, so
there are no locks: each synchronous method is atomic with respect to the others. Metrics
(``pykcm.workqueue.metrics``) are reported only for queues with a non-empty name, as in client-go.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from pykcm.workqueue import metrics
from pykcm.workqueue.metrics import NoMetrics, QueueMetrics

T = TypeVar("T", bound=Hashable)

Clock = Callable[[], float]



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
        self._metrics: NoMetrics = QueueMetrics(name, clock) if name else NoMetrics()
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
        if not self._processing:  # a drain waits for what is in flight, not for what is queued
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

    def in_flight(self) -> list[T]:
        """The items handed to workers and not yet done()."""
        return list(self._processing)

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
