"""The secure port's HTTP/1.1 server (pykcm.serving.http) against raw sockets on loopback: the bytes
a client sends, including the broken and hostile ones, and the bytes it gets back, in plain text and
in TLS. Where it listens: test_serving_listen; pykcm's handler chain on it: test_secure_server."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pykcm.app import eventloop
from pykcm.serving import http
from pykcm.serving.certs import self_signed_certificate
from pykcm.serving.http import HTTPServer
from pykcm.serving.messages import Request, Response
from tests.unit.test_fence import LOOPS, tls_contexts

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class App:
    """Answers `<method> <path>` as text; /boom raises, /slow answers after a while."""

    def __init__(self) -> None:
        self.requests: list[Request] = []

    async def __call__(self, request: Request) -> Response:
        self.requests.append(request)
        if request.path == "/boom":
            raise RuntimeError("handler bug")
        if request.path == "/slow":
            await asyncio.sleep(0.1)
        return Response(200, f"{request.method} {request.path}".encode(), {"Content-Type": "text/plain"})


@pytest.fixture
def app() -> App:
    return App()


@pytest.fixture
async def server(app: App) -> AsyncIterator[tuple[HTTPServer, int]]:
    srv = HTTPServer(app)
    port = await srv.start("127.0.0.1", 0)
    yield srv, port
    await srv.stop()


async def connect(port: int) -> Conn:
    return await asyncio.open_connection("127.0.0.1", port)


async def read_response(reader: asyncio.StreamReader, head_only: bool = False) -> tuple[str, dict[str, str], bytes]:
    """The status line, headers under lower-case names, and a Content-Length body (none for HEAD)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status, *lines = head[:-4].decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    if head_only:
        return status, headers, b""
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    return status, headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    """The server closed the connection (EOF) with nothing more to read."""
    return await asyncio.wait_for(reader.read(), 5) == b""


async def exchange(port: int, data: bytes) -> tuple[str, dict[str, str], bytes, bool]:
    reader, writer = await connect(port)
    writer.write(data)
    status, headers, body = await read_response(reader)
    eof = await closed(reader)
    writer.close()
    return status, headers, body, eof


def get(path: str = "/", *headers: str, method: str = "GET", version: str = "HTTP/1.1") -> bytes:
    return "\r\n".join([f"{method} {path} {version}", "Host: x", *headers, "", ""]).encode()


async def test_keep_alive_serves_two_requests_on_one_connection(server: tuple[HTTPServer, int]) -> None:
    reader, writer = await connect(server[1])
    for path in ("/one", "/two"):
        writer.write(get(path))
        status, headers, body = await read_response(reader)
        assert status == "HTTP/1.1 200 OK" and body == f"GET {path}".encode()
        assert headers["content-length"] == str(len(body)) and headers["date"].endswith(" GMT")
        assert "connection" not in headers
    writer.close()


async def test_connection_close_is_honoured(server: tuple[HTTPServer, int]) -> None:
    status, headers, _, eof = await exchange(server[1], get("/", "Connection: close"))
    assert status == "HTTP/1.1 200 OK" and headers["connection"] == "close" and eof


async def test_http_1_0_closes_unless_keep_alive_is_asked(server: tuple[HTTPServer, int]) -> None:
    status, headers, _, eof = await exchange(server[1], get("/", version="HTTP/1.0"))
    assert status == "HTTP/1.0 200 OK" and headers["connection"] == "close" and eof

    reader, writer = await connect(server[1])
    for _ in range(2):
        writer.write(get("/", "Connection: Keep-Alive", version="HTTP/1.0"))
        status, headers, _ = await read_response(reader)
        assert status == "HTTP/1.0 200 OK" and headers["connection"] == "keep-alive"
    writer.close()


async def test_an_oversize_head_is_refused_with_431(server: tuple[HTTPServer, int], app: App) -> None:
    status, _, _, _ = await exchange(server[1], get("/", "X-Big: " + "a" * (100 * 1024), "Connection: close"))
    assert status == "HTTP/1.1 200 OK"  # under Go's 1 MiB, as KCM serves it
    status, _, _, eof = await exchange(server[1], get("/", "X-Big: " + "a" * (1100 * 1024)))
    assert status.startswith("HTTP/1.1 431 Request Header Fields Too Large") and eof
    status, _, _, eof = await exchange(server[1], b"GET /" + b"a" * (1100 * 1024))  # never ends
    assert status.startswith("HTTP/1.1 431") and eof
    assert len(app.requests) == 1


