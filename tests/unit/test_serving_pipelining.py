"""The secure port's HTTP server (pykcm.serving.http) against clients that pipeline: many requests
in one write answered in order, in both line-end styles; a client that never reads its answers cut
off at the idle timeout; a refused request's answer reaching the client before the close."""

from __future__ import annotations

import asyncio
import socket

import pytest

from pykcm.serving import messages
from pykcm.serving.http import HTTPServer
from pykcm.serving.messages import Request, Response
from tests.unit.test_serving_http import connect, read_response


@pytest.mark.parametrize("line_end", [b"\r\n", b"\n"])
async def test_thousands_of_pipelined_requests_are_answered_in_order(line_end: bytes) -> None:
    seen: list[str] = []

    async def handle(request: Request) -> Response:
        seen.append(request.path)
        return Response(200, request.path.encode())

    server = HTTPServer(handle)
    port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await connect(port)
        count = 5000
        writer.write(b"".join(b"GET /%d HTTP/1.1%sHost: x%s%s" % (i, line_end, line_end, line_end)
                              for i in range(count)))
        for i in range(count):
            assert (await read_response(reader))[2] == b"/%d" % i
        assert seen == [f"/{i}" for i in range(count)]
        writer.close()
    finally:
        await server.stop()


def test_the_head_ends_at_the_first_blank_line_in_either_style() -> None:
    assert messages.head_end(bytearray(b"GET / HTTP/1.1\r\nA: b\r\n\r\nGET /2"), 0) == (21, 24)
    assert messages.head_end(bytearray(b"GET / HTTP/1.1\nA: b\n\nGET /2"), 0) == (19, 21)
    assert messages.head_end(bytearray(b"GET / HTTP/1.1\r\nA: b\r\n\r"), 0) is None  # not yet whole
    assert messages.head_end(bytearray(b"GET / HTTP/1.1\r\nA: b\r\n"), 20) is None


async def test_a_client_that_never_reads_its_answers_is_cut_off_at_the_idle_timeout() -> None:
    async def handle(request: Request) -> Response:
        return Response(200, b"x" * (512 * 1024))  # a /metrics-sized answer

    server = HTTPServer(handle, idle_timeout=0.5, head_timeout=0.5)
    port = await server.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", port))
    client.setblocking(False)
    try:
        await loop.sock_sendall(client, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 30000)
        while not server.connections:
            await asyncio.sleep(0.01)
        for _ in range(60):  # a close() would wait for the unread answers to drain, for ever
            if not server.connections:
                break
            await asyncio.sleep(0.1)
        assert not server.connections
    finally:
        client.close()
        await server.stop()


async def test_a_refused_head_is_answered_before_the_connection_closes() -> None:
    async def handle(request: Request) -> Response:
        return Response(200, b"ok")

    server = HTTPServer(handle)
    port = await server.start("127.0.0.1", 0)
    try:
        for _ in range(5):  # the client is still sending when the server refuses: no reset may overtake the 431
            reader, writer = await connect(port)
            writer.write(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (1100 * 1024) + b"\r\n\r\n")
            status, _, _ = await read_response(reader)
            assert status.startswith("HTTP/1.1 431")
            writer.close()
    finally:
        await server.stop()
