"""Reflector decisions with a scripted API: streamed initial state and its fallback to LIST,
pagination fallback, bookmarks, 410 handling; what it logs, as client-go's reflector."""

import asyncio
import logging

import pytest

from pykcm.client.config import ClientConfig
from pykcm.client.errors import Gone, Invalid, TooManyRequests, TransportError
from pykcm.client.protobuf import UndecodableEvent, WatchDecoder
from pykcm.client.resources import CONFIGMAPS
from pykcm.client.rest import RestClient
from pykcm.informers.delta_queue import DeltaQueue, DeltaType
from pykcm.informers.reflector import INITIAL_EVENTS_END, PAGE_SIZE, STREAM_YIELD_EVERY, Reflector
from pykcm.util.backoff import BackoffManager
from tests.support import LoopTurns


def cm(name: str, rv: str, **meta) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, **meta}}


class ScriptedClient(RestClient):
    def __init__(self, responses: list, watches: list | None = None) -> None:
        super().__init__(ClientConfig(host="https://127.0.0.1:1", ssl_context=None))
        self.responses = responses
        self.watches = watches or []
        self.requests: list[dict] = []
        self.watch_params: list[dict] = []
        self.watch_decoders: list = []

    async def request(self, method, path, **kw):
        self.requests.append(dict(kw.get("params") or {}))
        answer = self.responses.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def watch(self, path, params, decoder=None):
        self.watch_params.append(params)
        self.watch_decoders.append(decoder)
        events = self.watches.pop(0) if self.watches else []
        if isinstance(events, Exception):
            raise events  # the watch request itself failed
        for event in events:
            if isinstance(event, Exception):
                raise event  # the stream broke after the events before it
            yield event
        if not self.watches:
            await asyncio.Event().wait()  # the last scripted watch stays open


def page(items: list, rv: str, cont: str = "") -> dict:
    return {"kind": "ConfigMapList", "metadata": {"resourceVersion": rv, "continue": cont}, "items": items}


class RecordingBackoff:
    """Counts the delays the reflector asks for, and waits none of them."""

    def __init__(self) -> None:
        self.delays = 0

    def next(self) -> float:
        self.delays += 1
        return 0.0


def reflector_with(client: ScriptedClient, queue: DeltaQueue) -> tuple[Reflector, RecordingBackoff]:
    backoff = RecordingBackoff()
    return Reflector(client, CONFIGMAPS, queue, backoff=backoff, watch_list=False), backoff


async def run_until(reflector: Reflector, queue: DeltaQueue, count: int) -> list:
    task = asyncio.create_task(reflector.run())
    deltas = []
    try:
        for _ in range(count):
            deltas.append(await asyncio.wait_for(queue.pop(), 5))
    finally:
        task.cancel()
    return deltas


async def test_expired_continue_token_falls_back_to_one_full_list():
    client = ScriptedClient([
        page([cm("a", "1")], "10", cont="tok"),
        Gone(410, "Expired", "continue token expired"),
        page([cm("a", "1"), cm("b", "2")], "12"),
    ])
    queue = DeltaQueue()
    reflector = Reflector(client, CONFIGMAPS, queue, watch_list=False)
    [replaced] = await run_until(reflector, queue, 1)
    assert replaced.type is DeltaType.REPLACED
    assert [o["metadata"]["name"] for o in replaced.payload] == ["a", "b"]
    assert client.requests[0] == {"limit": PAGE_SIZE}
    assert client.requests[1] == {"limit": PAGE_SIZE, "continue": "tok"}
    assert "continue" not in client.requests[2] and "limit" not in client.requests[2]
    assert reflector.last_resource_version == "12"


async def test_the_full_list_after_an_expired_token_is_transformed_a_page_at_a_time(monkeypatch):
    # One step of the loop for 150,000 pods was seconds, past the point where the Lease stops renewing.
    import pykcm.informers.reflector as reflector_module

    monkeypatch.setattr(reflector_module, "PAGE_SIZE", 1)
    client = ScriptedClient([
        page([cm("a", "1")], "10", cont="tok"),
        Gone(410, "Expired", "continue token expired"),
        page([cm("a", "1"), cm("b", "2"), cm("c", "3")], "12"),
    ])
    queue = DeltaQueue()
    reflector = Reflector(client, CONFIGMAPS, queue, watch_list=False)
    transformed: list[tuple[str, int]] = []  # each object's name, and the loop turns seen before it
    async with LoopTurns() as turns:
        reflector.transform = lambda obj: (transformed.append((obj["metadata"]["name"], turns.count)), obj)[1]
        [replaced] = await run_until(reflector, queue, 1)
    assert [o["metadata"]["name"] for o in replaced.payload] == ["a", "b", "c"]
    assert all(o["kind"] == "ConfigMap" for o in replaced.payload)
    assert [name for name, _ in transformed] == ["a", "a", "b", "c"]
    full_list = [turn for _, turn in transformed[1:]]
    assert full_list[0] < full_list[1] < full_list[2]  # the loop turned between the full list's objects


