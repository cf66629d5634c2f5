"""Kubernetes Events for controllers, written as client-go's EventBroadcaster writes them.

`record()` never blocks a sync: events go through a bounded in-memory queue (MAX_PENDING, as
client-go's) to a sender task that writes one event at a time, in the order recorded, as
client-go's sender goroutine does. Events share the client's rate limit with the controller's
own writes, so more writes in flight would take it from pod writes: at QPS 1000, eight in
flight during a burst made scaling 500 ReplicaSets up about 1.2x slower than KCM (1.0x with
one, tests/bench/bench_replicaset.py), while KCM drops what its queue cannot hold. What each
event becomes (a new Event, a count on an existing one, one combined Event for many similar
ones, or nothing) is eventcorrelator.py's. A write that fails in transport is tried again after
10 s, up to 12 times; one the API server refuses is not. Events dropped on a full queue are
logged at most once a minute, with their number (client-go logs each one it drops at its full
incoming queue, "Unable to record event: too many queued events, dropped event"; only what a full
watcher's channel drops goes unsaid). Given a log level, each event taken is logged as "Event
occurred" at it, as client-go's StartStructuredLogging does for the broadcaster's watcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

from pykcm.client.errors import (
    NAMESPACE_TERMINATING_CAUSE,
    ApiError,
    NotFound,
    has_status_cause,
    is_already_exists,
)
from pykcm.client.eventcorrelator import Correlated, Event, EventCorrelator, event_name
from pykcm.client.fence import FencedWrite
from pykcm.client.resources import EVENTS
from pykcm.client.rest import STRATEGIC_MERGE_PATCH, RestClient
from pykcm.util import apitime
from pykcm.util.log import ObjectRef, get_logger, kref

NORMAL = "Normal"
WARNING = "Warning"

MAX_PENDING = 1000  # client-go's broadcaster queue length; beyond it events are dropped, never blocking
MAX_TRIES = 12  # writes of one event failing in transport (client-go's maxTriesPerEvent)
RETRY_SLEEP = 10.0  # seconds between them; the first is random in [0, 10) so clients do not sync up
DROP_LOG_INTERVAL = 60.0  # seconds between two "Dropping events" lines

log = get_logger("events")


class EventRecorder:
    def __init__(
        self, client: RestClient, component: str, log_verbosity: int | None = None, log_name: str = ""
    ) -> None:
        self.client = client
        self.component = component
        # "Event occurred" for each event taken, at this level (None: not logged).
        self.log_verbosity = log_verbosity
        # A KCM controller's broadcaster is made in its constructor, whose logger is named after the
        # controller (logger= on every line); the leader election's is the manager's, unnamed.
        self._log = log.named(log_name) if log_name else log
        self._event_log = None if log_verbosity is None else self._log.v(log_verbosity)
        self.correlator = EventCorrelator()
        self._pending: asyncio.Queue[Event] = asyncio.Queue(MAX_PENDING)
        self._task: asyncio.Task | None = None
        self._dropped = 0  # since the last "Dropping events" line
        self._drop_logged_at = -DROP_LOG_INTERVAL

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Queue an event about `obj` (a full object or one with kind/apiVersion/metadata)."""
        if type_ not in (NORMAL, WARNING):  # client-go's ValidateEventType: a plugin's mistake, not written
            # The recorder's side logs unnamed (client-go's klog.Background()), the sender's named.
            log.error(None, "Unsupported event type", eventType=type_, reason=reason)  # reason: pykcm's addition
            return
        meta = obj["metadata"]
        involved = {
            "kind": obj.get("kind", ""),
            "namespace": meta.get("namespace", ""),
            "name": meta["name"],
            "uid": meta.get("uid", ""),
            "apiVersion": obj.get("apiVersion", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        }
        nanos = time.time_ns()
        stamp = apitime.format_time(nanos // 1_000_000_000)  # truncated, as Go formats a time
        # As client-go's makeEvent: KCM's controllers name no host, so no source.host or reportingInstance.
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": event_name(involved["name"], nanos), "namespace": involved["namespace"] or "default"},
            "involvedObject": {k: v for k, v in involved.items() if v},
            "reason": reason, "message": message, "type": type_,
            "source": {"component": self.component},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "reportingComponent": self.component,
        }
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send_loop(), name=f"events {self.component}")
        try:
            self._pending.put_nowait(event)
        except asyncio.QueueFull:
            self._dropped += 1
            now = time.monotonic()
            if now - self._drop_logged_at >= DROP_LOG_INTERVAL:
                log.error(None, "Dropping events, queue full", dropped=self._dropped, reason=reason,
                          **_about(involved))
                self._dropped, self._drop_logged_at = 0, now
            return
        if self._event_log is not None and self._event_log.enabled():  # client-go's keys, in its order
            self._event_log.info("Event occurred", object=_object_ref(involved), fieldPath="", kind=involved["kind"],
                                 apiVersion=involved["apiVersion"], type=type_, reason=reason, message=message)

    async def close(self, timeout: float = 5.0) -> None:
        """Flush queued events (bounded by `timeout`), then stop the sender."""
        if self._task is None:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._pending.join(), timeout)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _send_loop(self) -> None:
        while True:
            event = await self._pending.get()
            try:
                correlated = self.correlator.correlate(event)
                if correlated is not None:
                    await self._write(correlated)
            except Exception as err:  # a bug here loses this event, not the sender (client-go's HandleCrash)
                self._log.error(err, "Unable to write event", reason=event["reason"], **_about(event["involvedObject"]))
            finally:
                self._pending.task_done()

    async def _write(self, correlated: Correlated) -> None:
        kv = {"reason": correlated.event["reason"], **_about(correlated.event["involvedObject"])}
        for attempt in range(1, MAX_TRIES + 1):
            try:
                written = await self._write_once(correlated)
            except FencedWrite:
                return  # this process no longer leads: the fence has said so once, and no retry can pass
            except ApiError as err:
                if is_already_exists(err) or has_status_cause(err, NAMESPACE_TERMINATING_CAUSE):
                    self._log.v(5).info("Server rejected event (will not retry!)", err=str(err), **kv)
                else:
                    self._log.error(err, "Server rejected event (will not retry!)", **kv)
                return
            except Exception as err:  # transport, or an answer that is not an Event: client-go retries both
                if attempt == MAX_TRIES:
                    self._log.error(err, "Unable to write event (retry limit exceeded!)", **kv)
                    return
                self._log.error(err, "Unable to write event (may retry after sleeping)", **kv)
                await asyncio.sleep(RETRY_SLEEP * (random.random() if attempt == 1 else 1.0))
            else:
                self.correlator.update_state(written)
                return

    async def _write_once(self, correlated: Correlated) -> Event:
        """Patch the existing Event; create it where there is none (or it expired)."""
        event, namespace = correlated.event, correlated.event["metadata"]["namespace"]
        if correlated.patch is not None:
            with contextlib.suppress(NotFound):
                return _checked(await self.client.patch(EVENTS, event["metadata"]["name"], correlated.patch,
                                                        namespace=namespace, content_type=STRATEGIC_MERGE_PATCH))
        meta = {k: v for k, v in event["metadata"].items() if k != "resourceVersion"}
        return _checked(await self.client.create(EVENTS, {**event, "metadata": meta}, namespace=namespace))


def _checked(answer: Any) -> Event:
    """The Event a write answered with; client-go's UnexpectedObjectError (retried) for anything else."""
    if not isinstance(answer, dict) or not isinstance(answer.get("metadata"), dict):
        raise ValueError(f"the answer to an Event write is not an Event: {str(answer)[:80]!r}")
    return answer


def _about(involved: dict[str, Any]) -> dict[str, Any]:
    """The error lines' keys naming an event's object: its kind and namespace/name. client-go's lines
    log the whole Event (`event=`) instead; these are pykcm's, shorter to read."""
    return {"kind": involved.get("kind", ""), "object": _object_ref(involved)}


def _object_ref(involved: dict[str, Any]) -> ObjectRef:
    """namespace/name, or the name alone without a namespace, as klog.KRef."""
    return kref(involved.get("namespace") or "", involved.get("name", ""))
