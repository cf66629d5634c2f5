"""What the HTTP/1.1 client (pykcm.client.http) puts on the wire and takes from it, as Go's net/http
does: a connection whose request is still being written is not reused, header values that would
break the head are refused unsent, and the response's framing is read as strictly as Go reads it
(one head size limit, Transfer-Encoding, the status code, bare LF line ends, gzip members, repeated
single-valued headers). Servers are raw asyncio ones on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from pathlib import Path

import pytest

from pykcm.app import eventloop
from pykcm.client import retry
from pykcm.client.config import ClientConfig
from pykcm.client.errors import TransportError
from pykcm.client.http import ConnectionPool, Timeout
from pykcm.client.httpconnection import MAX_HEAD, HTTPError
from pykcm.client.rest import RestClient
from tests.unit.test_fence import LOOPS, tls_contexts
from tests.unit.test_http import QUICK, answer_ok, answer_once, ok, raw_server, read_request


async def get(response: bytes) -> tuple[int, dict[str, str], bytes]:
    """One GET to a server answering `response` as given: the status, headers and body."""
    async with raw_server(answer_once(response)) as url:
        pool = ConnectionPool(url, None, limit=1)
        try:
            resp = await pool.request("GET", "/", {}, None, QUICK)
        finally:
            await pool.close()
    return resp.status, resp.headers, resp.body


# -- the request ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("loop", LOOPS)
def test_a_connection_still_writing_a_body_the_server_answered_early_is_not_reused(
    loop: str, tls: bool, tmp_path: Path
) -> None:
    """The server answers a big POST at once (413, kept alive) without reading its body, then reads
    whatever follows on that connection as the next request. Pooled, the connection would queue the
    next GET behind the rest of the body and hand it the answer to those bytes (Go: wroteRequest).
    A TLS transport passes a whole write to the socket's transport below it and counts only its own
    buffer: the body is handed over in pieces, as it is taken."""
    server_tls, client_tls = tls_contexts(tmp_path) if tls else (None, None)
    peers: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(len(peers))
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"POST"):
            writer.write(ok(b"{}"))
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        with contextlib.suppress(ConnectionError):  # closed by the client, as it should be
            if await reader.read(64):  # the body's bytes, read as a request
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 22\r\n\r\nmalformed request line")
                await writer.drain()
            await asyncio.sleep(1)

    async def scenario() -> tuple[int, int, bytes]:
        async with raw_server(handle, server_tls) as url:
            pool = ConnectionPool(url, client_tls, limit=4)
            try:
                posted = await pool.request("POST", "/big", {}, b"x" * (32 << 20), QUICK)
                resp = await pool.request("GET", "/api/v1/pods", {}, None, QUICK)
            finally:
                await pool.close()
        return posted.status, resp.status, resp.body

    assert eventloop.run(scenario(), use_uvloop=loop == "uvloop") == (413, 200, b"{}")
    assert len(peers) == 2  # the GET on a connection of its own


async def test_requests_whose_written_bodies_were_answered_keep_their_connection() -> None:
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while request := await read_request(reader):
            requests.append(request)
            writer.write(ok(b"{}"))
            await writer.drain()

    async with raw_server(handle) as url:
        pool = ConnectionPool(url, None, limit=4)
        try:
            for _ in range(3):
                await pool.request("POST", "/a", {}, b"y" * (4 << 20), QUICK)
            assert len(pool._conns) == 1
        finally:
            await pool.close()
    assert len(requests) == 3


@pytest.mark.parametrize("bad", ["abc\r\nX-Injected: yes", "abc\nX-Injected: yes", "abc\rdef", "abc\0def"])
async def test_a_header_value_that_would_break_the_head_is_refused_unsent(bad: str) -> None:
    """A token file holding a line break would add a header of its own: refused in one line, as
    Go's "invalid header field value", naming the header and not the (secret) value."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await answer_ok(reader, writer)

    async with raw_server(handle) as url:
        api = RestClient(ClientConfig(host=url, ssl_context=None, qps=1000, burst=1000,
                                      token_source=lambda: f"Bearer {bad}"))
        try:
            with pytest.raises(TransportError) as err:
                await api.request("GET", "/api/v1/pods")
        finally:
            await api.close()
    assert str(err.value) == 'GET /api/v1/pods: invalid header field value for "Authorization"'
    assert connections == []  # nothing was sent


async def test_with_compression_disabled_no_gzip_is_asked_for() -> None:
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while request := await read_request(reader):
            heads.append(request)
            writer.write(ok(b"{}"))
            await writer.drain()

    async with raw_server(handle) as url:
        for disable in (False, True):
            pool = ConnectionPool(url, None, limit=1, disable_compression=disable)
            try:
                await pool.request("GET", "/", {"Accept": "application/json"}, None, QUICK)
            finally:
                await pool.close()
    assert b"Accept-Encoding: gzip\r\n" in heads[0]
    assert b"accept-encoding" not in heads[1].lower() and heads[1].endswith(b"Accept: application/json\r\n\r\n")


# -- the response -----------------------------------------------------------------------------------


def head_of(size: int) -> bytes:
    """A response whose head is `size` bytes (its blank line included), body b"ok"."""
    start, end = b"HTTP/1.1 200 OK\r\nX-Big: ", b"\r\nContent-Length: 2\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end + b"ok"


