"""Watch streams are split into events by hand: many events in one chunk, events split across
chunks, blank lines, and lines longer than aiohttp's readline limit; protobuf frames likewise."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from pykcm.client.config import ClientConfig
from pykcm.client.errors import TransportError
from pykcm.client.protobuf import MAGIC, WATCH_ACCEPT, UndecodableEvent, WatchDecoder
from pykcm.client.resources import CONFIGMAPS, PODS
from pykcm.client.rest import MAX_WATCH_FRAME, RestClient
from tests.protowire import field, number
from tests.support import loopback_server
from tests.unit.test_http import raw_server, read_request


def event(name: str, padding: int = 0) -> bytes:
    obj = {"metadata": {"name": name, "resourceVersion": "2"}, "data": {"x": "y" * padding}}
    return orjson.dumps({"type": "ADDED", "object": obj})


async def test_events_are_split_whatever_the_chunks() -> None:
    many = b"".join(event(f"m{i}") + b"\n" for i in range(50))
    big = event("big", padding=300_000) + b"\n"
    split = event("split") + b"\n"

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for piece in (many, b"\n  \n", big[:1000], big[1000:], split[:10]):
            await resp.write(piece)
            await asyncio.sleep(0.01)  # separate chunks
        await resp.write(split[10:])
        return resp

    async with loopback_server(handle) as url:
        client = RestClient(ClientConfig(host=url, ssl_context=None))
        try:
            names = [e["object"]["metadata"]["name"] async for e in client.watch(CONFIGMAPS.path("ns"), {})]
        finally:
            await client.close()
    assert names == [*(f"m{i}" for i in range(50)), "big", "split"]


def watch_event(pod: bytes) -> bytes:
    """WatchEvent{type, RawExtension{envelope}} of a pod's message."""
    envelope = MAGIC + field(1, field(1, "v1") + field(2, "Pod")) + field(2, pod)
    return field(1, "ADDED") + field(2, field(1, envelope))


def pod_frame(name: str) -> bytes:
    """One frame of a protobuf watch: its length, then the event."""
    meta = field(1, name) + field(3, "ns") + field(6, "7") + field(11, field(1, "app") + field(2, "x"))
    event = watch_event(field(1, meta))
    return len(event).to_bytes(4, "big") + event


def timestamp(seconds: int) -> bytes:
    """Timestamp{1 seconds}: an int64 varint, ten bytes of two's complement below zero."""
    return number(1, seconds)


async def test_protobuf_frames_are_split_whatever_the_chunks() -> None:
    many = b"".join(pod_frame(f"m{i}") for i in range(20))
    split = pod_frame("split")

    async def handle(request: web.Request) -> web.StreamResponse:
        assert request.headers["Accept"] == f"{WATCH_ACCEPT}, application/json"  # JSON if it must, as client-go
        resp = web.StreamResponse(headers={"Content-Type": WATCH_ACCEPT})
        await resp.prepare(request)
        for piece in (many, split[:2], split[2:9]):  # inside the length, then inside the event
            await resp.write(piece)
            await asyncio.sleep(0.01)
        await resp.write(split[9:])
        return resp

    decoder = WatchDecoder({"kind": True, "apiVersion": True, "metadata": {"name": True, "labels": True}})
    async with loopback_server(handle) as url:
        client = RestClient(ClientConfig(host=url, ssl_context=None))
        try:
            events = [e async for e in client.watch(PODS.path(), {}, decoder=decoder)]
        finally:
            await client.close()
    assert [e["object"]["metadata"]["name"] for e in events] == [*(f"m{i}" for i in range(20)), "split"]
    assert events[0] == {"type": "ADDED", "object": {"kind": "Pod", "apiVersion": "v1",
                                                     "metadata": {"name": "m0", "labels": {"app": "x"}}}}


