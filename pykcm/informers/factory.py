"""One informer per resource, shared by every controller in the process."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator

from pykcm.client.resources import Resource
from pykcm.client.rest import RestClient
from pykcm.informers.informer import SharedInformer
from pykcm.informers.projection import FULL, Projection
from pykcm.informers.store import IndexFunc
from pykcm.util.log import get_logger

log = get_logger("informers")


def resync_period(min_resync_period: float) -> float:
    """KCM spreads default resyncs over [min, 2*min) so informers don't resync in lock step."""
    return min_resync_period * (1.0 + random.random()) if min_resync_period else 0.0


class SharedInformerFactory:
    def __init__(self, client: RestClient, min_resync_period: float = 12 * 3600.0, watch_list: bool = True) -> None:
        self.client = client
        self.min_resync_period = min_resync_period
        self.watch_list = watch_list  # client-go's WatchListClient gate: stream the initial state
        self._informers: dict[Resource, SharedInformer] = {}
        self._recording: list[SharedInformer] | None = None

    def informer(
        self, resource: Resource, indexers: dict[str, IndexFunc] | None = None, fields: Projection | None = FULL
    ) -> SharedInformer:
        """The shared informer for `resource`, created on first request, plus any extra indexers.
        `fields` is what the caller reads of each object (projection.py); the cache keeps the
        union of every caller's, whole objects if any caller leaves it FULL."""
        informer = self._informers.get(resource)
        if informer is None:
            informer = SharedInformer(self.client, resource, resync_period(self.min_resync_period), self.watch_list)
            self._informers[resource] = informer
        informer.keep(fields)
        if indexers:
            informer.add_indexers(indexers)
        if self._recording is not None and informer not in self._recording:
            self._recording.append(informer)
        return informer

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[SharedInformer]]:
        """Collect the informers requested inside the block (by one controller's constructor), so
        that controller waits for exactly those, as a KCM controller lists its own HasSynced."""
        outer, self._recording = self._recording, []
        try:
            yield self._recording
        finally:
            self._recording = outer

    @property
    def informers(self) -> dict[Resource, SharedInformer]:
        return dict(self._informers)

    def start(self) -> None:
        """Start every informer requested so far; safe to call again after more are requested."""
        for informer in self._informers.values():
            if not informer.started:
                informer.start()

    async def wait_for_cache_sync(self, timeout: float | None = None) -> bool:
        try:
            await asyncio.wait_for(asyncio.gather(*(i.wait_synced() for i in self._informers.values())), timeout)
        except TimeoutError:
            return False
        return True

    async def shutdown(self) -> None:
        await asyncio.gather(*(i.stop() for i in self._informers.values()))
