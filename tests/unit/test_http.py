"""The HTTP/1.1 client (pykcm.client.http) against real servers on loopback: aiohttp's for the
ordinary exchanges, raw asyncio ones for what a server may do at the edges (awkward chunking,
closing idle or half-answered connections, answering slowly or not at all)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from pykcm.app import eventloop
from pykcm.client import http
from pykcm.client.config import ClientConfig
from pykcm.client.errors import NotFound, TransportError
from pykcm.client.http import ConnectionPool, Timeout
from pykcm.client.httpconnection import HTTPConnection, HTTPError
from pykcm.client.resources import CONFIGMAPS
from pykcm.client.rest import RestClient
from tests.support import free_port, loopback_server
from tests.unit.test_fence import LOOPS, tls_contexts

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
QUICK = Timeout(total=5, connect=5)


@contextlib.asynccontextmanager
async def raw_server(handle: Handler, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """A TCP server on 127.0.0.1 running `handle` per connection, over TLS with `ssl_context`;
    yields its URL. Connections still open at the end are closed and their handlers cancelled."""
    handlers: set[asyncio.Task] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        try:  # cancelled at the end: ended quietly (3.11's start_server logs a cancelled handler)
            with contextlib.suppress(asyncio.CancelledError):
                await handle(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=ssl_context)
    try:
        yield f"{'https' if ssl_context else 'http'}://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body ("" at end of stream)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + await reader.readexactly(length)


def ok(body: bytes, *extra: bytes) -> bytes:
    head = [b"HTTP/1.1 200 OK", b"Content-Type: application/json", b"Content-Length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def answer_once(response: bytes) -> Handler:
    """A raw server's handler: reads one request and writes `response`, exactly as given."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response)
        await writer.drain()
    return handle


async def answer_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A raw server's handler: `{}` to every request, on one connection until the client closes it."""
    while await read_request(reader):
        writer.write(ok(b"{}"))
        await writer.drain()


def client(url: str) -> RestClient:
    return RestClient(ClientConfig(host=url, ssl_context=None, qps=1000, burst=1000))


# -- ordinary exchanges -----------------------------------------------------------------------------


async def test_requests_reuse_one_kept_alive_connection() -> None:
    peers: list[object] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        if request.method == "POST":
            return web.json_response({"echo": await request.json(), "query": dict(request.query)}, status=201)
        if request.path.endswith("/missing"):
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        return web.Response(text="ok")

    async with loopback_server(handle) as url:
        api = client(url)
        try:
            posted = await api.request("POST", "/api/v1/x", body={"a": "é"}, params={"dryRun": "All", "b": True})
            assert posted == {"echo": {"a": "é"}, "query": {"dryRun": "All", "b": "true"}}
            assert await api.request("GET", "/healthz", accept="text/plain") == "ok"
            with pytest.raises(NotFound):
                await api.get(CONFIGMAPS, "missing", "a")
        finally:
            await api.close()
    assert len(peers) == 3 and len(set(peers)) == 1


async def test_connection_close_and_length_less_bodies_are_not_reused() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        if connections == 1:
            writer.write(ok(b'{"n":1}', b"Connection: close"))
        else:  # no Content-Length: the body ends with the connection
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"n":2}')
        await writer.drain()
        writer.close()

    async with raw_server(handle) as url:
        api = client(url)
        try:
            assert await api.request("GET", "/a") == {"n": 1}
            assert await api.request("GET", "/b") == {"n": 2}
        finally:
            await api.close()
    assert connections == 2


async def test_awkwardly_split_gzipped_chunks_and_trailers() -> None:
    body = orjson.dumps({"items": [{"i": i} for i in range(200)]})
    packed = gzip.compress(body)
    chunked = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in (packed[:7], packed[7:300], packed[300:]))
    response = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\nX-Trailer: t\r\n\r\n")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader):
            for i in range(len(response)):  # a byte at a time: every boundary falls somewhere odd
                writer.write(response[i : i + 1])
                if i % 97 == 0:
                    await writer.drain()
                    await asyncio.sleep(0)
            await writer.drain()

    async with raw_server(handle) as url:
        api = client(url)
        try:
            assert await api.request("GET", "/a") == orjson.loads(body)
            assert await api.request("GET", "/b") == orjson.loads(body)  # the same connection, at a clean start
        finally:
            await api.close()


# -- stale and broken connections -------------------------------------------------------------------


