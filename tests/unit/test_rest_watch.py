"""Watch streams are split into events by hand: many events in one chunk, events split across
chunks, blank lines, and lines longer than aiohttp's readline limit; protobuf frames likewise."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from pykcm.client.config import ClientConfig
from pykcm.client.protobuf import MAGIC, WATCH_ACCEPT, WatchDecoder
from pykcm.client.resources import CONFIGMAPS, PODS
from pykcm.client.rest import RestClient
from tests.support import loopback_server


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


def field(number: int, payload: bytes | str) -> bytes:
    """A length-delimited protobuf field (every length here fits one byte)."""
    data = payload.encode() if isinstance(payload, str) else payload
    assert len(data) < 0x80
    return bytes([number << 3 | 2, len(data)]) + data


def pod_frame(name: str) -> bytes:
    """One frame of a protobuf watch: its length, then WatchEvent{type, RawExtension{envelope}}."""
    meta = field(1, name) + field(3, "ns") + field(6, "7") + field(11, field(1, "app") + field(2, "x"))
    envelope = MAGIC + field(1, field(1, "v1") + field(2, "Pod")) + field(2, field(1, meta))
    event = field(1, "ADDED") + field(2, field(1, envelope))
    return len(event).to_bytes(4, "big") + event


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
