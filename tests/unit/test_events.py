"""The event recorder writes what client-go's EventBroadcaster writes: one event at a time from a
bounded queue, correlated as its EventCorrelator (tools/record/events_cache.go) with memories
bounded like it (LRU caches of 4,096), retried in transport as recordToSink does."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from typing import Any

import pytest

from pykcm.client import eventcorrelator, events
from pykcm.client.errors import Invalid, NotFound, TransportError
from pykcm.client.eventcorrelator import EventCorrelator
from pykcm.client.events import EventRecorder
from pykcm.client.fence import FencedWrite
from pykcm.client.resources import Resource
from pykcm.util import apitime
from pykcm.util.log import kref


class FakeApi:
    def __init__(self, latency: float = 0.0) -> None:
        self.created: list[dict] = []
        self.patched: list[tuple[str, dict]] = []
        self.failures: list[BaseException] = []  # raised by the next writes, in order
        self._versions = itertools.count(1)
        self.latency = latency
        self.in_flight = self.most_in_flight = 0

    async def _answer(self) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(self.latency)
        self.in_flight -= 1
        if self.failures:
            raise self.failures.pop(0)

    async def create(self, res: Resource, body: dict, namespace: str | None = None) -> dict:
        await self._answer()
        self.created.append(body)
        return {**body, "metadata": {**body["metadata"], "resourceVersion": str(next(self._versions))}}

    async def patch(self, res: Resource, name: str, body: dict, **_: Any) -> dict:
        await self._answer()
        self.patched.append((name, body))
        original = next(e for e in self.created if e["metadata"]["name"] == name)
        return {**original, **body}

    @property
    def writes(self) -> int:
        return len(self.created) + len(self.patched)


class FakeClock:
    def __init__(self) -> None:
        self.nanos = 1_700_000_000 * 10**9

    def __call__(self) -> int:
        self.nanos += 1000  # every reading a microsecond later: distinct names, as a real clock's
        return self.nanos

    def advance(self, seconds: float) -> None:
        self.nanos += int(seconds * 1e9)


def pod(i: int) -> dict:
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"}}


def recorder_with(api: FakeApi, clock: FakeClock | None = None) -> EventRecorder:
    recorder = EventRecorder(api, "c")  # type: ignore[arg-type]
    if clock is not None:
        recorder.correlator = EventCorrelator(clock, clock)
    return recorder


async def record_all(recorder: EventRecorder, *calls: tuple[dict, str, str, str]) -> None:
    """Record and write them all, a queue's worth at a time: none dropped."""
    for start in range(0, len(calls), events.MAX_PENDING):
        for call in calls[start:start + events.MAX_PENDING]:
            recorder.record(*call)
        await recorder.close(timeout=30)


def created(obj: dict, i: int) -> tuple[dict, str, str, str]:
    return obj, events.NORMAL, "SuccessfulCreate", f"Created pod: web-{i}"


async def test_an_event_is_shaped_as_kcms() -> None:
    """As the built KCM writes it: named <object>.<hex nanoseconds>, source and reporting
    component the controller, no host (KCM's controllers name none)."""
    api = FakeApi()
    await record_all(recorder_with(api), created(pod(0), 0))
    event = api.created[0]
    assert re.fullmatch(r"p0\.[0-9a-f]{16}", event["metadata"]["name"])
    assert event["source"] == {"component": "c"} and event["reportingComponent"] == "c"
    assert "reportingInstance" not in event and event["count"] == 1
    assert event["involvedObject"] == {"kind": "Pod", "apiVersion": "v1", "namespace": "ns", "name": "p0", "uid": "u0"}
    assert event["firstTimestamp"] == event["lastTimestamp"]


def test_a_name_that_would_be_invalid_is_a_uuid() -> None:
    assert re.fullmatch(r"[0-9a-f-]{36}", eventcorrelator.event_name("system:controller:x", 1))
    assert eventcorrelator.event_name("web", 255) == "web.ff"