async def test_watch_resumes_from_list_rv_with_bookmarks_and_strips_managed_fields():
    client = ScriptedClient(
        [page([cm("a", "1", managedFields=[{"manager": "x"}])], "10")],
        watches=[[
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
            {"type": "ADDED", "object": cm("b", "16", managedFields=[{}])},
        ]],
    )
    queue = DeltaQueue()
    reflector = Reflector(client, CONFIGMAPS, queue, watch_list=False)
    replaced, bookmark, added = await run_until(reflector, queue, 3)
    assert "managedFields" not in replaced.payload[0]["metadata"]
    assert added.type is DeltaType.ADDED and "managedFields" not in added.payload["metadata"]
    # Each delta says where the cache stands once applied, bookmarks included.
    assert [replaced.resource_version, bookmark.resource_version, added.resource_version] == ["10", "15", "16"]
    assert bookmark.type is DeltaType.BOOKMARK
    params = client.watch_params[0]
    assert params["resourceVersion"] == "10" and params["allowWatchBookmarks"] == "true"
    assert 300 <= params["timeoutSeconds"] < 600
    assert reflector.last_resource_version == "16"


async def test_watch_error_410_relists_and_the_next_watch_starts_from_the_new_list():
    client = ScriptedClient(
        [page([cm("a", "1")], "10"), page([cm("b", "30")], "30")],
        watches=[[{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}], []],
    )
    queue = DeltaQueue()
    reflector, _ = reflector_with(client, queue)
    first, second = await run_until(reflector, queue, 2)
    assert first.type is second.type is DeltaType.REPLACED
    assert [o["metadata"]["name"] for o in second.payload] == ["b"]
    await asyncio.sleep(0)  # let the reflector open its next watch
    assert client.watch_params[-1]["resourceVersion"] == "30"


@pytest.mark.parametrize("rv", ["", "abc"])
def test_non_numeric_resource_versions_are_kept_but_not_exported(rv):
    reflector = Reflector(ScriptedClient([]), CONFIGMAPS, DeltaQueue())
    reflector._set_resource_version(rv)
    assert reflector.last_resource_version == rv


EXPIRED_EVENT = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}


@pytest.mark.parametrize("expiry", [[EXPIRED_EVENT], Gone(410, "Expired", "too old resource version")],
                         ids=["error-event", "watch-request"])
async def test_expired_watch_relists_only_after_the_list_and_watch_backoff(expiry):
    """client-go's Run is `delayHandler.Until(ListAndWatch)`: a 410 ends ListAndWatch, and the
    relist waits for the next backoff delay like any other end of ListAndWatch."""
    client = ScriptedClient([page([cm("a", "1")], "10"), page([cm("b", "30")], "30")], watches=[expiry, []])
    queue = DeltaQueue()
    reflector, backoff = reflector_with(client, queue)
    await run_until(reflector, queue, 2)
    assert len(client.requests) == 2 and backoff.delays == 1


async def test_throttled_watch_backs_off_and_watches_again_without_relisting():
    throttled = TooManyRequests(429, "TooManyRequests", "slow down")
    client = ScriptedClient(
        [page([cm("a", "1")], "10")],
        watches=[throttled, [{"type": "ADDED", "object": cm("b", "11")}]],
    )
    queue = DeltaQueue()
    reflector, backoff = reflector_with(client, queue)
    await run_until(reflector, queue, 2)
    assert len(client.requests) == 1 and backoff.delays == 1
    assert [p["resourceVersion"] for p in client.watch_params] == ["10", "10"]


async def test_very_short_watch_backs_off_then_relists_as_client_go():
    client = ScriptedClient([page([cm("a", "1")], "10"), page([cm("a", "1")], "12")], watches=[[], []])
    queue = DeltaQueue()
    reflector, backoff = reflector_with(client, queue)
    await run_until(reflector, queue, 2)
    assert len(client.requests) == 2 and backoff.delays == 1


