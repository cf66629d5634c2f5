"""Long loops on the one event loop hand it back every few milliseconds.

Informers, workers, the secure port and the Lease's mirror share one asyncio loop: a loop over a
large cache (a relist's handlers, a namespace's pods) that never awaits holds all of them. A
count of items is no bound when each item's cost varies (a handler matching a pod against 2,000
ReplicaSets), so the bound is time.
"""

from __future__ import annotations

import asyncio
import time

SLICE = 0.01  # seconds of work between two hand-backs: well under what a probe or a Lease notices


class TimeSlice:
    """`if slice.over(): await slice.pause()` inside a long loop."""

    __slots__ = ("_ends",)

    def __init__(self) -> None:
        self._ends = time.perf_counter() + SLICE

    def over(self) -> bool:
        return time.perf_counter() >= self._ends

    async def pause(self) -> None:
        """Hand the loop back once, then start a new slice."""
        await asyncio.sleep(0)
        self.restart()

    def restart(self) -> None:
        self._ends = time.perf_counter() + SLICE