async def test_the_tenth_similar_message_is_combined_and_later_ones_update_it() -> None:
    """One ReplicaSet scaled to 30 in KCM: nine Events, one combined Event with count 16, the
    last five dropped by the spam filter (burst 25)."""
    api = FakeApi()
    await record_all(recorder_with(api), *(created(pod(0), i) for i in range(30)))
    assert [e["message"] for e in api.created[:9]] == [f"Created pod: web-{i}" for i in range(9)]
    combined = api.created[9]
    assert combined["message"] == "(combined from similar events): Created pod: web-9"
    assert "reportingComponent" not in combined  # client-go's aggregate Event carries none
    assert len(api.created) == 10
    assert {name for name, _ in api.patched} == {combined["metadata"]["name"]}
    assert [body["count"] for _, body in api.patched] == list(range(2, 17))
    assert api.patched[-1][1]["message"] == "(combined from similar events): Created pod: web-24"


async def test_a_combined_event_is_named_without_the_name_check_as_client_gos() -> None:
    # client-go's EventAggregate names it <object>.<hex nanos> unchecked: for a 240-character
    # name that is no valid name, and the apiserver refuses it, as it refuses KCM's.
    long_named = pod(0)
    long_named["metadata"]["name"] = "w" * 240
    api = FakeApi()
    await record_all(recorder_with(api), *(created(long_named, i) for i in range(10)))
    single, combined = api.created[0], api.created[9]
    assert re.fullmatch(r"[0-9a-f-]{36}", single["metadata"]["name"])  # makeEvent's GenerateEventName
    assert re.fullmatch("w{240}\\.[0-9a-f]+", combined["metadata"]["name"])


async def test_similar_messages_are_counted_afresh_after_ten_minutes() -> None:
    clock, api = FakeClock(), FakeApi()
    recorder = recorder_with(api, clock)
    await record_all(recorder, *(created(pod(0), i) for i in range(9)))
    clock.advance(eventcorrelator.AGGREGATE_INTERVAL + 1)
    await record_all(recorder, created(pod(0), 9))
    assert api.created[-1]["message"] == "Created pod: web-9" and not api.patched


async def test_events_the_spam_filter_drops_still_count() -> None:
    """client-go counts an event before its spam filter drops it: when the filter lets one
    through again (one every 5 minutes), the count written includes the dropped ones."""
    clock, api = FakeClock(), FakeApi()
    recorder = recorder_with(api, clock)
    failing = (pod(0), events.WARNING, "FailedCreate", "Error creating: quota")
    await record_all(recorder, *[failing] * 30)
    assert len(api.created) == 1 and len(api.patched) == 24 and api.patched[-1][1]["count"] == 25
    clock.advance(1 / eventcorrelator.SPAM_QPS)
    await record_all(recorder, failing)
    assert api.patched[-1][1]["count"] == 31


async def test_spam_key_includes_the_event_type_as_client_go() -> None:
    api = FakeApi()
    recorder = recorder_with(api)
    await record_all(recorder, *[(pod(0), events.NORMAL, "Reason", "m")] * (eventcorrelator.SPAM_BURST + 1),
                     (pod(0), events.WARNING, "Reason", "m"))
    assert api.created[-1]["type"] == events.WARNING  # its own bucket: not throttled by the Normal ones


async def test_memories_are_lrus_of_4096() -> None:
    api = FakeApi()
    recorder = recorder_with(api)
    await record_all(recorder, *(created(pod(i), 0) for i in range(eventcorrelator.MAX_TRACKED + 100)))
    correlator = recorder.correlator
    assert len(correlator._buckets) == len(correlator._similar) == eventcorrelator.MAX_TRACKED
    assert len(correlator._written) == eventcorrelator.MAX_TRACKED


async def test_the_least_recently_used_object_is_forgotten_first() -> None:
    api = FakeApi()
    recorder = recorder_with(api)
    same = (pod(0), events.NORMAL, "Reason", "m")
    await record_all(recorder, *[same] * eventcorrelator.SPAM_BURST)  # p0 spends its whole burst
    await record_all(recorder, *(created(pod(i), 0) for i in range(1, eventcorrelator.MAX_TRACKED)))
    await record_all(recorder, same)  # p0 used again: the most recent now, and still throttled
    assert api.writes == eventcorrelator.SPAM_BURST + eventcorrelator.MAX_TRACKED - 1
    await record_all(recorder, created(pod(eventcorrelator.MAX_TRACKED), 0))  # the least recently used goes
    writes = api.writes
    await record_all(recorder, same)
    assert api.writes == writes  # p0's empty bucket survived: still throttled