@pytest.mark.parametrize("pieces", [1, 64], ids=["one-write", "in-pieces"])
async def test_one_head_size_limit_however_the_head_arrives(pieces: int) -> None:
    async def fetch(big: bytes) -> bytes:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            step = -(-len(big) // pieces)
            with contextlib.suppress(ConnectionError):  # the client hangs up on a head too large
                for i in range(0, len(big), step):
                    writer.write(big[i : i + step])
                    await writer.drain()
                    await asyncio.sleep(0.001)
                await asyncio.sleep(1)

        async with raw_server(serve) as url:
            pool = ConnectionPool(url, None, limit=1)
            try:
                return (await pool.request("GET", "/", {}, None, QUICK)).body
            finally:
                await pool.close()

    assert await fetch(head_of(MAX_HEAD)) == b"ok"
    with pytest.raises(HTTPError, match="response head too large"):
        await fetch(head_of(MAX_HEAD + 16))


async def test_a_head_with_bare_lf_line_ends_is_read_as_go_reads_it() -> None:
    chunked = b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n2\nok\r\n1;x\n!\r\n0\nX-Trailer: t\n\n"
    assert await get(chunked) == (200, {"transfer-encoding": "chunked"}, b"ok!")
    assert await get(b"HTTP/1.1 201 Created\nContent-Length: 2\r\n\nok") == (201, {"content-length": "2"}, b"ok")


@pytest.mark.parametrize("transfer", [b"gzip, chunked", b"chunked, chunked", b"identity",
                                      b"chunked\r\nTransfer-Encoding: chunked"])
async def test_a_transfer_encoding_other_than_chunked_is_refused(transfer: bytes) -> None:
    """Go takes one Transfer-Encoding, "chunked" (a request-smuggling guard); "gzip, chunked" read
    as chunked alone would hand the caller gzip bytes."""
    body = b"2\r\nok\r\n0\r\n\r\n"
    with pytest.raises(HTTPError, match="unsupported transfer encoding"):
        await get(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + transfer + b"\r\n\r\n" + body)


async def test_chunked_is_read_in_any_case_and_not_from_an_http_1_0_answer() -> None:
    assert (await get(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"))[2] == b"ok"
    # HTTP/1.0 has no Transfer-Encoding (Go ignores it): the body is the bytes up to the close.
    assert (await get(b"HTTP/1.0 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nraw"))[2] == b"raw"


@pytest.mark.parametrize("line", [b"HTTP/1.1 2000 OK", b"HTTP/1.1 20 OK", b"HTTP/1.1 200OK", b"HTTP/1.1 +20 OK",
                                  b"HTTP/1.1 099 Low", b"HTTP/1.1 OK"])
async def test_a_status_code_is_exactly_three_digits(line: bytes) -> None:
    with pytest.raises(HTTPError, match="bad status line"):
        await get(line + b"\r\nContent-Length: 2\r\n\r\nok")


async def test_a_status_line_without_a_reason_is_taken() -> None:
    assert (await get(b"HTTP/1.1 204\r\n\r\n"))[0] == 204


async def test_every_gzip_member_of_a_body_is_read() -> None:
    members = gzip.compress(b"hello ") + gzip.compress(b"") + gzip.compress(b"world")
    response = ok(members, b"Content-Encoding: gzip")
    assert (await get(response))[2] == b"hello world"
    # Chunks ending exactly at a member's end, and inside the next one's header.
    first = gzip.compress(b"hello ")
    pieces = [first, members[len(first) : len(first) + 3], members[len(first) + 3 :]]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert (await get(head + chunked))[2] == b"hello world"


@pytest.mark.parametrize(("tail", "error"), [(b"garbage!", "bad gzip body"),
                                             (b"\x1f\x8b", "ended inside its gzip stream")])
async def test_bytes_after_the_last_gzip_member_are_an_error_not_dropped(tail: bytes, error: str) -> None:
    with pytest.raises(HTTPError, match=error):
        await get(ok(gzip.compress(b"hello") + tail, b"Content-Encoding: gzip"))


async def test_a_repeated_single_valued_header_is_read_as_its_first_value() -> None:
    """As Go's Header.Get: Retry-After "1, 1" would be no number, and no retry at all."""
    head = (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nRetry-After: 1\r\n"
            b"X-Kubernetes-PF-FlowSchema-UID: f-1\r\nX-Kubernetes-PF-FlowSchema-UID: f-2\r\n"
            b"Content-Type: application/json\r\nContent-Type: text/plain\r\nX-List: a\r\nX-List: b\r\n"
            b"Content-Length: 0\r\n\r\n")
    status, headers, _ = await get(head)
    assert headers["retry-after"] == "1" and headers["content-type"] == "application/json"
    assert headers["x-list"] == "a, b"  # list-valued headers are still joined
    assert retry.after_response(1, status, headers) == retry.Retry(
        1, 'retries: 1, retry-after: 1s - retry-reason: due to server-side throttling, FlowSchema UID: "f-1"')


# -- a stream's error -------------------------------------------------------------------------------


@pytest.mark.parametrize(("then", "error"), [
    (b"zz\r\n", "bad chunk size"),  # a parse error: the first cause, not the close it leads to
    (b"", "server closed the connection before the response was complete"),  # cut, then the read timer fires
])
async def test_a_streams_reader_away_when_it_broke_still_gets_its_error(then: bytes, error: str) -> None:
    """The reader is busy with what it has (a watch's burst) while the stream breaks and the
    connection is closed: its next read raises the first cause, it does not wait for ever."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)  # the reader has the head and the first chunk
        if not then:
            writer.close()
            return
        writer.write(then)
        await writer.drain()
        await asyncio.sleep(5)

    async with raw_server(handle) as url:
        pool = ConnectionPool(url, None, limit=1)
        try:
            stream = await pool.stream("GET", "/watch", {}, Timeout(connect=5, read=0.3))
            assert await stream.next_chunk() == b"hello"
            await asyncio.sleep(0.6)  # away: the break and the read timeout both pass meanwhile
            with pytest.raises(HTTPError, match=error):
                await asyncio.wait_for(stream.next_chunk(), 2)
            stream.close()
        finally:
            await pool.close()
