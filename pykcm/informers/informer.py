"""A shared informer: one reflector and one cache for a resource, fanned out to many handlers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pykcm.client.protobuf import PROTOBUF, Projected, WatchDecoder, supports
from pykcm.client.resources import PODS, Resource
from pykcm.client.rest import RestClient
from pykcm.informers import metrics
from pykcm.informers.delta_queue import Delta, DeltaQueue, DeltaType
from pykcm.informers.projection import FULL, Projection, covers, project, union
from pykcm.informers.reflector import Reflector, strip_managed_fields
from pykcm.informers.store import DeletedFinalStateUnknown, Indexer, IndexFunc, Obj, object_key
from pykcm.util import memory
from pykcm.util.errors import described
from pykcm.util.log import get_logger, one_line
from pykcm.util.timeslice import TimeSlice

log = get_logger("informer")

MIN_RESYNC_PERIOD = 1.0  # client-go raises smaller handler resync periods to 1 s
# A relist or resync hands the loop back after this many objects, or sooner when its handlers take
# a time slice (util/timeslice.py), so workers, watches and the Lease renewal keep running while a
# large cache is rebuilt or replayed.
CHUNK = 500

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
    def __init__(self, client: RestClient, resource: Resource, default_resync: float = 0.0,
                 watch_list: bool = True) -> None:
        self.resource = resource
        self.default_resync = default_resync
        self.indexer = Indexer()
        self._deltas = DeltaQueue()
        # What the cache keeps of each object (projection.py): the union of what the informer's
        # users asked for through `keep`; whole objects until someone asks.
        self.projection: Projection | None = FULL
        self._projection_set = False
        self.reflector = Reflector(client, resource, self._deltas, transform=self._transform, watch_list=watch_list)
        self._handlers: list[Registration] = []
        self._synced = asyncio.Event()
        self._resync_wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._slice = TimeSlice()
        # The resourceVersion the cache (and every handler) has caught up to: client-go's
        # LastSyncResourceVersion of the store, moved by lists, events and bookmarks alike.
        self._synced_resource_version = ""
        self._apply_error: str | None = None  # why the last list could not be applied to the cache
        labels = (metrics.INFORMER_NAME, resource.group, resource.version, resource.plural)
        metrics.informer_queued_items.labels(*labels).set_function(self._deltas.__len__)  # read at scrape
        self._processing_latency = metrics.informer_processing_latency.labels(*labels)
        self._store_resource_version = metrics.informer_store_resource_version.labels(*labels)

    # -- configuration --------------------------------------------------------------------------------

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        self.indexer.add_indexers(indexers)

    def keep(self, fields: Projection | None = FULL) -> None:
        """Widen what the cache keeps by `fields` (FULL: whole objects). Before start only: objects
        already cached could not grow the fields asked for."""
        widened = fields if not self._projection_set else union(self.projection, fields)
        if self.started and not covers(self.projection, widened):
            raise RuntimeError(f"informer for {self.resource.name} already started; cannot keep more fields")
        self.projection, self._projection_set = widened, True

    def _transform(self, obj: Obj) -> Obj:
        # A relist brings back mostly objects the cache already holds at the same resourceVersion
        # (the same content): keep the cached one and drop the new one at once, so a relist costs
        # neither a projection per object nor a second cache that would outlive it in memory.
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        cached = self.indexer.get(object_key(obj)) if rv else None
        if cached is not None and cached["metadata"].get("resourceVersion") == rv:
            return cached
        if type(obj) is Projected:  # decoded into the projection already (client/protobuf.py)
            return obj
        # managedFields never: a projection keeping `metadata` whole would keep them (the protobuf one cannot)
        obj = strip_managed_fields(obj)
        return obj if self.projection is None else project(obj, self.projection)

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
        return None if self.has_synced() else self.reflector.last_error or self._apply_error

    def last_sync_resource_version(self) -> str:
        return self._synced_resource_version

    @property
    def started(self) -> bool:
        return bool(self._tasks)

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._tasks:
            return
        self.reflector.watch_decoder = self._watch_decoder()
        self._tasks = [
            asyncio.create_task(self.reflector.run(), name=f"reflector {self.resource.name}"),
            asyncio.create_task(self._process(), name=f"informer {self.resource.name}"),
            asyncio.create_task(self._resync_loop(), name=f"resync {self.resource.name}"),
        ]

    def _watch_decoder(self) -> WatchDecoder | None:
        """Protobuf for the pods watch where asked for (`--kube-api-content-type`) and the fields
        the cache keeps can be read from it; JSON otherwise."""
        if self.reflector.client.config.content_type != PROTOBUF or self.resource != PODS:
            return None
        if self.projection is None or not supports(self.projection):
            log.info("Watching as JSON: the cache keeps fields not read from protobuf", resource=self.resource.name)
            return None
        log.info("Watching as protobuf", resource=self.resource.name)
        return WatchDecoder(self.projection)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # -- delta processing -----------------------------------------------------------------------------

    async def _process(self) -> None:
        while True:
            idle = not self._deltas
            delta = await self._deltas.pop()  # does not suspend while deltas are queued
            if idle:  # a burst after a wait starts a slice of its own: applied in one turn where it fits
                self._slice.restart()
            started = time.perf_counter()
            await self._apply_logged(delta)
            self._processing_latency.observe(time.perf_counter() - started)
            metrics.informer_objects_by(self.resource.name).set(len(self.indexer))
            if self._slice.over():  # a burst of watch events: their handlers' cost is not bounded
                await self._slice.pause()

    async def _apply_logged(self, delta: Delta) -> None:
        """`_apply_yielding`, its failure logged; a list that cannot be applied is why this informer
        has not synced (sync_error(), on /healthz)."""
        try:
            await self._apply_yielding(delta)
        except Exception as err:  # not a handler's (_call logs those): an object the cache cannot take
            log.error(err, "Applying a change to the cache failed", resource=self.resource.name,
                      type=delta.type.name)
            if delta.type is DeltaType.REPLACED:
                self._apply_error = f"applying the list failed: {one_line(err)}"
        else:
            if delta.type is DeltaType.REPLACED:
                self._apply_error = None

    async def _apply_yielding(self, delta: Delta) -> None:
        """`_apply`, handing the loop back between chunks of a relist."""
        for _ in self._steps(delta):
            await self._slice.pause()

    def _apply(self, delta: Delta) -> None:
        for _ in self._steps(delta):
            pass

    def _steps(self, delta: Delta) -> Iterator[None]:
        if delta.type is DeltaType.REPLACED:
            yield from self._replace(delta.payload)
        else:
            self._apply_to_cache(delta)
        if delta.resource_version:
            self._synced_resource_version = delta.resource_version
            if (value := metrics.store_resource_version_value(delta.resource_version)) is not None:
                self._store_resource_version.set(value)

    def _apply_to_cache(self, delta: Delta) -> None:
        if delta.type is DeltaType.BOOKMARK:
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

    def _replace(self, items: list[Obj]) -> Iterator[None]:
        """Reconcile the cache with a full list: adds, updates, and tombstones for what vanished.

        The new cache is built aside, yielding every CHUNK objects, and swapped in at once, so a
        reader sees either the old list or the new one; then the handlers hear about the
        differences, again in chunks.
        """
        staged = self.indexer.empty_copy()
        for i, obj in enumerate(items, 1):
            staged.upsert(obj)
            if i % CHUNK == 0 or self._slice.over():
                yield
        old = self.indexer.swap(staged)
        del staged  # now the old cache, held only until the handlers have heard about it
        memory.settle()  # the new cache is long-lived: keep the collector from scanning it
        step = 0
        for key, last in old.items():
            if key not in self.indexer:
                self._dispatch_delete(DeletedFinalStateUnknown(key, last))
                step += 1
                if step % CHUNK == 0 or self._slice.over():
                    yield
        for i, obj in enumerate(items, 1):
            previous = old.get(object_key(obj))
            # Every object that was cached is an update, changed or not, as client-go's Replaced
            # deltas: KCM's ReplicaSet handler re-enqueues on it, so a ReplicaSet in a long error
            # backoff is synced again after a relist (handlers that want changes compare versions).
            if previous is None:
                self._dispatch_add(obj)
            else:
                self._dispatch_update(previous, obj)
            if i % CHUNK == 0 or self._slice.over():
                yield
        if old:
            # A relist's old cache: the handlers have heard of it, its memory can go back. Freed in
            # chunks: 150,000 changed pods take 0.3 s to free, one step of the loop if dropped at once.
            while old:
                for _ in range(min(CHUNK, len(old))):
                    old.popitem()
                if old:
                    yield
            memory.return_freed()
        if not self._synced.is_set():
            log.v(2).info("Informer synced", resource=self.resource.name, items=len(self.indexer))
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
                    for i, obj in enumerate(self.indexer.list(), 1):
                        _call(reg.on_update, obj, obj)
                        if i % CHUNK == 0 or self._slice.over():
                            await self._slice.pause()


def _call(func: Callable[..., Any] | None, *args: Any) -> None:
    if func is None:
        return
    try:
        func(*args)
    except Exception as err:
        log.error(described(err), "Event handler failed", handler=getattr(func, "__qualname__", repr(func)))