async def test_a_burst_is_written_one_at_a_time_as_client_go() -> None:
    """One write in flight, as client-go's sender: events take no more of the rate limit from the
    controller's own writes than in KCM. A full queue's worth is written without drops."""
    api = FakeApi(latency=0.002)
    await record_all(recorder_with(api), *(created(pod(i), i) for i in range(events.MAX_PENDING)))
    assert len(api.created) == events.MAX_PENDING
    assert api.most_in_flight == 1


async def test_drops_are_counted_and_logged_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    recorder = recorder_with(FakeApi(latency=1.0))
    with caplog.at_level(logging.ERROR, logger="pykcm.events"):
        for i in range(events.MAX_PENDING + 300):
            recorder.record(*created(pod(i), i))
    await recorder.close(timeout=0.1)
    drops = [r for r in caplog.records if r.getMessage() == "Dropping events, queue full"]
    assert len(drops) == 1
    assert recorder._dropped > 250  # counted for the next line


async def test_one_objects_events_are_written_in_order_and_a_repeat_patches() -> None:
    api = FakeApi(latency=0.005)
    failed = [(pod(0), events.WARNING, "FailedCreate", message) for message in ("a", "b", "a", "c", "a")]
    await record_all(recorder_with(api), *failed, (pod(1), events.WARNING, "FailedCreate", "a"))
    assert [e["message"] for e in api.created if e["involvedObject"]["name"] == "p0"] == ["a", "b", "c"]
    assert [(body["count"], body["message"]) for _, body in api.patched] == [(2, "a"), (3, "a")]
    assert len({name for name, _ in api.patched}) == 1  # p0's "a" counted twice more on one Event


async def test_an_expired_event_is_created_again_with_its_count() -> None:
    api = FakeApi()
    recorder = recorder_with(api)
    await record_all(recorder, created(pod(0), 0))
    api.failures.append(NotFound(404, "NotFound", "events \"p0.x\" not found"))
    await record_all(recorder, created(pod(0), 0))
    again = api.created[-1]
    assert again["metadata"]["name"] == api.created[0]["metadata"]["name"] and again["count"] == 2
    assert "resourceVersion" not in again["metadata"]