def test_backoff_manager_steps_like_client_gos_and_restarts_every_reset_interval():
    """wait.Backoff{0.8s, x2, cap 30s}.DelayWithReset(clock, 2m): the sequence starts over once
    2 minutes have passed since it (re)started, however recent the last step was."""
    now = [0.0]
    backoff = BackoffManager(0.8, 30.0, factor=2.0, jitter=0.0, reset_interval=120.0, clock=lambda: now[0])
    delays = []
    for _ in range(8):
        delays.append(backoff.next())
        now[0] += 15.0
    assert delays == pytest.approx([0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0])
    now[0] = 120.5  # the last step was at 105 s, but the sequence started at 0 s
    assert backoff.next() == pytest.approx(0.8)
    assert backoff.next() == pytest.approx(1.6)


def test_backoff_manager_jitter_stays_within_one_factor():
    backoff = BackoffManager(0.8, 30.0, factor=2.0, jitter=1.0, reset_interval=120.0)
    first = backoff.next()
    assert 0.8 <= first < 1.6


# -- the streamed initial state (client-go's watch-list) ------------------------------------------


def initial_events_end(rv: str) -> dict:
    return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv,
                                                        "annotations": {INITIAL_EVENTS_END: "true"}}}}


def streaming_reflector(client: ScriptedClient, queue: DeltaQueue) -> tuple[Reflector, RecordingBackoff]:
    backoff = RecordingBackoff()
    return Reflector(client, CONFIGMAPS, queue, backoff=backoff, watch_list=True), backoff


async def test_initial_state_is_streamed_then_the_same_watch_goes_on():
    client = ScriptedClient([], watches=[[
        {"type": "ADDED", "object": cm("a", "3", managedFields=[{}])},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "8"}}},  # progress, not the end
        {"type": "ADDED", "object": cm("b", "7")},
        initial_events_end("9"),
        {"type": "MODIFIED", "object": cm("a", "10")},
    ]])
    queue = DeltaQueue()
    reflector, _ = streaming_reflector(client, queue)
    replaced, modified = await run_until(reflector, queue, 2)
    # One replace with every streamed object, as one LIST would give; nothing listed.
    assert replaced.type is DeltaType.REPLACED and replaced.resource_version == "9"
    assert [o["metadata"]["name"] for o in replaced.payload] == ["a", "b"]
    assert "managedFields" not in replaced.payload[0]["metadata"]
    assert modified.type is DeltaType.UPDATED and modified.resource_version == "10"
    assert client.requests == [] and len(client.watch_params) == 1
    params = client.watch_params[0]
    assert params["sendInitialEvents"] == "true" and params["resourceVersionMatch"] == "NotOlderThan"
    assert params["resourceVersion"] == "" and params["allowWatchBookmarks"] == "true"
    assert reflector.last_resource_version == "10"


async def test_a_stream_cut_before_its_end_is_streamed_again_from_scratch():
    cut = TooManyRequests(429, "TooManyRequests", "slow down")

    client = ScriptedClient([], watches=[
        [{"type": "ADDED", "object": cm("gone-meanwhile", "3")}],  # closed by the server mid-stream
        cut,
        [{"type": "ADDED", "object": cm("b", "7")}, initial_events_end("9")],
    ])
    queue = DeltaQueue()
    reflector, backoff = streaming_reflector(client, queue)
    [replaced] = await run_until(reflector, queue, 1)
    assert [o["metadata"]["name"] for o in replaced.payload] == ["b"]
    assert [p.get("sendInitialEvents") for p in client.watch_params] == ["true"] * 3
    assert client.requests == [] and backoff.delays == 1  # the 429 backs off; the server's close does not


async def test_what_a_broken_stream_sent_is_not_kept_through_the_backoff():
    """The next stream sends everything again: the objects of the cut one would only hold memory
    for as long as the backoff lasts (up to 30 s)."""
    broken = TransportError("connection reset")
    client = ScriptedClient([], watches=[
        [{"type": "ADDED", "object": cm("a", "3")}, broken],
        [{"type": "ADDED", "object": cm("b", "7")}, initial_events_end("9")],
    ])
    queue = DeltaQueue()
    reflector, backoff = streaming_reflector(client, queue)
    held_while_waiting: list[object] = []
    next_delay = backoff.next

    def next_noting_what_is_held() -> float:
        held_while_waiting.append(reflector._initial)
        return next_delay()

    backoff.next = next_noting_what_is_held  # type: ignore[method-assign]
    [replaced] = await run_until(reflector, queue, 1)
    assert [o["metadata"]["name"] for o in replaced.payload] == ["b"]
    assert held_while_waiting == [None]
    assert [p.get("sendInitialEvents") for p in client.watch_params] == ["true"] * 2  # streamed again