def test_times_before_1970_read_as_json_has_them() -> None:
    # Timestamp.seconds is signed: a condition set to 1960 once froze the pods informer (the
    # unsigned value overflowed time.gmtime), and year 1 came out as "1-01-01".
    year_1, year_1960 = timestamp(-62135596799), timestamp(-315619200)
    condition = field(1, "Ready") + field(2, "False") + field(3, year_1) + field(4, year_1960)
    meta = field(1, "old") + field(3, "ns")
    decoder = WatchDecoder({"metadata": {"name": True}, "status": {"conditions": True}})
    pod = decoder.event(watch_event(field(1, meta) + field(3, field(2, condition))))["object"]
    assert pod["status"]["conditions"] == [{"type": "Ready", "status": "False", "lastProbeTime": "0001-01-01T00:00:01Z",
                                            "lastTransitionTime": "1960-01-01T00:00:00Z"}]


def test_an_event_that_does_not_decode_names_its_object() -> None:
    cut_short = bytes([3 << 3 | 2, 9, 2 << 3 | 2, 7])  # status, 9 bytes long, of which 2 came
    decoder = WatchDecoder({"metadata": {"name": True}, "status": {"conditions": True}})
    with pytest.raises(UndecodableEvent, match=r"^cannot decode the protobuf watch event of ns/bad: ") as err:
        decoder.event(watch_event(field(1, field(1, "bad") + field(3, "ns")) + cut_short))
    assert err.value.key == "ns/bad"