@pytest.mark.parametrize(
    "data",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /\r\n\r\n",
        b"GET / HTTP/1.1 extra\r\n\r\n",
        b"GET nopath HTTP/1.1\r\n\r\n",
        b"G(T / HTTP/1.1\r\n\r\n",
        b"GET / HTTX/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost : x\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"GET / HTTP/1.1\r\nX-A: b\r\n\r\n",  # HTTP/1.1 without Host, as Go refuses it
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n",
    ],
)
async def test_a_malformed_request_is_answered_400_and_closed(
    server: tuple[HTTPServer, int], app: App, data: bytes
) -> None:
    status, headers, body, eof = await exchange(server[1], data)
    assert status == "HTTP/1.1 400 Bad Request" and body == b"400 Bad Request"
    assert headers["connection"] == "close" and eof
    assert app.requests == []


async def test_unsupported_http_version_is_505(server: tuple[HTTPServer, int]) -> None:
    status, _, _, eof = await exchange(server[1], b"GET / HTTP/2.0\r\n\r\n")
    assert status == "HTTP/1.1 505 HTTP Version Not Supported" and eof


async def test_a_small_body_is_dropped_and_a_large_one_answered_unread_and_closed(
    server: tuple[HTTPServer, int], app: App
) -> None:
    reader, writer = await connect(server[1])
    body = b"x" * (http.MAX_BODY - 1)  # under Go's cap: read and dropped, the connection serves on
    writer.write(get("/first", "Content-Length: 5") + b"hello" + get("/second", f"Content-Length: {len(body)}") + body
                 + get("/third"))
    assert [(await read_response(reader))[2] for _ in range(3)] == [b"GET /first", b"GET /second", b"GET /third"]
    writer.close()

    # As KCM (Go's net/http) does: answered without waiting for the body, then closed.
    for length in (str(http.MAX_BODY), "9" * 5000):
        status, headers, body, eof = await exchange(server[1], get("/big", f"Content-Length: {length}") + b"partial")
        assert status == "HTTP/1.1 200 OK" and body == b"GET /big" and headers["connection"] == "close" and eof
    assert [r.path for r in app.requests] == ["/first", "/second", "/third", "/big", "/big"]


async def test_expect_100_continue_gets_its_interim_answer(server: tuple[HTTPServer, int]) -> None:
    reader, writer = await connect(server[1])
    writer.write(get("/", "Content-Length: 3", "Expect: 100-continue"))
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"abc")
    assert (await read_response(reader))[2] == b"GET /"
    writer.close()


async def test_a_chunked_body_is_never_parsed_the_request_is_answered_and_closed(
    server: tuple[HTTPServer, int], app: App
) -> None:
    smuggled = get("/smuggled")
    data = get("/", "Transfer-Encoding: chunked") + f"{len(smuggled):x}\r\n".encode() + smuggled + b"\r\n0\r\n\r\n"
    status, headers, body, eof = await exchange(server[1], data)
    assert status == "HTTP/1.1 200 OK" and body == b"GET /" and headers["connection"] == "close" and eof
    assert [r.path for r in app.requests] == ["/"]


async def test_head_has_the_length_of_the_body_and_no_body(server: tuple[HTTPServer, int]) -> None:
    reader, writer = await connect(server[1])
    writer.write(get("/x", method="HEAD") + get("/x"))
    status, headers, _ = await read_response(reader, head_only=True)
    assert status == "HTTP/1.1 200 OK" and headers["content-length"] == str(len(b"HEAD /x"))
    # The next bytes are the GET's answer: the HEAD's carried no body.
    assert (await read_response(reader))[2] == b"GET /x"
    writer.close()


