"""List, then watch; keep a DeltaQueue fed with every change, relisting when history is gone.

Follows client-go's tools/cache/reflector.go: `Run` is `delayHandler.Until(ListAndWatch)`, so
every end of a list-and-watch (a failed list, an expired watch, a watch that ended with an
error) waits for the next step of one backoff (0.8 s doubling to 30 s, jitter 1.0, starting over
every 2 minutes) before listing again. Inside a list-and-watch, a watch the server closes at its
timeout, or cut after it delivered events, is re-opened at once, and a refused connection or a
429 backs off (same backoff) and watches again from the last resourceVersion without relisting.
WATCH resumes from the last seen resourceVersion with bookmarks and a randomised server timeout.

The initial state comes as client-go 1.36 gets it (its WatchListClient gate, on by default since
1.35; KCM's `--feature-gates=WatchListClient=false` turns it off): a watch with
sendInitialEvents=true streams every object as an ADDED event, then a bookmark annotated
k8s.io/initial-events-end whose resourceVersion is the list's; the objects replace the cache then,
and the same watch goes on. No list page is ever held, and each object is transformed (projected)
as it arrives. Where the server refuses the stream (its WatchList gate off), a paginated LIST
(limit 500) gets the state instead, as client-go falls back.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from pykcm.client.errors import ApiError, Gone, TooManyRequests, TransportError, error_from_status
from pykcm.client.protobuf import UndecodableEvent, WatchDecoder
from pykcm.client.resources import Resource
from pykcm.client.rest import RestClient
from pykcm.informers import metrics
from pykcm.informers.delta_queue import DeltaQueue, DeltaType
from pykcm.informers.store import object_key
from pykcm.util import memory
from pykcm.util.backoff import BackoffManager
from pykcm.util.durations import go_duration
from pykcm.util.log import get_logger, one_line

PAGE_SIZE = 500
WATCH_TIMEOUT_RANGE = (300, 600)  # seconds; spread so watches don't all reconnect together
MIN_WATCH_DURATION = 1.0  # a watch that ends sooner with no events is treated as an error
REPEAT_LOG_INTERVAL = 60.0  # the same failure again within this is logged at -v=4 only
INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the bookmark annotation ending a streamed list
STREAM_YIELD_EVERY = 500  # initial events handled between two hand-backs of the loop
LONG_LIST = 10.0  # seconds: a list or stream taking longer is said, as client-go's trace (LogIfLong)

log = get_logger("reflector")

Transform = Callable[[dict[str, Any]], dict[str, Any]]


def strip_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


class VeryShortWatch(Exception):
    pass


class WatchEndedWithError(Exception):
    """An ERROR event in an open watch (not an expired version nor a 429): client-go's watch loop
    logs it as a warning and lists again after the backoff; a failure to open the watch is its
    watchErrorHandler's "Failed to watch" instead. The same warning again within a minute is said
    at -v=4 only (pykcm's, as for its other repeated failures; client-go says each)."""


class Delay(Protocol):
    def next(self) -> float: ...


def default_backoff() -> BackoffManager:
    """client-go's defaultBackoffInit/Max/Factor/Jitter/Reset."""
    return BackoffManager(0.8, 30.0, factor=2.0, jitter=1.0, reset_interval=120.0)


class Reflector:
    def __init__(
        self,
        client: RestClient,
        resource: Resource,
        deltas: DeltaQueue,
        transform: Transform = strip_managed_fields,
        params: dict[str, str] | None = None,
        backoff: Delay | None = None,
        watch_list: bool = True,
    ) -> None:
        self.client = client
        self.resource = resource
        self.deltas = deltas
        self.transform = transform
        self.params = params or {}  # labelSelector / fieldSelector
        self.last_resource_version = ""
        self._backoff = backoff or default_backoff()
        self.label = resource.name
        # Why the last list-and-watch failed; None once a list succeeds. Until the informer has
        # synced this is why it cannot (a forbidden LIST, say).
        self.last_error: str | None = None
        self._logged: tuple[str, str, float] = ("", "", 0.0)  # message, error, when
        # client-go's WatchListClient gate: KCM hands client-go's gates to its --feature-gates, so
        # the KUBE_FEATURE_WatchListClient variable client-go reads elsewhere does nothing there.
        self.watch_list = watch_list
        # Set by the informer where the watch is read as protobuf (client/protobuf.py); else JSON.
        self.watch_decoder: WatchDecoder | None = None
        # Objects streamed so far while a watch sends its initial events; None when not streaming.
        self._initial: dict[str, dict[str, Any]] | None = None
        self._stream_started = 0.0  # when the watch streaming them was opened

    async def run(self) -> None:
        while True:
            try:
                await self._list_and_watch()
            except asyncio.CancelledError:
                raise
            except Gone as err:
                log.v(4).info("Watch closed", resource=self.label, err=one_line(err))
            except UndecodableEvent as err:
                # One object the protobuf decoder cannot read must not freeze the cache for every
                # other: JSON reads any object the apiserver serves.
                self.watch_decoder = None
                self.last_error = one_line(err)
                log.error(err, "Reading the watch as JSON from now on, will relist", resource=self.label,
                          object=err.key)
            except Exception as err:  # client-go's watchErrorHandler: utilruntime.HandleError
                self.last_error = one_line(err)
                self._report("Failed to watch", self.last_error)
            self._drop_initial()
            await asyncio.sleep(self._backoff.next())

    async def _list_and_watch(self) -> None:
        """Get the state (streamed, or listed), then watch until the watch ends with an error;
        retriable watch failures retry here."""
        memory.collect_before_relist()
        streaming = self.watch_list
        if not streaming:
            await self._list()
        while True:
            try:
                await self._watch(send_initial_events=streaming)
                # The server closed the watch at its timeout: re-watch from where we were (or, if
                # the initial events had not all come, stream them again).
                streaming = self._drop_initial()
                continue
            except (TransportError, TooManyRequests) as err:
                # Unreachable or shedding load: back off and resume the watch, no relist needed.
                # client-go's lines (a TransportError is its refused connection).
                if streaming := self._drop_initial():
                    log.v(2).info("watch-list failed - backing off", resource=self.label, err=one_line(err))
                elif isinstance(err, TooManyRequests):
                    log.v(2).info("Watch returned 429 - backing off", resource=self.label, err=one_line(err))
                else:
                    log.v(4).info("Watch failed - backing off", resource=self.label, err=one_line(err))
            except (VeryShortWatch, WatchEndedWithError) as err:
                self._drop_initial()
                self._report("Warning: watch ended with error", one_line(err), warning=True)
                return
            except ApiError as err:
                if not self._drop_initial() or isinstance(err, Gone):
                    raise
                log.v(4).info("Data couldn't be fetched in watchlist mode, falling back to a regular list",
                              resource=self.label, err=one_line(err))
                streaming = False
                await self._list()
                continue
            await asyncio.sleep(self._backoff.next())

    def _drop_initial(self) -> bool:
        """Whether a watch was streaming its initial events; what it streamed is dropped (not kept
        through the backoff: the next stream sends everything again)."""
        streaming, self._initial = self._initial is not None, None
        return streaming

    def _report(self, message: str, error: str, warning: bool = False) -> None:
        """Log a failure: an error line from the logger utilruntime.HandleError writes with, or (a
        `warning`) client-go's info line; the same one again within a minute only at -v=4 (the
        backoff retries it every few seconds, and a forbidden LIST fails the same way until RBAC changes)."""
        now = time.monotonic()
        last_message, last_error, when = self._logged
        kv = {"resource": self.label} if warning else {"resource": self.label, "logger": "UnhandledError"}
        if (message, error) == (last_message, last_error) and now - when < REPEAT_LOG_INTERVAL:
            log.v(4).info(message, **kv, err=error)
            return
        self._logged = (message, error, now)
        if warning:
            log.info(message, **kv, err=error)
        else:
            log.error(error, message, **kv)

    # -- list -----------------------------------------------------------------------------------------

    async def _list(self) -> None:
        # A consistent list (no resourceVersion), not client-go's "0": at "0" the apiserver answers
        # from its watch cache in one piece and ignores `limit`; a consistent list is paginated, is
        # served from the watch cache too since 1.31, and cannot fail with 410 for an old version.
        started = time.monotonic()
        items, list_rv = await self._paged_list(self.resource.path())
        self._replace(items, list_rv, "Reflector ListAndWatch", started)

    def _replace(self, items: list[dict[str, Any]], rv: str, trace: str, started: float) -> None:
        """The state as of `rv`, got since `started`, replaces the cache."""
        took = time.monotonic() - started
        if took >= LONG_LIST:
            # client-go's trace, written only from -v=2 (utils/trace's Log) and on several lines: here one.
            log.v(2).info(trace, resource=self.label, items=len(items), duration=go_duration(took))
        metrics.informer_relists.labels(self.label).inc()
        self.deltas.push(DeltaType.REPLACED, items, rv)
        self._set_resource_version(rv)
        self.last_error = None
        log.v(2).info("Caches populated", resource=self.label, items=len(items), resourceVersion=rv)

    async def _paged_list(self, path: str) -> tuple[list[dict], str]:
        """Every object, transformed page by page as it arrives: only one page is ever held in
        full, and the work is spread over the waits for the next page."""
        params: dict[str, Any] = {**self.params, "limit": PAGE_SIZE}
        items: list[dict] = []
        while True:
            try:
                page = await self.client.request("GET", path, params=params)
            except Gone:
                if "continue" not in params:
                    raise
                # The continue token expired between pages: fall back to one full list.
                # Not client-go's (its pager falls back without a word): pykcm's detail, at V(4).
                log.v(4).info("Continue token expired, listing in full", resource=self.label)
                full = await self.client.request("GET", path, params=self.params)
                objects, items = full.pop("items", None) or [], []
                for start in range(0, len(objects), PAGE_SIZE):  # seconds at 150,000 pods: not in one step
                    self._transformed({"kind": full.get("kind", ""), "items": objects[start:start + PAGE_SIZE]}, items)
                    await asyncio.sleep(0)
                return items, full["metadata"].get("resourceVersion", "")
            self._transformed(page, items)
            del page["items"]
            token = page["metadata"].get("continue")
            if not token:
                return items, page["metadata"].get("resourceVersion", "")
            params = {**self.params, "limit": PAGE_SIZE, "continue": token}
            await asyncio.sleep(0)  # a page's transform is done; let others run before the next

    def _transformed(self, page: dict, into: list[dict]) -> list[dict]:
        """Append the transformed items of one list page to `into`."""
        kind = page.get("kind", "").removesuffix("List") or self.resource.kind
        api_version = self.resource.api_version
        for obj in page.get("items") or ():
            # Lists omit kind/apiVersion on items; put them back so objects are self-describing.
            obj.setdefault("kind", kind)
            obj.setdefault("apiVersion", api_version)
            into.append(self.transform(obj))
        return into

    # -- watch ----------------------------------------------------------------------------------------

    async def _watch(self, send_initial_events: bool = False) -> None:
        params = {
            **self.params,
            "resourceVersion": self.last_resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": random.randrange(*WATCH_TIMEOUT_RANGE),
        }
        if send_initial_events:
            # The newest state, served from the watch cache (a consistent read, as the LIST's).
            params.update(resourceVersion="", sendInitialEvents="true", resourceVersionMatch="NotOlderThan")
        self._initial = {} if send_initial_events else None
        started = self._stream_started = time.monotonic()
        events = 0
        # Closed here on any way out (an ERROR event, a failed transform), not when the generator is collected.
        async with contextlib.aclosing(
            self.client.watch(self.resource.path(), params, decoder=self.watch_decoder)
        ) as stream:
            while True:
                try:
                    event = await anext(stream)
                except StopAsyncIteration:
                    break
                except TransportError as err:
                    if events == 0 or self._initial is not None or not err.ended:
                        raise  # it did not open, died at once, is to stream again, or broke: back off
                    # Cut after it had delivered events: as client-go's stream watcher ends on an
                    # EOF, a reset or a timeout, a normal end, re-watched at once from the last version
                    # seen (bytes that are no HTTP are an error event to it, and a relist after a backoff).
                    log.v(2).info("Watch cut, will re-watch", resource=self.label, err=one_line(err))
                    break
                events += 1
                kind = event.get("type")
                obj = event.get("object") or {}
                metrics.informer_events_by(self.label, kind or "UNKNOWN").inc()
                if kind == "ERROR":
                    error = error_from_status(int(obj.get("code") or 500), obj)
                    if self._initial is not None or isinstance(error, Gone | TooManyRequests):
                        raise error
                    raise WatchEndedWithError(one_line(error)) from error
                metadata = obj.get("metadata", {})
                rv = metadata.get("resourceVersion", "")
                if self._initial is not None:
                    await self._initial_event(kind, obj, metadata, rv, events)
                    continue
                if kind == "BOOKMARK":
                    self.deltas.push(DeltaType.BOOKMARK, None, rv)
                    self._set_resource_version(rv)
                    continue
                if kind == "ADDED":
                    self.deltas.push(DeltaType.ADDED, self.transform(obj), rv)
                elif kind == "MODIFIED":
                    self.deltas.push(DeltaType.UPDATED, self.transform(obj), rv)
                elif kind == "DELETED":
                    self.deltas.push(DeltaType.DELETED, self.transform(obj), rv)
                else:  # client-go's decoder refuses it: an error event, as one that does not decode
                    raise WatchEndedWithError(f"unable to decode an event from the watch stream: got invalid watch "
                                              f"event type: {kind}")
                self._set_resource_version(rv)
        if events == 0 and time.monotonic() - started < MIN_WATCH_DURATION:
            raise VeryShortWatch(f"very short watch of {self.label}: closed with no events")

    async def _initial_event(self, kind: str | None, obj: dict[str, Any], metadata: dict[str, Any], rv: str,
                             count: int) -> None:
        """One event of a streamed list: kept aside until the bookmark that ends them, which hands
        them all to the cache at once, as one LIST would."""
        assert self._initial is not None
        if kind == "BOOKMARK":
            if (metadata.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                items, self._initial = list(self._initial.values()), None
                self._replace(items, rv, "Reflector WatchList", self._stream_started)
            return
        if kind == "DELETED":
            self._initial.pop(object_key(obj), None)
        elif kind in ("ADDED", "MODIFIED"):
            key = object_key(obj)
            self._initial[key] = self.transform(obj)
        if count % STREAM_YIELD_EVERY == 0:
            await asyncio.sleep(0)  # chunks arrive faster than they are handled: let others run

    def _set_resource_version(self, rv: str) -> None:
        if not rv:
            return
        self.last_resource_version = rv


__all__ = ["ApiError", "Reflector", "strip_managed_fields"]
