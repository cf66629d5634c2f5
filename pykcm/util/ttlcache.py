"""A small expiring map with bounded size, for caching review answers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """A small expiring map; the oldest entry goes when full, so memory stays bounded."""

    def __init__(self, ttl: float, size: int = 4096, clock: Callable[[], float] = time.monotonic):
        self.ttl = ttl
        self.size = size
        self._clock = clock
        self._entries: dict[K, tuple[float, V]] = {}

    def get(self, key: K, default: Any = None) -> Any:
        entry = self._entries.get(key)
        if entry is None:
            return default
        if entry[0] <= self._clock():
            del self._entries[key]
            return default
        return entry[1]

    def put(self, key: K, value: V) -> None:
        self._entries.pop(key, None)
        if len(self._entries) >= self.size:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = (self._clock() + self.ttl, value)
