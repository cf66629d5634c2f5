"""A small expiring map with bounded size, for caching review answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
_MISSING: Any = object()


class TTLCache(Generic[K, V]):
    """A small expiring map; the oldest entry goes when full, so memory stays bounded."""

    def __init__(self, ttl: float, size: int = 4096, clock: Callable[[], float] = time.monotonic):
        self.ttl = ttl
        self.size = size
        self._clock = clock
        self._entries: dict[K, tuple[float, V]] = {}
        self._loading: dict[K, asyncio.Future[V]] = {}

    def get(self, key: K, default: Any = None) -> Any:
        entry = self._entries.get(key)
        if entry is None:
            return default
        if entry[0] <= self._clock():
            del self._entries[key]
            return default
        return entry[1]

    def put(self, key: K, value: V) -> None:
        now = self._clock()
        self._entries.pop(key, None)
        # One TTL for all, so the oldest come first: the expired go (not only when read again), then
        # the oldest if still full.
        while self._entries:
            oldest = next(iter(self._entries))
            if self._entries[oldest][0] > now and len(self._entries) < self.size:
                break
            del self._entries[oldest]
        self._entries[key] = (now + self.ttl, value)

    async def get_or_load(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        """The cached value, else what `load()` gives, cached. Callers asking for a key while it loads
        share that load (Go's cached authenticator uses singleflight so): fifty scrapes at once with
        one token make one TokenReview, not fifty. A failed load is every waiter's error, not cached."""
        value = self.get(key, _MISSING)
        if value is not _MISSING:
            return value
        loading = self._loading.get(key)
        if loading is None:
            loading = self._loading[key] = asyncio.ensure_future(self._load(key, load))
            loading.add_done_callback(lambda done: done.cancelled() or done.exception())  # seen if all left
        return await asyncio.shield(loading)  # a caller that leaves does not cancel the others' load

    async def _load(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        try:
            value = await load()
            self.put(key, value)
            return value
        finally:
            del self._loading[key]