async def test_a_handler_exception_is_a_500_logged_once_and_serving_goes_on(
    server: tuple[HTTPServer, int], caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await connect(server[1])
    with caplog.at_level(logging.ERROR):
        writer.write(get("/boom"))
        status, _, body = await read_response(reader)
    assert status == "HTTP/1.1 500 Internal Server Error" and body == b"500 Internal Server Error"
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == ["Request handler failed"]
    writer.write(get("/after"))
    assert (await read_response(reader))[2] == b"GET /after"
    writer.close()


async def test_stop_closes_idle_keep_alive_connections(app: App) -> None:
    srv = HTTPServer(app)
    port = await srv.start("127.0.0.1", 0)
    reader, writer = await connect(port)
    writer.write(get("/"))
    await read_response(reader)
    await asyncio.wait_for(srv.stop(), 5)
    assert await closed(reader)
    assert not srv.connections
    with pytest.raises(OSError):
        await connect(port)
    writer.close()


async def test_stop_lets_a_busy_request_finish(app: App) -> None:
    srv = HTTPServer(app)
    port = await srv.start("127.0.0.1", 0)
    reader, writer = await connect(port)
    writer.write(get("/slow"))
    await asyncio.sleep(0.02)
    await asyncio.wait_for(srv.stop(), 5)
    _, headers, body = await read_response(reader)
    assert body == b"GET /slow" and headers["connection"] == "close" and await closed(reader)
    writer.close()


async def test_idle_connections_are_closed_after_the_timeout(app: App) -> None:
    srv = HTTPServer(app, idle_timeout=0.1, head_timeout=0.1)
    port = await srv.start("127.0.0.1", 0)
    try:
        reader, writer = await connect(port)
        writer.write(get("/"))
        await read_response(reader)
        assert await closed(reader)
        writer.close()
        reader, writer = await connect(port)
        writer.write(b"GET / HTTP/1.1\r\n")  # a head that never ends
        assert await closed(reader)
        writer.close()
    finally:
        await srv.stop()


async def test_a_connection_that_never_sends_a_request_has_the_head_timeout(app: App) -> None:
    # Go's ReadHeaderTimeout (32 s) runs from the connection on; the idle timeout (90 s) only between requests.
    srv = HTTPServer(app, idle_timeout=30, head_timeout=0.1)
    port = await srv.start("127.0.0.1", 0)
    try:
        reader, writer = await connect(port)
        assert await closed(reader)
        writer.close()
    finally:
        await srv.stop()


async def test_pipelined_requests_are_answered_in_order(server: tuple[HTTPServer, int]) -> None:
    reader, writer = await connect(server[1])
    writer.write(get("/slow") + get("/fast") + get("/last", "Connection: close"))
    bodies = [(await read_response(reader))[2] for _ in range(3)]
    assert bodies == [b"GET /slow", b"GET /fast", b"GET /last"]
    assert await closed(reader)
    writer.close()


async def test_path_is_decoded_and_the_query_has_every_value(server: tuple[HTTPServer, int], app: App) -> None:
    await exchange(server[1], get("/a%20b/c%2Fd?x=1&x=2&verbose&e=&s=%26+z", "X-Case: Yes", "Connection: close"))
    request = app.requests[0]
    assert request.path == "/a b/c/d" and request.raw_path == "/a%20b/c%2Fd"
    assert request.query == {"x": ["1", "2"], "verbose": [""], "e": [""], "s": ["& z"]}
    assert request.query.getall("x", []) == ["1", "2"] and request.query.getall("nope", []) == []
    assert request.headers.get("x-case") == request.headers["X-CASE"] == "Yes" and "x-Case" in request.headers
    assert request.ssl_object is None


async def test_tls_exposes_the_ssl_object(app: App, tmp_path: Path) -> None:
    cert, key = self_signed_certificate("127.0.0.1")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    srv = HTTPServer(app)
    port = await srv.start("127.0.0.1", 0, context)
    client = ssl.create_default_context(cadata=cert.decode())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="127.0.0.1")
        for _ in range(2):
            writer.write(get("/tls"))
            assert (await read_response(reader))[2] == b"GET /tls"
        writer.close()
    finally:
        await srv.stop()
    ssl_object = app.requests[0].ssl_object
    assert ssl_object is not None and ssl_object.version().startswith("TLS")
    assert ssl_object.getpeercert() is None  # no client certificate asked for


# Go's net/http answer to plain HTTP on its TLS port, unencrypted, before it closes the connection.
PLAIN_HTTP_ON_TLS = b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"