async def test_a_transport_failure_is_retried_and_a_refusal_is_not(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(events, "RETRY_SLEEP", 0.0)
    api = FakeApi()
    api.failures += [TransportError("connection refused")] * 2
    recorder = recorder_with(api)
    await record_all(recorder, created(pod(0), 0))
    assert len(api.created) == 1  # the third try
    api.failures.append(Invalid(422, "Invalid", "Event is invalid"))
    with caplog.at_level(logging.ERROR, logger="pykcm.events"):
        await record_all(recorder, created(pod(1), 0), created(pod(2), 0))
    assert [e["involvedObject"]["name"] for e in api.created] == ["p0", "p2"]
    assert any(r.getMessage() == "Server rejected event (will not retry!)" for r in caplog.records)
    api.failures += [TransportError("connection refused")] * events.MAX_TRIES
    await record_all(recorder, created(pod(3), 0), created(pod(4), 0))
    assert [e["involvedObject"]["name"] for e in api.created] == ["p0", "p2", "p4"]  # p3 given up after 12
    [given_up] = [r for r in caplog.records if r.getMessage() == "Unable to write event (retry limit exceeded!)"]
    assert given_up.kv["object"] == kref("ns", "p3") and given_up.kv["kind"] == "Pod"  # type: ignore[attr-defined]


async def test_a_write_the_fence_refuses_is_dropped_without_retries(caplog: pytest.LogCaptureFixture) -> None:
    # The lease is lost: no retry can pass the fence, and retrying held the exit up by seconds.
    api = FakeApi()
    api.failures += [FencedWrite("POST /api/v1/namespaces/ns/events: refused, leader election lost")] * 3
    recorder = recorder_with(api)
    with caplog.at_level(logging.ERROR, logger="pykcm.events"):
        await record_all(recorder, created(pod(0), 0), created(pod(1), 0))
    assert [e["involvedObject"]["name"] for e in api.created] == []
    assert len(api.failures) == 1  # one try for each event
    assert not [r for r in caplog.records if "Unable to write event" in r.getMessage()]


async def test_a_wall_clock_stepped_back_mutes_no_objects_events() -> None:
    # client-go's spam filter and aggregation window run on Go's monotonic clock.
    wall, ticks, api = FakeClock(), FakeClock(), FakeApi()
    recorder = EventRecorder(api, "c")  # type: ignore[arg-type]
    recorder.correlator = EventCorrelator(wall, ticks)
    await record_all(recorder, created(pod(0), 0))
    wall.advance(-24 * 3600)  # an NTP step of a day back
    await record_all(recorder, created(pod(0), 1), created(pod(0), 2))
    assert len(api.created) == 3


def test_a_clock_going_back_takes_no_tokens_from_a_bucket() -> None:
    from pykcm.util.flowcontrol import TokenBucket

    now = [1000.0]
    bucket = TokenBucket(1 / 300, 25, lambda: now[0])
    now[0] -= 86400
    assert bucket.allow()


async def test_an_answer_that_is_not_an_event_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "RETRY_SLEEP", 0.0)
    api = FakeApi()
    real_create = api.create
    answers: list[Any] = [None, "not json"]

    async def create(res: Resource, body: dict, namespace: str | None = None) -> Any:
        written = await real_create(res, body, namespace)
        return answers.pop(0) if answers else written

    api.create = create  # type: ignore[method-assign]
    await record_all(recorder_with(api), created(pod(0), 0))
    assert len(api.created) == 3  # client-go's UnexpectedObjectError is retried


