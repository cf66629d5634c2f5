"""Watch streams are split into events by hand: many events in one chunk, events split across
chunks, blank lines, and lines longer than aiohttp's readline limit."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from pykcm.client.config import ClientConfig
from pykcm.client.resources import CONFIGMAPS
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