async def test_a_watch_does_not_wait_for_the_rate_limiter() -> None:
    """As client-go's Watch: with the token bucket empty, a (re-)watch goes out at once."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response({"kind": "ConfigMapList", "items": []})
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(event("w") + b"\n")
        return resp

    async with loopback_server(handle) as url:
        client = RestClient(ClientConfig(host=url, ssl_context=None, qps=0.01, burst=1))
        try:
            await client.request("GET", CONFIGMAPS.path("ns"))  # the bucket's one token
            events = await asyncio.wait_for(_collect(client.watch(CONFIGMAPS.path("ns"), {})), 5)
        finally:
            await client.close()
    assert [e["object"]["metadata"]["name"] for e in events] == ["w"]


async def _collect(stream: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e async for e in stream]


class Chunked:
    """A watch response handing `body` out `size` bytes at a time."""

    def __init__(self, body: bytes, size: int, content_type: str) -> None:
        self.headers = {"content-type": content_type}
        self._body, self._size, self._at = body, size, 0

    async def next_chunk(self) -> bytes | None:
        if self._at >= len(self._body):
            return None
        self._at += self._size
        return self._body[self._at - self._size : self._at]

    def close(self) -> None:
        pass


async def watched(body: bytes, size: int, decoder: WatchDecoder | None, content_type: str = WATCH_ACCEPT) -> list:
    client = RestClient(ClientConfig(host="http://127.0.0.1:1", ssl_context=None))

    async def opened(*args: Any) -> Chunked:
        return Chunked(body, size, content_type)

    client._open_watch = opened  # type: ignore[method-assign]
    try:
        return [e async for e in client.watch(PODS.path(), {}, decoder=decoder)]
    finally:
        await client.close()


def padded_pod_frame(name: str, size: int) -> bytes:
    """A frame whose event is `size` bytes long: a pod padded with a field no pod has."""
    def event(padding: int) -> bytes:
        meta = field(1, name) + field(99, b"x" * padding)
        unknown = field(1, field(1, "v1") + field(2, "Pod")) + field(2, field(1, meta)) + b"\x1a\x00\x22\x00"
        return field(1, "ADDED") + field(2, field(1, MAGIC + unknown))

    padding = size
    while len(data := event(padding)) != size:
        padding += size - len(data)
    return len(data).to_bytes(4, "big") + data


def decoding_error(err: str) -> dict[str, Any]:
    """client-go's StreamWatcher's ERROR event, as its ClientWatchDecoding reporter makes it."""
    message = f"unable to decode an event from the watch stream: {err}"
    return {"type": "ERROR", "object": {
        "kind": "Status", "status": "Failure", "code": 500, "reason": "InternalError",
        "message": f'an error on the server ("{message}") has prevented the request from succeeding',
        "details": {"causes": [{"reason": "UnexpectedServerResponse", "message": message},
                               {"reason": "ClientWatchDecoding", "message": message}]}}}


async def test_a_frame_larger_than_client_gos_limit_ends_the_watch_as_client_go_ends_it() -> None:
    # The length was taken at face value: up to 4 GiB were buffered for one event.
    decoder = WatchDecoder({"metadata": {"name": True}})
    largest = padded_pod_frame("largest", MAX_WATCH_FRAME)
    body = largest + (MAX_WATCH_FRAME + 1).to_bytes(4, "big") + pod_frame("after")
    events = await watched(body, 1 << 16, decoder)
    assert events[0] == {"type": "ADDED", "object": {"metadata": {"name": "largest"}}}
    assert events[1:] == [decoding_error("object to decode was longer than maximum allowed size")]


async def test_an_empty_frame_ends_the_watch_as_client_go_ends_it() -> None:
    # Not an undecodable event (which reads the watch as JSON from then on): client-go reports
    # "empty data" and watches again, in protobuf.
    body = pod_frame("a") + bytes(4) + pod_frame("b")
    events = await watched(body, 7, WatchDecoder({"metadata": {"name": True}}))
    assert events == [{"type": "ADDED", "object": {"metadata": {"name": "a"}}}, decoding_error("empty data")]


@pytest.mark.parametrize("line", [b"{not json", b"[1, 2]"])
async def test_a_json_line_that_is_no_event_ends_the_watch_as_client_go_ends_it(line: bytes) -> None:
    # It raised out of the watch (the reflector's "Failed to watch"); client-go's StreamWatcher
    # turns it into its decoding ERROR event, then the reflector lists again.
    body = event("a") + b"\n" + line + b"\n" + event("b") + b"\n"
    events = await watched(body, 7, None, "application/json")
    assert events[0]["object"]["metadata"]["name"] == "a" and len(events) == 2
    [cause] = [c for c in events[1]["object"]["details"]["causes"] if c["reason"] == "ClientWatchDecoding"]
    assert events[1]["type"] == "ERROR" and cause["message"].startswith("unable to decode an event from the watch")


@pytest.mark.parametrize("protobuf", [True, False])
async def test_an_event_over_many_chunks_takes_linear_time(protobuf: bool) -> None:
    # Each chunk of an unfinished event copied (and for JSON searched) the whole of it again:
    # 8 MiB in 1 KiB chunks took 1.5 s and more, now some 50 ms.
    if protobuf:
        body, decoder, content_type = padded_pod_frame("big", 8 << 20), WatchDecoder({"metadata": {"name": True}}), \
            WATCH_ACCEPT
    else:
        body, decoder, content_type = event("big", padding=8 << 20) + b"\n", None, "application/json"
    started = time.monotonic()
    events = await watched(body, 1024, decoder, content_type)
    assert time.monotonic() - started < 0.5
    assert [e["object"]["metadata"]["name"] for e in events] == ["big"]


@pytest.mark.parametrize(("tail", "ended"), [
    (None, True),  # a reset after the event: an end to client-go's stream watcher
    (b"zz-not-a-chunk-size\r\n", False),  # bytes that are no HTTP: an error event to it
])
async def test_how_a_watch_stream_broke_is_told_apart(tail: bytes | None, ended: bool) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    line = event("a") + b"\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(head + b"%x\r\n%s\r\n" % (len(line), line))
        await writer.drain()
        await asyncio.sleep(0.05)
        if tail is None:  # SO_LINGER 0: the close is a RST
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        writer.write(tail)
        await writer.drain()
        await asyncio.sleep(1)

    async with raw_server(handle) as url:
        api = RestClient(ClientConfig(host=url, ssl_context=None))
        seen = []
        with pytest.raises(TransportError) as raised:
            async for watched in api.watch(CONFIGMAPS.path(), {}):
                seen.append(watched["object"]["metadata"]["name"])
        await api.close()
    assert seen == ["a"] and raised.value.ended is ended and raised.value.connection_reset is (tail is None)