async def test_the_sender_outlives_a_bug_in_correlation(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi()
    recorder = recorder_with(api)
    real = recorder.correlator.correlate
    broken = [True]

    def correlate(event: dict) -> Any:
        if broken.pop() if broken else False:
            raise KeyError("metadata")
        return real(event)

    monkeypatch.setattr(recorder.correlator, "correlate", correlate)
    with caplog.at_level(logging.ERROR, logger="pykcm.events"):
        await record_all(recorder, created(pod(0), 0), created(pod(1), 0))
    assert [e["involvedObject"]["name"] for e in api.created] == ["p1"]
    assert any(r.getMessage() == "Unable to write event" for r in caplog.records)


async def test_only_normal_and_warning_events_are_recorded(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi()
    with caplog.at_level(logging.ERROR, logger="pykcm.events"):
        await record_all(recorder_with(api), (pod(0), "Info", "Synced", "hello"), created(pod(1), 0))
    assert [e["type"] for e in api.created] == ["Normal"]
    assert any(r.getMessage() == "Unsupported event type" for r in caplog.records)


async def test_stamps_are_truncated_to_the_second_as_go_formats_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """100 ns before a second's end a float of the Unix time rounds up to the next second; Go
    truncates. Both the Event and the combined Event are stamped from the clock's nanoseconds."""
    late = 1_795_763_157_999_999_900  # 2026-11-27T07:05:57.9999999Z
    monkeypatch.setattr(events.time, "time_ns", lambda: late)
    api = FakeApi()
    recorder = recorder_with(api)
    recorder.correlator = EventCorrelator(lambda: late, FakeClock())
    await record_all(recorder, *(created(pod(0), i) for i in range(10)))
    assert api.created[9]["message"].startswith("(combined from similar events)")
    stamps = {e["firstTimestamp"] for e in api.created} | {e["lastTimestamp"] for e in api.created}
    assert stamps == {"2026-11-27T07:05:57Z"}


def test_now_is_truncated_to_the_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apitime.time, "time_ns", lambda: 1_795_763_157_999_999_900)
    assert apitime.now() == "2026-11-27T07:05:57Z"


# -- "Event occurred": the broadcaster's structured logging (client-go's StartStructuredLogging) ------


EVENT_OCCURRED_KEYS = ["object", "fieldPath", "kind", "apiVersion", "type", "reason", "message"]


@pytest.mark.parametrize("verbosity", [3], indirect=True)
async def test_a_recorder_logging_at_3_says_each_event_it_takes_with_client_gos_keys(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = EventRecorder(FakeApi(), "c", log_verbosity=3)  # type: ignore[arg-type]
    node = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": "n1"}}
    with caplog.at_level(logging.INFO, logger="pykcm.events"):
        await record_all(recorder, created(pod(0), 0), (node, events.WARNING, "Odd", "m"), (pod(1), "Info", "x", "y"))
    said = [r for r in caplog.records if r.getMessage() == "Event occurred"]
    assert [list(r.kv) for r in said] == [EVENT_OCCURRED_KEYS] * 2  # type: ignore[attr-defined]
    assert said[0].kv == {  # type: ignore[attr-defined]
        "object": kref("ns", "p0"), "fieldPath": "", "kind": "Pod", "apiVersion": "v1", "type": "Normal",
        "reason": "SuccessfulCreate", "message": "Created pod: web-0",
    }
    assert str(said[1].kv["object"]) == "n1" and said[1].v == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize("verbosity", [2], indirect=True)
async def test_a_recorder_logging_at_3_says_nothing_at_v2(verbosity: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pykcm.events"):
        await record_all(EventRecorder(FakeApi(), "c", log_verbosity=3), created(pod(0), 0))  # type: ignore[arg-type]
    assert not [r for r in caplog.records if r.getMessage() == "Event occurred"]


@pytest.mark.parametrize("verbosity", [9], indirect=True)
async def test_a_recorder_without_a_log_level_logs_no_event(verbosity: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pykcm.events"):
        await record_all(recorder_with(FakeApi()), created(pod(0), 0))
    assert not [r for r in caplog.records if r.getMessage() == "Event occurred"]


async def test_an_event_dropped_on_a_full_queue_is_not_said_to_have_occurred(caplog: pytest.LogCaptureFixture) -> None:
    recorder = EventRecorder(FakeApi(latency=1.0), "c", log_verbosity=0)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="pykcm.events"):
        for i in range(events.MAX_PENDING + 5):
            recorder.record(*created(pod(i), i))
    await recorder.close(timeout=0.1)
    assert len([r for r in caplog.records if r.getMessage() == "Event occurred"]) == events.MAX_PENDING


async def test_an_unsupported_event_type_is_said_with_client_gos_key(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="pykcm.events"):
        await record_all(recorder_with(FakeApi()), (pod(0), "Info", "Synced", "hello"))
    [line] = [r for r in caplog.records if r.getMessage() == "Unsupported event type"]
    assert line.kv["eventType"] == "Info" and "type" not in line.kv  # type: ignore[attr-defined]


@pytest.mark.parametrize("verbosity", [3], indirect=True)
async def test_a_recorder_named_for_a_controller_logs_through_its_named_logger(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    # KCM's controllers make their broadcasters with the logger their constructor gets, named after
    # them (logger= first); the leader election's is the manager's, unnamed. The recorder's own
    # refusals (client-go's generateEvent) log through klog.Background(), unnamed.
    named = EventRecorder(FakeApi(), "replicaset-controller", log_verbosity=3,  # type: ignore[arg-type]
                          log_name="replicaset-controller")
    unnamed = EventRecorder(FakeApi(), "pykcm", log_verbosity=3)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="pykcm.events"):
        await record_all(named, created(pod(0), 0), (pod(1), "Info", "x", "y"))
        await record_all(unnamed, created(pod(2), 2))
    said = [r.kv for r in caplog.records if r.getMessage() == "Event occurred"]  # type: ignore[attr-defined]
    assert [list(kv) for kv in said] == [["logger", *EVENT_OCCURRED_KEYS], EVENT_OCCURRED_KEYS]
    assert said[0]["logger"] == "replicaset-controller"
    [refused] = [r.kv for r in caplog.records if r.getMessage() == "Unsupported event type"]  # type: ignore[attr-defined]
    assert "logger" not in refused
