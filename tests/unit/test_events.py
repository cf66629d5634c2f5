"""The event recorder's memory (spam-filter buckets, aggregation records) is bounded like
client-go's EventCorrelator: LRU caches of 4,096 entries (tools/record/events_cache.go)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import pytest

from pykcm.client import events
from pykcm.client.events import EventRecorder
from pykcm.client.resources import Resource


class FakeApi:
    def __init__(self, latency: float = 0.0) -> None:
        self.created: list[dict] = []
        self.patched: list[str] = []
        self._names = itertools.count()
        self.latency = latency
        self.in_flight = self.most_in_flight = 0

    async def _answer(self) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(self.latency)
        self.in_flight -= 1

    async def create(self, res: Resource, body: dict, namespace: str | None = None) -> dict:
        await self._answer()
        self.created.append(body)
        return {**body, "metadata": {**body["metadata"], "name": f"e{next(self._names)}"}}

    async def patch(self, res: Resource, name: str, body: dict, **_: Any) -> dict:
        await self._answer()
        self.patched.append(name)
        return {}


def pod(i: int) -> dict:
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"}}


async def send(recorder: EventRecorder, obj: dict, type_: str = events.NORMAL, message: str = "m") -> None:
    involved = {**{k: obj.get(k, "") for k in ("kind", "apiVersion")}, **{
        k: obj["metadata"].get(k, "") for k in ("namespace", "name", "uid")}, "resourceVersion": ""}
    await recorder._send(involved, type_, "Reason", message)


async def test_spam_filter_buckets_are_an_lru_of_4096() -> None:
    api = FakeApi()
    recorder = EventRecorder(api, "c", host="h")  # type: ignore[arg-type]
    for i in range(events.MAX_TRACKED + 100):
        await send(recorder, pod(i))
    assert len(recorder._buckets) == events.MAX_TRACKED
    assert len(recorder._sent) == events.MAX_TRACKED


async def test_the_least_recently_used_object_is_forgotten_first() -> None:
    api = FakeApi()
    recorder = EventRecorder(api, "c", host="h")  # type: ignore[arg-type]
    for _ in range(events.SPAM_BURST):
        await send(recorder, pod(0))  # p0 spends its whole burst
    for i in range(1, events.MAX_TRACKED):
        await send(recorder, pod(i))
    await send(recorder, pod(0))  # p0 used again: the most recent now, and still throttled
    assert len(api.created) + len(api.patched) == events.SPAM_BURST + events.MAX_TRACKED - 1
    await send(recorder, pod(events.MAX_TRACKED))  # one too many: the least recently used goes
    assert spam_key(pod(1)) not in recorder._buckets
    assert spam_key(pod(0)) in recorder._buckets
    writes = len(api.created) + len(api.patched)
    await send(recorder, pod(0))
    assert len(api.created) + len(api.patched) == writes  # p0's empty bucket survived: still throttled


def spam_key(obj: dict, type_: str = events.NORMAL) -> tuple:
    meta = obj["metadata"]
    return (obj["kind"], meta["namespace"], meta["name"], meta["uid"], obj["apiVersion"], type_)


async def test_spam_key_includes_the_event_type_as_client_go() -> None:
    api = FakeApi()
    recorder = EventRecorder(api, "c", host="h")  # type: ignore[arg-type]
    for _ in range(events.SPAM_BURST + 1):
        await send(recorder, pod(0), events.NORMAL)
    await send(recorder, pod(0), events.WARNING)  # its own bucket: not throttled by the Normal ones
    assert api.created[-1]["type"] == events.WARNING


async def test_a_burst_is_written_one_at_a_time_as_client_go() -> None:
    """One write in flight, as client-go's sender: events take no more of the rate limit from the
    controller's own writes than in KCM. A full queue's worth is written without drops."""
    api = FakeApi(latency=0.002)
    recorder = EventRecorder(api, "c", host="h")  # type: ignore[arg-type]
    for i in range(events.MAX_PENDING):
        recorder.record(pod(i % 50), events.NORMAL, "SuccessfulCreate", f"Created pod: p{i}")
    await recorder.close(timeout=30)
    assert len(api.created) == events.MAX_PENDING
    assert api.most_in_flight == 1


async def test_drops_are_counted_and_logged_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    recorder = EventRecorder(FakeApi(latency=1.0), "c", host="h")  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="pykcm.events"):
        for i in range(events.MAX_PENDING + 300):
            recorder.record(pod(i), events.NORMAL, "SuccessfulCreate", f"Created pod: p{i}")
    await recorder.close(timeout=0.1)
    drops = [r for r in caplog.records if r.getMessage() == "Dropping events, queue full"]
    assert len(drops) == 1
    assert recorder._dropped > 250  # counted for the next line


async def test_one_objects_events_are_written_in_order_and_a_repeat_patches() -> None:
    api = FakeApi(latency=0.005)
    recorder = EventRecorder(api, "c", host="h")  # type: ignore[arg-type]
    for message in ("a", "b", "a", "c", "a"):
        recorder.record(pod(0), events.WARNING, "FailedCreate", message)
    recorder.record(pod(1), events.WARNING, "FailedCreate", "a")
    await recorder.close()
    assert [e["message"] for e in api.created if e["involvedObject"]["name"] == "p0"] == ["a", "b", "c"]
    assert len(api.patched) == 2 and len(set(api.patched)) == 1  # p0's "a" counted twice more on one Event