@pytest.fixture
async def tls_port(app: App, tmp_path: Path) -> AsyncIterator[tuple[int, ssl.SSLContext]]:
    """A TLS port (default timeouts) and a client context for it."""
    server_tls, client_tls = tls_contexts(tmp_path)
    srv = HTTPServer(app)
    port = await srv.start("127.0.0.1", 0, server_tls)
    yield port, client_tls
    await srv.stop()


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/healthz"), ("HEAD", "/"), ("POST", "/"), ("PUT", "/"), ("OPTIONS", "*")]
)
async def test_plain_http_on_the_tls_port_gets_go_s_400(
    tls_port: tuple[int, ssl.SSLContext], app: App, method: str, path: str
) -> None:
    # Go tells plain HTTP by the first five bytes (tlsRecordHeaderLooksLikeHTTP), where a TLS record header is.
    reader, writer = await connect(tls_port[0])
    writer.write(get(path, method=method))
    assert await asyncio.wait_for(reader.read(), 5) == PLAIN_HTTP_ON_TLS  # and then EOF, not a reset
    writer.close()
    assert app.requests == []


@pytest.mark.parametrize(
    "data",
    [b"hello world\r\n", get("/", method="DELETE"), get("/", method="PATCH"), b"get / HTTP/1.1\r\n\r\n", b"GET"],
    ids=["junk", "DELETE", "PATCH", "lower-case", "short-then-eof"],
)
async def test_anything_else_that_is_not_tls_is_dropped_without_a_word(
    tls_port: tuple[int, ssl.SSLContext], app: App, data: bytes
) -> None:
    # Go's five prefixes only; the rest fails the handshake, at once (not at the 32 s head timeout).
    reader, writer = await connect(tls_port[0])
    writer.write(data)
    if data == b"GET":
        writer.write_eof()  # fewer than five bytes, then EOF: TLS gets them, as it would anything
    assert await closed(reader)
    writer.close()
    assert app.requests == []


async def test_tls_clients_are_served_beside_plain_http_ones(tls_port: tuple[int, ssl.SSLContext]) -> None:
    port, client_tls = tls_port
    plain = await connect(port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls)
    plain[1].write(get("/"))
    for path in ("/a", "/b"):
        writer.write(get(path))
        assert (await read_response(reader))[2] == f"GET {path}".encode()
    assert await asyncio.wait_for(plain[0].read(), 5) == PLAIN_HTTP_ON_TLS
    plain[1].close()
    writer.close()


async def test_a_tls_client_that_stalls_is_cut_off_by_the_head_timeout(app: App, tmp_path: Path) -> None:
    # Go's deadline covers the TLS handshake from the connection on, its first record's header included:
    # nothing sent, a prefix of "GET /", a record header with no record.
    srv = HTTPServer(app, idle_timeout=30, head_timeout=0.2)
    port = await srv.start("127.0.0.1", 0, tls_contexts(tmp_path)[0])
    loop = asyncio.get_running_loop()
    try:
        for data in (b"", b"GE", b"\x16\x03\x01\x02\x00"):
            reader, writer = await connect(port)
            writer.write(data)
            start = loop.time()
            assert await closed(reader), data
            assert 0.1 < loop.time() - start < 2, data
            writer.close()
    finally:
        await srv.stop()


async def test_stop_closes_tls_connections_still_before_their_handshake(app: App, tmp_path: Path) -> None:
    srv = HTTPServer(app)
    port = await srv.start("127.0.0.1", 0, tls_contexts(tmp_path)[0])
    peeking, handshaking = await connect(port), await connect(port)
    handshaking[1].write(b"\x16\x03\x01\x02\x00")
    await asyncio.sleep(0.05)
    await asyncio.wait_for(srv.stop(), 5)
    for reader, writer in (peeking, handshaking):
        assert await closed(reader)
        writer.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "::"])  # "::": IPv4 clients on a dual-stack socket
@pytest.mark.parametrize("loop", LOOPS)
def test_either_event_loop_tells_plain_http_from_tls(loop: str, host: str, tmp_path: Path) -> None:
    """uvloop's accepted sockets, readers and TLS transports: the peek leaves the bytes for the handshake."""
    server_tls, client_tls = tls_contexts(tmp_path)

    async def scenario() -> list[bytes]:
        srv = HTTPServer(App())
        port = await srv.start(host, 0, server_tls)
        answers = []
        try:
            for data in (get("/healthz"), b"hello world\r\n"):
                reader, writer = await connect(port)
                writer.write(data)
                answers.append(await asyncio.wait_for(reader.read(), 5))
                writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls)
            writer.write(get("/tls"))
            answers.append((await read_response(reader))[2])
            writer.close()
        finally:
            await srv.stop()
        return answers

    assert eventloop.run(scenario(), use_uvloop=loop == "uvloop") == [PLAIN_HTTP_ON_TLS, b"", b"GET /tls"]