async def test_a_server_refusing_the_stream_is_listed_instead_and_watched_from_the_list():
    refused = Invalid(422, "Invalid",
                      "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled")
    client = ScriptedClient([page([cm("a", "1")], "10")],
                            watches=[refused, [{"type": "ADDED", "object": cm("b", "11")}]])
    queue = DeltaQueue()
    reflector, backoff = streaming_reflector(client, queue)
    replaced, added = await run_until(reflector, queue, 2)
    assert replaced.type is DeltaType.REPLACED and replaced.resource_version == "10"
    assert added.type is DeltaType.ADDED
    assert client.requests == [{"limit": PAGE_SIZE}] and backoff.delays == 0
    assert "sendInitialEvents" not in client.watch_params[1] and client.watch_params[1]["resourceVersion"] == "10"


async def test_a_410_while_streaming_relists_by_streaming_again():
    client = ScriptedClient([], watches=[[EXPIRED_EVENT], [{"type": "ADDED", "object": cm("b", "7")},
                                                          initial_events_end("9")]])
    queue = DeltaQueue()
    reflector, backoff = streaming_reflector(client, queue)
    [replaced] = await run_until(reflector, queue, 1)
    assert replaced.resource_version == "9" and client.requests == [] and backoff.delays == 1


async def test_a_long_stream_hands_the_loop_back_while_it_arrives():
    names = [f"cm-{i}" for i in range(3 * STREAM_YIELD_EVERY)]
    client = ScriptedClient([], watches=[[*({"type": "ADDED", "object": cm(n, "1")} for n in names),
                                          initial_events_end("2")]])
    queue = DeltaQueue()
    reflector, _ = streaming_reflector(client, queue)
    async with LoopTurns() as turns:
        [replaced] = await run_until(reflector, queue, 1)
    assert len(replaced.payload) == len(names) and turns.count >= 3


async def test_an_event_the_protobuf_decoder_cannot_read_turns_the_watch_to_json():
    # One pod with a time the decoder could not read used to freeze the pods cache: every relist
    # failed on it again.
    decoder = WatchDecoder({"metadata": {"name": True}})
    client = ScriptedClient(
        [page([cm("a", "1")], "10"), page([cm("a", "1"), cm("bad", "11")], "12")],
        watches=[UndecodableEvent("ns/bad", OverflowError("timestamp out of range")),
                 [{"type": "ADDED", "object": cm("b", "13")}]],
    )
    queue = DeltaQueue()
    reflector, _ = reflector_with(client, queue)
    reflector.watch_decoder = decoder
    first, second, added = await run_until(reflector, queue, 3)
    assert (first.type, second.type, added.type) == (DeltaType.REPLACED, DeltaType.REPLACED, DeltaType.ADDED)
    assert [o["metadata"]["name"] for o in second.payload] == ["a", "bad"]
    assert client.watch_decoders == [decoder, None] and reflector.watch_decoder is None


async def test_a_watch_cut_after_events_is_resumed_at_once_from_the_last_version():
    # client-go's stream watcher ends on an EOF or a reset as on a server's close: no backoff.
    reset = TransportError("watch configmaps: connection reset by peer", True, ended=True)
    client = ScriptedClient([page([cm("a", "1")], "10")],
                            watches=[[{"type": "ADDED", "object": cm("b", "11")}, reset],
                                     [{"type": "ADDED", "object": cm("c", "12")}]])
    queue = DeltaQueue()
    reflector, backoff = reflector_with(client, queue)
    listed, b, c = await run_until(reflector, queue, 3)
    assert (listed.type, b.type, c.type) == (DeltaType.REPLACED, DeltaType.ADDED, DeltaType.ADDED)
    assert client.watch_params[1]["resourceVersion"] == "11" and backoff.delays == 0


async def test_a_watch_cut_before_any_event_backs_off_before_watching_again():
    reset = TransportError("watch configmaps: connection reset by peer", True, ended=True)
    client = ScriptedClient([page([cm("a", "1")], "10")],
                            watches=[[reset], [{"type": "ADDED", "object": cm("c", "12")}]])
    queue = DeltaQueue()
    reflector, backoff = reflector_with(client, queue)
    await run_until(reflector, queue, 2)
    assert client.watch_params[1]["resourceVersion"] == "10" and backoff.delays == 1 and len(client.requests) == 1


