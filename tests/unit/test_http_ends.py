"""How a response ends, for the HTTP/1.1 client (pykcm.client.http): an answer whole in the same
turn of the loop as its deadline, a body cut by a reset or inside its gzip stream, a stream closed
twice. Servers on loopback: a thread's socket where the loop must be blocked, else raw asyncio."""

from __future__ import annotations

import asyncio
import gzip
import socket
import struct
import threading
import time

import pytest

from pykcm.client.http import ConnectionPool, Timeout
from pykcm.client.httpconnection import HTTPError, ServerDisconnected
from tests.unit.test_http import QUICK, answer_ok, answer_once, ok, raw_server, read_request


def answer_from_a_thread(response: bytes, after: float, reset: bool = False) -> str:
    """A server on its own thread (it answers while the loop is blocked): one request, `response`
    `after` seconds later, then a reset (`reset`) or a wait; returns its URL."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            time.sleep(after)
            conn.sendall(response)
            if reset:  # SO_LINGER 0: the close is a RST, not a FIN
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                time.sleep(2)
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}"


async def test_a_whole_answer_stands_when_its_deadline_comes_due_in_the_same_turn() -> None:
    """The 201 is whole in the socket at 0.1 s; the loop is blocked from 0.05 to 0.55 s, past the
    0.3 s deadline: both are due in one turn. A create the apiserver made must not read as failed."""
    url = answer_from_a_thread(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}", after=0.1)
    pool = ConnectionPool(url, None, limit=2)

    async def block_the_loop() -> None:
        await asyncio.sleep(0.05)
        time.sleep(0.5)

    blocker = asyncio.ensure_future(block_the_loop())
    try:
        response = await pool.request("POST", "/api/v1/namespaces/a/pods", {}, b"{}", Timeout(total=0.3, connect=1))
        assert (response.status, response.body) == (201, b"{}")
    finally:
        await blocker
        await pool.close()


async def test_a_body_that_ends_at_a_reset_is_no_answer() -> None:
    # No length: the body ends when the server closes; a reset is not that end (Go: unexpected EOF).
    url = answer_from_a_thread(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"items":[1,2,', 0,
                               reset=True)
    pool = ConnectionPool(url, None, limit=2)
    try:
        with pytest.raises(ServerDisconnected, match="before the response was complete"):
            await pool.request("GET", "/api/v1/pods", {}, None, QUICK)
    finally:
        await pool.close()


@pytest.mark.parametrize("cut", [10, 1])
async def test_a_gzip_body_cut_short_is_an_error_not_a_shorter_body(cut: int) -> None:
    packed = gzip.compress(b'{"items": [' + b'{"a": 1}, ' * 50 + b'{"a": 1}]}')[:-cut]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(packed, b"Content-Encoding: gzip"))
        await writer.drain()

    async with raw_server(handle) as url:
        pool = ConnectionPool(url, None, limit=2)
        try:
            with pytest.raises(HTTPError, match="ended inside its gzip stream"):
                await pool.request("GET", "/api/v1/pods", {}, None, QUICK)
        finally:
            await pool.close()


async def test_a_stream_closed_twice_goes_back_to_the_pool_once() -> None:
    async with raw_server(answer_ok) as url:
        pool = ConnectionPool(url, None, limit=2)
        try:
            stream = await pool.stream("GET", "/watch", {}, QUICK)
            assert await stream.read() == b"{}"
            stream.close()
            stream.close()
            assert len(pool._idle) == 1
            first, second = await asyncio.gather(*(pool.request("GET", f"/{i}", {}, None, QUICK) for i in range(2)))
            assert first.body == second.body == b"{}"
        finally:
            await pool.close()


@pytest.mark.parametrize(
    ("head", "body"),
    [(b"Transfer-Encoding: chunked", b"0x3\r\nabc\r\n0\r\n\r\n"),
     (b"Transfer-Encoding: chunked", b"1_0\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n"),
     (b"Content-Length: -1", b""),
     (b"Content-Length: +2", b"{}"),
     (b"Content-Length: 2\r\nContent-Length: 3", b"{}")],
)
async def test_sizes_only_go_would_read_are_read(head: bytes, body: bytes) -> None:
    async with raw_server(answer_once(b"HTTP/1.1 200 OK\r\n" + head + b"\r\n\r\n" + body)) as url:
        pool = ConnectionPool(url, None, limit=2)
        try:
            with pytest.raises(HTTPError, match=r"bad chunk size|bad content-length"):
                await pool.request("GET", "/", {}, None, QUICK)
        finally:
            await pool.close()


async def test_a_content_length_repeated_with_the_same_value_is_taken() -> None:
    async with raw_server(answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}")) as url:
        pool = ConnectionPool(url, None, limit=2)
        try:
            assert (await pool.request("GET", "/", {}, None, QUICK)).body == b"{}"
        finally:
            await pool.close()


async def test_connections_probe_a_silent_peer_as_client_gos_dialer_does() -> None:
    async with raw_server(answer_ok) as url:
        pool = ConnectionPool(url, None, limit=2)
        try:
            await pool.request("GET", "/", {}, None, QUICK)
            (conn,) = pool._idle
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 30
        finally:
            await pool.close()
