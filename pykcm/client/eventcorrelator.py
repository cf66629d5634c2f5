"""What to write for an Event, as client-go's EventCorrelator decides it (tools/record/events_cache.go).

Three steps, in client-go's order, each with an LRU memory of 4,096 entries:

1. aggregate: the 10th different message within 10 minutes for one (source, object, type,
   reason) becomes one Event "(combined from similar events): <message>" that later ones update;
2. observe: a repeat of an Event already written (same source, object, type, reason and
   message) becomes a patch of its `count`, `lastTimestamp` and `message`;
3. filter: each (source, object, type) may write 25 Events, then one more every 5 minutes.

Steps 1 and 2 remember an event even when step 3 then drops it, so the next `count` written
includes the dropped ones, as KCM's does. A scale of one ReplicaSet to 30 thus writes nine
"Created pod" Events and one combined Event with count 16, both in KCM and here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pykcm.util import apitime
from pykcm.util.flowcontrol import TokenBucket
from pykcm.util.lru import LRUCache
from pykcm.util.validation import is_dns1123_subdomain

MAX_TRACKED = 4096  # entries of each memory (client-go's maxLruCacheEntries)
AGGREGATE_MAX_EVENTS = 10
AGGREGATE_INTERVAL = 600.0  # seconds
AGGREGATE_PREFIX = "(combined from similar events): "
SPAM_BURST = 25
SPAM_QPS = 1.0 / 300.0

Event = dict[str, Any]


def event_name(object_name: str, unix_nanos: int) -> str:
    """`<object>.<nanoseconds in hex>`, or a UUID where that is no valid name (GenerateEventName)."""
    name = f"{object_name}.{unix_nanos:x}"
    return name if is_dns1123_subdomain(name) else str(uuid.uuid4())


def _source_and_object(event: Event) -> tuple[str, ...]:
    source, ref = event.get("source") or {}, event["involvedObject"]
    return (source.get("component", ""), source.get("host", ""), ref.get("kind", ""), ref.get("namespace", ""),
            ref.get("name", ""), ref.get("uid", ""), ref.get("apiVersion", ""), event.get("type", ""))


def event_key(event: Event) -> tuple[str, ...]:
    """What makes two events the same Event (getEventKey)."""
    return (*_source_and_object(event), event["involvedObject"].get("fieldPath", ""), event["reason"],
            event["message"])


def _aggregate_key(event: Event) -> tuple[str, ...]:
    """What makes two events similar (EventAggregatorByReasonFunc): all but the message."""
    return (*_source_and_object(event), event["reason"], event.get("reportingComponent", ""),
            event.get("reportingInstance", ""))


@dataclass(slots=True)
class _Similar:
    messages: set[str] = field(default_factory=set)
    last_seen: float = float("-inf")


@dataclass(slots=True)
class _Written:
    count: int
    first_timestamp: str
    name: str
    resource_version: str


@dataclass(slots=True)
class Correlated:
    """The Event to write; with `patch`, an update of the existing one named `event`'s name."""

    event: Event
    patch: Event | None = None


class EventCorrelator:
    def __init__(self, clock: Callable[[], int] = time.time_ns, ticks: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock  # Unix nanoseconds: names and stamps aggregate Events
        # Nanoseconds that only go forward: the aggregation window and the spam filter's refills, which
        # client-go measures on Go's monotonic clock, so a wall clock stepped back mutes no object's events.
        self._ticks = ticks
        self._similar: LRUCache[tuple, _Similar] = LRUCache(MAX_TRACKED)
        self._written: LRUCache[tuple, _Written] = LRUCache(MAX_TRACKED)
        self._buckets: LRUCache[tuple, TokenBucket] = LRUCache(MAX_TRACKED)

    def correlate(self, event: Event) -> Correlated | None:
        """The write `event` calls for, or None where the spam filter drops it."""
        event, key = self._aggregate(event)
        correlated = self._observe(event, key)
        return None if self._spam(correlated.event) else correlated

    def update_state(self, written: Event) -> None:
        """Remember an Event as the API server returned it (its name and resourceVersion)."""
        self._remember(event_key(written), written)

    def _aggregate(self, event: Event) -> tuple[Event, tuple]:
        elapsed = self._ticks() / 1e9
        key = _aggregate_key(event)
        similar = self._similar.get(key)
        if similar is None or elapsed - similar.last_seen > AGGREGATE_INTERVAL:
            similar = _Similar()
        similar.messages.add(event["message"])
        similar.last_seen = elapsed
        self._similar.put(key, similar)
        if len(similar.messages) < AGGREGATE_MAX_EVENTS:
            return event, event_key(event)
        similar.messages.pop()  # stays at the limit, as client-go's PopAny
        now = self._clock()
        stamp = apitime.format_time(now // 1_000_000_000)
        ref = event["involvedObject"]
        # client-go's aggregate Event carries no reporting fields: KCM's "combined" Events have none.
        aggregate = {
            "apiVersion": "v1", "kind": "Event",
            # Named without GenerateEventName's check, as client-go's EventAggregate: core/v1 does not
            # check an Event's name either, so an over-long one is written, as KCM's is.
            "metadata": {"name": f"{ref['name']}.{now:x}", "namespace": event["metadata"]["namespace"]},
            "involvedObject": ref, "reason": event["reason"], "message": AGGREGATE_PREFIX + event["message"],
            "type": event["type"], "source": event["source"], "firstTimestamp": stamp, "lastTimestamp": stamp,
            "count": 1,
        }
        return aggregate, key

    def _observe(self, event: Event, key: tuple) -> Correlated:
        written = self._written.get(key)
        if written is None:
            self._remember(key, event)
            return Correlated(event)
        event = {**event, "metadata": {**event["metadata"], "name": written.name,
                                       "resourceVersion": written.resource_version},
                 "firstTimestamp": written.first_timestamp, "count": written.count + 1}
        self._remember(key, event)
        # client-go's two-way merge patch between the Event and itself with these three zeroed.
        return Correlated(event, {"count": event["count"], "lastTimestamp": event["lastTimestamp"],
                                  "message": event["message"]})

    def _remember(self, key: tuple, event: Event) -> None:
        meta = event["metadata"]
        self._written.put(key, _Written(event.get("count", 1), event.get("firstTimestamp", ""), meta["name"],
                                        meta.get("resourceVersion", "")))

    def _spam(self, event: Event) -> bool:
        key = _source_and_object(event)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(SPAM_QPS, SPAM_BURST, clock=lambda: self._ticks() / 1e9)
        self._buckets.put(key, bucket)  # a use, allowed or not, makes it the most recent
        return not bucket.allow()  # a passive limiter: a dropped event spends no future token