async def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await read_request(reader))
        writer.write(ok(b"{}"))  # keep-alive promised, then closed anyway
        await writer.drain()
        writer.close()

    async with raw_server(handle) as url:
        api = client(url)
        try:
            await api.request("POST", "/a", body={})
            await asyncio.sleep(0.1)  # the close has reached the client
            await api.request("POST", "/b", body={})
        finally:
            await api.close()
    assert [r.split(b" ")[1] for r in received] == [b"/a", b"/b"]


@pytest.mark.parametrize(("method", "sent"), [("GET", 2), ("POST", 1), ("PUT", 1), ("DELETE", 1)])
async def test_only_a_get_is_sent_again_when_a_pooled_connection_dies_unanswered(method: str, sent: int) -> None:
    """The server reads the second request on the kept-alive connection and closes it without a
    byte of answer (it may or may not have acted on it): only a read may be sent again."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while request := await read_request(reader):
            received.append(request)
            if len(received) == 2:
                writer.close()
                return
            writer.write(ok(b'{"ok":true}'))
            await writer.drain()

    async with raw_server(handle) as url:
        api = client(url)
        try:
            await api.request("GET", "/first")
            if sent == 2:
                assert await api.request(method, "/second") == {"ok": True}
            else:
                with pytest.raises(TransportError, match="closed the connection"):
                    await api.request(method, "/second", body={})
        finally:
            await api.close()
    assert [r.split(b" ")[0].decode() for r in received[1:]] == [method] * sent


async def test_a_connection_that_died_in_an_exchange_is_freed_without_the_cyclic_collector(monkeypatch) -> None:
    """Its error's traceback holds its frames: held by the connection too, that is a cycle, which a
    relist's gc.freeze() (util/memory.py) would keep for good, TLS buffers and all."""
    made: weakref.WeakSet[HTTPConnection] = weakref.WeakSet()

    class Recorded(HTTPConnection):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.add(self)

    monkeypatch.setattr(http, "HTTPConnection", Recorded)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")  # then gone mid-body
        await writer.drain()
        writer.close()

    gc.disable()
    try:
        async with raw_server(handle) as url:
            pool = ConnectionPool(url, None, 4)
            for method in ("POST", "GET"):
                with pytest.raises(HTTPError):
                    await pool.request(method, "/x", {}, b"{}" if method == "POST" else None, QUICK)
            await asyncio.sleep(0.05)  # connection_lost has run
            await pool.close()
        assert len(made) == 0
    finally:
        gc.enable()