async def test_a_watch_stream_that_breaks_with_bytes_that_are_no_http_backs_off_even_after_events():
    # To client-go that is an error event, not an end: no re-watch at once, however many events came.
    broken = TransportError("watch configmaps: bad chunk size: b'zz-not-a-chunk-size'")
    client = ScriptedClient([page([cm("a", "1")], "10")],
                            watches=[[{"type": "ADDED", "object": cm("b", "11")}, broken],
                                     [{"type": "ADDED", "object": cm("c", "12")}]])
    queue = DeltaQueue()
    reflector, backoff = reflector_with(client, queue)
    await run_until(reflector, queue, 3)
    assert client.watch_params[1]["resourceVersion"] == "11" and backoff.delays == 1


# -- what it logs: client-go's reflector.go texts and levels -----------------------------------------


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, str, dict]]:
    """The reflector's lines: level name, V level, message, key/values."""
    return [(r.levelname, r.v, r.getMessage(), r.kv) for r in caplog.records  # type: ignore[attr-defined]
            if r.name == "pykcm.reflector"]


@pytest.mark.parametrize("verbosity", [2], indirect=True)
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_filled_cache_says_caches_populated_at_v2(streamed: bool, verbosity: None, caplog) -> None:
    client = ScriptedClient([page([cm("a", "1")], "10")], watches=[[
        {"type": "ADDED", "object": cm("a", "1")}, initial_events_end("10")]] if streamed else [])
    queue = DeltaQueue()
    reflector = Reflector(client, CONFIGMAPS, queue, backoff=RecordingBackoff(), watch_list=streamed)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await run_until(reflector, queue, 1)
    populated = {"resource": "configmaps", "items": 1, "resourceVersion": "10"}
    assert lines(caplog) == [("INFO", 2, "Caches populated", populated)]


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_an_expired_watch_says_watch_closed_at_v4_only(verbosity: None, caplog) -> None:
    client = ScriptedClient([page([cm("a", "1")], "10"), page([cm("b", "30")], "30")], watches=[[EXPIRED_EVENT], []])
    queue = DeltaQueue()
    reflector, _ = reflector_with(client, queue)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await run_until(reflector, queue, 2)
    [closed] = [line for line in lines(caplog) if line[2] == "Watch closed"]
    assert closed[:2] == ("INFO", 4) and list(closed[3]) == ["resource", "err"]
    assert [line for line in lines(caplog) if line[1] < 2] == []


@pytest.mark.parametrize("verbosity", [4], indirect=True)
@pytest.mark.parametrize(("failure", "streamed", "said"), [
    (TransportError("dial tcp: connection refused"), False, (4, "Watch failed - backing off")),
    (TooManyRequests(429, "TooManyRequests", "slow down"), False, (2, "Watch returned 429 - backing off")),
    (TooManyRequests(429, "TooManyRequests", "slow down"), True, (2, "watch-list failed - backing off")),
], ids=["transport", "429", "429-streaming"])
async def test_a_retried_watch_failure_is_an_info_line_at_client_gos_level(
    failure: Exception, streamed: bool, said: tuple[int, str], verbosity: None, caplog
) -> None:
    then = [{"type": "ADDED", "object": cm("b", "11")}] + ([initial_events_end("11")] if streamed else [])
    client = ScriptedClient([page([cm("a", "1")], "10")], watches=[failure, then])
    queue = DeltaQueue()
    reflector = Reflector(client, CONFIGMAPS, queue, backoff=RecordingBackoff(), watch_list=streamed)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await run_until(reflector, queue, 1 if streamed else 2)
    assert [line[:3] for line in lines(caplog) if line[2] != "Caches populated"] == [("INFO", *said)]


