"""The delta queue between a reflector and its informer.

Deltas come out in arrival order, one per event, as in client-go's RealFIFO: there is no per-key
compaction as in its DeltaFIFO, so every event reaches the handlers. A relist travels as one
Replaced delta so the cache and handlers see it atomically (AtomicFIFO).
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any


class DeltaType(enum.Enum):
    ADDED = "Added"
    UPDATED = "Updated"
    DELETED = "Deleted"
    REPLACED = "Replaced"  # payload: list of objects from a full LIST
    BOOKMARK = "Bookmark"  # payload: None; only moves the cache's resourceVersion forward


@dataclass(slots=True)
class Delta:
    type: DeltaType
    payload: Any
    resource_version: str = ""  # where the cache stands once this delta is applied


class DeltaQueue:
    """An unbounded FIFO of deltas: the reflector pushes without waiting, the informer pops."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Delta] = asyncio.Queue()

    def push(self, type_: DeltaType, payload: Any, resource_version: str = "") -> None:
        self._queue.put_nowait(Delta(type_, payload, resource_version))

    async def pop(self) -> Delta:
        return await self._queue.get()

    def __len__(self) -> int:
        return self._queue.qsize()