async def test_a_refused_connection_is_one_line_without_the_errno() -> None:
    api = client(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(TransportError) as err:
        await api.request("GET", "/healthz", accept="text/plain")
    await api.close()
    # uvloop says "Connection refused", asyncio's own loop "Connect call failed ('127.0.0.1', port)"
    assert str(err.value).startswith("GET /healthz: Conn") and "[Errno" not in str(err.value)


# -- timeouts, limits, throttling -------------------------------------------------------------------


async def test_a_silent_server_times_out_and_its_connection_is_dropped() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        if connections == 1:
            await read_request(reader)
            await asyncio.sleep(10)  # never answers
        await answer_ok(reader, writer)

    async with raw_server(handle) as url:
        api = client(url)
        try:
            start = time.monotonic()
            with pytest.raises(TransportError, match="took too long"):
                await api.request("GET", "/a", timeout=Timeout(total=0.3))
            assert 0.25 < time.monotonic() - start < 2
            assert await api.request("GET", "/b") == {}
        finally:
            await api.close()
    assert connections == 2


async def test_a_stream_times_out_between_reads_not_in_total() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(8):  # 0.8 s in all, but never 0.3 s without a byte
            writer.write(b"2\r\n{}\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
        await asyncio.sleep(10)

    async with raw_server(handle) as url:
        pool = ConnectionPool(url, None, limit=4)
        try:
            stream = await pool.stream("GET", "/watch", {}, Timeout(connect=5, read=0.3))
            chunks = []
            with pytest.raises(TimeoutError, match=r"no response data for 0\.3s"):
                while (chunk := await stream.next_chunk()) is not None:
                    chunks.append(chunk)
            stream.close()
            assert b"".join(chunks) == b"{}" * 8
        finally:
            await pool.close()


async def test_the_pool_opens_at_most_its_limit_and_expires_idle_connections() -> None:
    open_now = most = connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now, most, connections
        open_now += 1
        connections += 1
        most = max(most, open_now)
        while await read_request(reader):
            await asyncio.sleep(0.05)
            writer.write(ok(b"{}"))
            await writer.drain()
        open_now -= 1

    async with raw_server(handle) as url:
        pool = ConnectionPool(url, None, limit=2, idle_timeout=0.3)
        try:
            await asyncio.gather(*(pool.request("GET", f"/{i}", {}, None, QUICK) for i in range(6)))
            assert (most, connections) == (2, 2)
            await asyncio.sleep(0.5)  # both idle past the timeout: closed by the client
            assert open_now == 0
            await pool.request("GET", "/again", {}, None, QUICK)
        finally:
            await pool.close()
    assert connections == 3


async def test_a_waiter_woken_for_a_connection_but_cancelled_passes_the_wake_up_on() -> None:
    """Two requests wait for the pool's one connection; the first is woken as it frees up and is
    cancelled (its timeout) before it runs: the second must get the connection, not wait for ever."""

    async with raw_server(answer_ok) as url:
        pool = ConnectionPool(url, None, limit=1)
        try:
            held = await pool.stream("GET", "/held", {}, QUICK)
            first = asyncio.create_task(pool.request("GET", "/first", {}, None, QUICK))
            second = asyncio.create_task(pool.request("GET", "/second", {}, None, QUICK))
            while len(pool._waiters) < 2:
                await asyncio.sleep(0)
            held.close()  # wakes the first waiter...
            first.cancel()  # ...which leaves before it runs
            assert (await asyncio.wait_for(second, 5)).status == 200
            assert first.cancelled()
        finally:
            await pool.close()


async def test_a_429_is_retried_after_its_retry_after() -> None:
    answers = [web.Response(status=429, text="slow down", headers={"Retry-After": "1"}),
               web.json_response({"kind": "ConfigMap"})]
    times: list[float] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        times.append(time.monotonic())
        return answers.pop(0)

    async with loopback_server(handle) as url:
        api = client(url)
        try:
            assert await api.get(CONFIGMAPS, "c", "a") == {"kind": "ConfigMap"}
        finally:
            await api.close()
    assert len(times) == 2 and times[1] - times[0] >= 0.95


async def test_a_watch_event_bigger_than_the_pause_threshold() -> None:
    """A 6 MiB event (a huge CRD) in 64 KiB chunks: reading pauses past 4 MiB unconsumed and resumes."""
    big = orjson.dumps({"type": "ADDED", "object": {"metadata": {"name": "big"}, "data": {"x": "y" * (6 << 20)}}})
    small = orjson.dumps({"type": "ADDED", "object": {"metadata": {"name": "small"}}})
    payload = big + b"\n" + small + b"\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(payload), 65536):
            piece = payload[i : i + 65536]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with raw_server(handle) as url:
        api = client(url)
        try:
            events = [e async for e in api.watch(CONFIGMAPS.path("a"), {})]
        finally:
            await api.close()
    assert [e["object"]["metadata"]["name"] for e in events] == ["big", "small"]
    assert len(events[0]["object"]["data"]["x"]) == 6 << 20


async def test_a_stream_not_read_stops_reading_from_the_socket() -> None:
    """Past 4 MiB unconsumed the connection pauses reading: the server's writes back up instead of
    the client's memory growing; once read, everything arrives."""
    total, piece = 32 << 20, b"x" * 65536
    written = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        while written < total:
            writer.write(piece)
            await writer.drain()
            written += len(piece)

    async with raw_server(handle) as url:
        pool = ConnectionPool(url, None, limit=4)
        try:
            stream = await pool.stream("GET", "/big", {}, QUICK)
            await asyncio.sleep(0.5)
            assert written < 24 << 20  # 4 MiB taken in, the rest at most the kernel's socket buffers
            assert len(await stream.read()) == total
            stream.close()
        finally:
            await pool.close()


@pytest.mark.parametrize("loop", LOOPS)
def test_either_event_loop_over_tls(loop: str, tmp_path: Path) -> None:
    """uvloop's transports and TLS: chunks, a kept-alive connection, one the server closed while idle."""
    server_tls, client_tls = tls_contexts(tmp_path)
    peers: list[object] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if request.path == "/last":
            resp.force_close()
        await resp.prepare(request)
        for piece in (b'{"path": ', orjson.dumps(request.path), b"}"):
            await resp.write(piece)
        return resp

    async def scenario() -> list[object]:
        async with loopback_server(handle, server_tls) as url:
            api = RestClient(ClientConfig(host=url, ssl_context=client_tls))
            try:
                answers = [await api.request("GET", path) for path in ("/a", "/b", "/last")]
                await asyncio.sleep(0.1)
                answers.append(await api.request("GET", "/after"))
            finally:
                await api.close()
        return answers

    answers = eventloop.run(scenario(), use_uvloop=loop == "uvloop")
    assert answers == [{"path": p} for p in ("/a", "/b", "/last", "/after")]
    assert peers[0] == peers[1] == peers[2] != peers[3]