@pytest.mark.parametrize("verbosity", [0], indirect=True)
@pytest.mark.parametrize(("failure", "err"), [
    ({"type": "ERROR", "object": {"kind": "Status", "code": 500, "reason": "InternalError", "message": "etcd is down"}},
     "etcd is down"),
    ({"type": "UPSERTED", "object": {}},  # client-go's decoder refuses the type: its decoding error event
     "unable to decode an event from the watch stream: got invalid watch event type: UPSERTED"),
], ids=["error", "bad-type"])
async def test_an_error_event_in_an_open_watch_is_client_gos_warning_then_a_relist(
    failure: dict, err: str, verbosity: None, caplog
) -> None:
    # client-go's watch loop logs it and returns (a relist after the backoff); "Failed to watch" is
    # its watchErrorHandler's, for a watch that could not be opened.
    client = ScriptedClient([page([cm("a", "1")], "10"), page([cm("b", "20")], "20")],
                            watches=[[{"type": "ADDED", "object": cm("c", "11")}, failure], []])
    queue = DeltaQueue()
    reflector, backoff = reflector_with(client, queue)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        deltas = await run_until(reflector, queue, 3)
    assert [d.type for d in deltas] == [DeltaType.REPLACED, DeltaType.ADDED, DeltaType.REPLACED]
    said = [line for line in lines(caplog) if line[2] != "Caches populated"]
    assert [line[:3] for line in said] == [("INFO", 0, "Warning: watch ended with error")]
    assert said[0][3]["err"] == err and backoff.delays == 1


@pytest.mark.parametrize("verbosity", [3], indirect=True)
async def test_an_expired_continue_token_says_nothing_below_v4_as_client_gos_pager(verbosity: None, caplog) -> None:
    client = ScriptedClient([page([cm("a", "1")], "10", cont="tok"), Gone(410, "Expired", "continue token expired"),
                             page([cm("a", "1")], "12")])
    queue = DeltaQueue()
    reflector, _ = reflector_with(client, queue)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await run_until(reflector, queue, 1)
    assert [line for line in lines(caplog) if line[2] != "Caches populated"] == []


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_a_failed_list_says_failed_to_watch_as_handle_error_then_once_a_minute(verbosity: None, caplog) -> None:
    refused = TransportError("dial tcp: connection refused")
    client = ScriptedClient([refused, refused, page([cm("a", "1")], "10")])
    queue = DeltaQueue()
    reflector, _ = reflector_with(client, queue)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await run_until(reflector, queue, 1)
    failed = [line for line in lines(caplog) if line[2] == "Failed to watch"]
    kv = {"resource": "configmaps", "logger": "UnhandledError", "err": "dial tcp: connection refused"}
    assert failed == [("ERROR", 0, "Failed to watch", kv), ("INFO", 4, "Failed to watch", kv)]


@pytest.mark.parametrize("verbosity", [0], indirect=True)
async def test_a_very_short_watch_is_client_gos_warning_line(verbosity: None, caplog) -> None:
    client = ScriptedClient([page([cm("a", "1")], "10"), page([cm("a", "1")], "12")], watches=[[], []])
    queue = DeltaQueue()
    reflector, _ = reflector_with(client, queue)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await run_until(reflector, queue, 2)
    assert [line[:3] for line in lines(caplog)] == [("INFO", 0, "Warning: watch ended with error")]


@pytest.mark.parametrize("verbosity", [2], indirect=True)
@pytest.mark.parametrize(("streamed", "trace"), [(False, "Reflector ListAndWatch"), (True, "Reflector WatchList")])
async def test_a_list_over_the_threshold_is_said_as_client_gos_trace(
    streamed: bool, trace: str, verbosity: None, caplog, monkeypatch
) -> None:
    import pykcm.informers.reflector as reflector_module

    monkeypatch.setattr(reflector_module, "LONG_LIST", 0.0)  # client-go's LogIfLong(10 * time.Second)
    client = ScriptedClient([page([cm("a", "1"), cm("b", "2")], "10")], watches=[[
        {"type": "ADDED", "object": cm("a", "1")}, {"type": "ADDED", "object": cm("b", "2")},
        initial_events_end("10")]] if streamed else [])
    queue = DeltaQueue()
    reflector = Reflector(client, CONFIGMAPS, queue, backoff=RecordingBackoff(), watch_list=streamed)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await run_until(reflector, queue, 1)
    [said] = [line for line in lines(caplog) if line[2] == trace]
    assert said[:2] == ("INFO", 2) and list(said[3]) == ["resource", "items", "duration"] and said[3]["items"] == 2


@pytest.mark.parametrize("verbosity", [9], indirect=True)
async def test_a_quick_list_is_no_trace(verbosity: None, caplog) -> None:
    client = ScriptedClient([page([cm("a", "1")], "10")])
    queue = DeltaQueue()
    reflector, _ = reflector_with(client, queue)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await run_until(reflector, queue, 1)
    assert [line[2] for line in lines(caplog)] == ["Caches populated"]
