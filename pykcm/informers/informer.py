"""A shared informer: one reflector and one cache for a resource, fanned out to many handlers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pykcm.client.resources import Resource
from pykcm.client.rest import RestClient
from pykcm.informers import metrics
from pykcm.informers.delta_queue import Delta, DeltaQueue, DeltaType
from pykcm.informers.reflector import Reflector
from pykcm.informers.store import DeletedFinalStateUnknown, Indexer, IndexFunc, Obj, object_key
from pykcm.util.log import get_logger

log = get_logger("informer")

MIN_RESYNC_PERIOD = 1.0  # client-go raises smaller handler resync periods to 1 s

AddFunc = Callable[[Obj], None]
UpdateFunc = Callable[[Obj, Obj], None]
DeleteFunc = Callable[[Obj | DeletedFinalStateUnknown], None]


@dataclass(eq=False)
class Registration:
    """One handler on an informer; the handler's own resync period (0 = none)."""

    on_add: AddFunc | None
    on_update: UpdateFunc | None
    on_delete: DeleteFunc | None
    resync: float
    next_resync: float = field(default=0.0)
    synced: bool = False

    def has_synced(self) -> bool:
        return self.synced


class SharedInformer:
    def __init__(self, client: RestClient, resource: Resource, default_resync: float = 0.0) -> None:
        self.resource = resource
        self.default_resync = default_resync
        self.indexer = Indexer()
        self._deltas = DeltaQueue()
        self.reflector = Reflector(client, resource, self._deltas)
        self._handlers: list[Registration] = []
        self._synced = asyncio.Event()
        self._resync_wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        # The resourceVersion the cache (and every handler) has caught up to: client-go's
        # LastSyncResourceVersion of the store, moved by lists, events and bookmarks alike.
        self._synced_resource_version = ""

    # -- configuration --------------------------------------------------------------------------------

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        self.indexer.add_indexers(indexers)

    def add_event_handler(
        self,
        on_add: AddFunc | None = None,
        on_update: UpdateFunc | None = None,
        on_delete: DeleteFunc | None = None,
        resync: float | None = None,
    ) -> Registration:
        """Register handlers. `resync` None means the factory default; 0 disables periodic replay."""
        period = self.default_resync if resync is None else resync
        if period:
            period = max(period, MIN_RESYNC_PERIOD)
        reg = Registration(on_add, on_update, on_delete, period)
        reg.next_resync = time.monotonic() + period if period else 0.0
        self._handlers.append(reg)
        if self.has_synced():
            # A late handler first hears about everything already cached, as client-go does.
            for obj in self.indexer.list():
                _call(reg.on_add, obj)
            reg.synced = True
        self._resync_wakeup.set()
        return reg

    # -- state ----------------------------------------------------------------------------------------

    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def sync_error(self) -> str | None:
        """Why this informer has not synced yet (its last failed list), or None."""
        return None if self.has_synced() else self.reflector.last_error

    def last_sync_resource_version(self) -> str:
        return self._synced_resource_version

    @property
    def started(self) -> bool:
        return bool(self._tasks)

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._tasks:
            return
        self._tasks = [
            asyncio.create_task(self.reflector.run(), name=f"reflector {self.resource.name}"),
            asyncio.create_task(self._process(), name=f"informer {self.resource.name}"),
            asyncio.create_task(self._resync_loop(), name=f"resync {self.resource.name}"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # -- delta processing -----------------------------------------------------------------------------

    async def _process(self) -> None:
        while True:
            delta = await self._deltas.pop()
            try:
                self._apply(delta)
            except Exception as err:  # a broken handler must not stop the informer
                log.error(err, "Handler failed", resource=self.resource.name)
            metrics.informer_objects.labels(self.resource.name).set(len(self.indexer))

    def _apply(self, delta: Delta) -> None:
        self._apply_to_cache(delta)
        if delta.resource_version:
            self._synced_resource_version = delta.resource_version

    def _apply_to_cache(self, delta: Delta) -> None:
        if delta.type is DeltaType.BOOKMARK:
            return
        if delta.type is DeltaType.REPLACED:
            self._replace(delta.payload)
            return
        obj: Obj = delta.payload
        if delta.type is DeltaType.DELETED:
            self.indexer.delete(object_key(obj))
            self._dispatch_delete(obj)
            return
        old = self.indexer.upsert(obj)
        if old is None:
            self._dispatch_add(obj)
        else:
            self._dispatch_update(old, obj)

    def _replace(self, items: list[Obj]) -> None:
        """Reconcile the cache with a full list: adds, updates, and tombstones for what vanished."""
        fresh = {object_key(obj): obj for obj in items}
        vanished = [(key, self.indexer.get(key)) for key in self.indexer.keys() if key not in fresh]  # noqa: SIM118
        for key, last in vanished:
            self.indexer.delete(key)
            self._dispatch_delete(DeletedFinalStateUnknown(key, last))
        for obj in fresh.values():
            old = self.indexer.upsert(obj)
            if old is None:
                self._dispatch_add(obj)
            elif old.get("metadata", {}).get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                self._dispatch_update(old, obj)
        if not self._synced.is_set():
            log.v(2).info("Informer synced", resource=self.resource.name, items=len(fresh))
            for reg in self._handlers:
                reg.synced = True
            self._synced.set()

    def _dispatch_add(self, obj: Obj) -> None:
        for reg in self._handlers:
            _call(reg.on_add, obj)

    def _dispatch_update(self, old: Obj, new: Obj) -> None:
        for reg in self._handlers:
            _call(reg.on_update, old, new)

    def _dispatch_delete(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        for reg in self._handlers:
            _call(reg.on_delete, obj)

    # -- resync ---------------------------------------------------------------------------------------

    async def _resync_loop(self) -> None:
        """Replay the cache as updates (old == new) to each handler whose resync period elapsed.

        No LIST is made: resync exists so level-triggered controllers re-check their world.
        """
        await self._synced.wait()
        while True:
            periods = [r.next_resync for r in self._handlers if r.resync]
            now = time.monotonic()
            timeout = max(min(periods) - now, 0.0) if periods else None
            self._resync_wakeup.clear()
            try:
                await asyncio.wait_for(self._resync_wakeup.wait(), timeout)
                continue  # a handler was added; recompute the schedule
            except TimeoutError:
                pass
            now = time.monotonic()
            for reg in self._handlers:
                if reg.resync and reg.next_resync <= now:
                    reg.next_resync = now + reg.resync
                    for obj in self.indexer.list():
                        _call(reg.on_update, obj, obj)


def _call(func: Callable[..., Any] | None, *args: Any) -> None:
    if func is None:
        return
    try:
        func(*args)
    except Exception as err:
        log.error(err, "Event handler failed", handler=getattr(func, "__qualname__", repr(func)))
