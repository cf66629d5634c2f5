"""A lean HTTP/1.1 client on asyncio protocols: just what talking to an API server takes.

aiohttp's client spent 400-500 µs of CPU per request in Python (a request object, a task for the
body writer, the parser's callbacks). Here a request is its head and body written with one
transport.write() (over 64 KiB, in pieces as the transport takes them) and its response parsed
in data_received(); the caller awaits one future.
Connections are kept alive in a pool per server (idle ones closed after 90 s, client-go's
IdleConnTimeout) and carry Content-Length or chunked bodies, gzip-encoded or not, buffered or
streamed (watches). No redirects, cookies or 100-continue: the API server needs none. A proxy
(the kubeconfig's proxy-url or the environment's, pykcm.client.proxy) is asked to CONNECT to the
server, and TLS to the server runs inside that tunnel.

A request that finds its pooled connection closed by the server is sent again on a new one only
if it provably was not sent (the transport was closing before the write), or if it is a GET or
HEAD that got no byte of response (Go's isReplayable): a create is never sent twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from pykcm.client.fence import WriteFence
from pykcm.client.httpconnection import HTTPConnection, HTTPError, NotSent, ServerDisconnected
from pykcm.client.proxy import open_tunnel, parse_proxy
from pykcm.client.tlsverify import verifying_context

RequestHeaders = Mapping[str, str | list[str]]  # a list: the header sent once per value

IDLE_TIMEOUT = 90.0  # client-go's transport closes connections idle this long
REPLAYABLE = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class Timeout:
    """Seconds (None: unlimited) for the whole exchange, for connecting (TCP and TLS handshake),
    and between two reads of the response (the only limit a watch has)."""

    total: float | None = None
    connect: float | None = None
    read: float | None = None


class Response:
    """A response read to its end: the status, headers under lower-case names, the body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class ConnectionPool:
    """Keep-alive connections to one server: at most `limit` open (busy, idle or connecting).
    `server_name` is the name TLS asks for and checks the certificate against instead of the
    URL's host (a kubeconfig's tls-server-name); `proxy` a proxy URL (http:// or https://, with
    user:password for Basic auth; ValueError for any other, socks5 included); with
    `disable_compression` no gzip is asked for (a kubeconfig's disable-compression)."""

    def __init__(
        self, url: str, ssl_context: ssl.SSLContext | None, limit: int, fence: WriteFence | None = None,
        idle_timeout: float = IDLE_TIMEOUT, *, server_name: str | None = None, proxy: str | None = None,
        disable_compression: bool = False,
    ) -> None:
        parts = urlsplit(url)
        https = parts.scheme == "https"
        self._address = (parts.hostname or "localhost", parts.port or (443 if https else 80))
        self._host = parts.netloc.rpartition("@")[2]
        self._base = parts.path.rstrip("/")  # a proxy's prefix, kept as rest.request_url says
        self._ssl = (ssl_context or verifying_context()) if https else None
        self._server_name = server_name or None
        self._proxy = parse_proxy(proxy) if proxy else None  # a bad proxy URL fails here, not at each request
        self._limit, self._fence, self._idle_timeout = limit, fence, idle_timeout
        self._head_end = "\r\n" if disable_compression else "Accept-Encoding: gzip\r\n\r\n"
        self._conns: set[HTTPConnection] = set()
        self._idle: list[HTTPConnection] = []  # most recently used last
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweep: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # bound on first use

    async def request(
        self, method: str, target: str, headers: RequestHeaders, body: bytes | None, timeout: Timeout
    ) -> Response:
        """One exchange with a buffered body. `target` is the path and query below the server's."""
        conn = await self._exchange(method, target, headers, body, timeout, streaming=False)
        response = Response(conn.status, conn.headers, conn.take())
        self.release(conn)
        return response

    async def stream(self, method: str, target: str, headers: RequestHeaders, timeout: Timeout) -> Stream:
        """An exchange whose body is read chunk by chunk (a watch); close() the stream when done."""
        return Stream(self, await self._exchange(method, target, headers, None, timeout, streaming=True))

    def use_tls(self, context: ssl.SSLContext, close_busy: bool = True) -> None:
        """New connections use `context`; the open ones are closed (a rotated client certificate),
        or with `close_busy` False only the idle ones (a rotated CA: watches go on)."""
        self._ssl = context
        for conn in list(self._conns if close_busy else self._idle):
            conn.close()

    async def close(self) -> None:
        conns = list(self._conns)
        for conn in conns:
            conn.close()
        if self._sweep is not None:
            self._sweep.cancel()
        if conns:
            await asyncio.wait([conn.lost for conn in conns], timeout=1.0)

    # -- internals ------------------------------------------------------------------------------------

    async def _exchange(
        self, method: str, target: str, headers: RequestHeaders, body: bytes | None, timeout: Timeout, streaming: bool
    ) -> HTTPConnection:
        """Send the request, wait for the whole response (or its head when streaming), retry a
        stale pooled connection once as the module docstring says; the connection is ours."""
        head = [f"{method} {self._base}{target} HTTP/1.1\r\nHost: {self._host}\r\n"]
        for name, value in headers.items():
            for v in value if isinstance(value, list) else (value,):  # a list: a line per value (Impersonate-Group)
                if "\r" in v or "\n" in v or "\0" in v:  # a line break would start a header of its own
                    raise HTTPError(f'invalid header field value for "{name}"')  # not the value: a secret
                head.append(f"{name}: {v}\r\n")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body or b'')}\r\n")
        head.append(self._head_end)
        data = "".join(head).encode() + (body or b"")  # header values as UTF-8 bytes, as Go sends them
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        deadline = self.loop.time() + timeout.total if timeout.total is not None else None
        fresh = False
        while True:
            conn = await self._acquire(deadline, timeout.connect, fresh)
            try:
                conn.send(data, self._fence, method, streaming, deadline, timeout.read)
            except NotSent:
                conn.close()
                if fresh:
                    raise ServerDisconnected("server closed a new connection before the request was sent") from None
                fresh = True
                continue
            except BaseException:  # FencedWrite: nothing was written, the connection stays good
                self.release(conn)
                raise
            try:
                while not conn.complete and (not streaming or not conn.status):
                    await conn.wait()
            except BaseException as err:
                conn.close()
                conn.drop_error()  # raised here, to the caller
                if (isinstance(err, ServerDisconnected) and conn.reused and not conn.received
                        and method in REPLAYABLE and not fresh):
                    fresh = True
                    continue
                raise
            return conn

    async def _acquire(self, deadline: float | None, connect_timeout: float | None, fresh: bool) -> HTTPConnection:
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed and self.loop.time() - conn.idle_since < self._idle_timeout:
                conn.reused = True
                return conn
            conn.close()
        async with asyncio.timeout_at(deadline):
            while len(self._conns) >= self._limit:
                if fresh and self._idle:
                    self._idle[0].close()  # the least recently used makes room for the new one
                    continue
                waiter = self.loop.create_future()
                self._waiters.append(waiter)
                try:
                    await waiter  # a connection was released or closed
                except BaseException:
                    if waiter.done() and not waiter.cancelled():  # woken, but leaving (a timeout, a cancel):
                        self._wake_one()  # pass the wake-up on, as the work queue's get does
                    raise
                finally:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                if self._idle and not fresh:
                    return await self._acquire(deadline, connect_timeout, fresh)
            conn = HTTPConnection(self.loop, self.forget)
            self._conns.add(conn)
            host, port = self._address
            tls = {"ssl": self._ssl, "server_hostname": self._server_name or host} if self._ssl is not None else {}
            try:
                async with asyncio.timeout(connect_timeout):  # through a proxy: its CONNECT and our handshake too
                    if self._proxy is not None:  # ProxyRefused (a ConnectionRefusedError) if it will not
                        await open_tunnel(self.loop, self._proxy, host, port, conn, self._ssl, self._server_name)
                    else:
                        await self.loop.create_connection(lambda: conn, host, port, **tls)
            except BaseException:
                self.forget(conn)
                if conn.transport is not None:
                    conn.transport.abort()
                raise
        return conn

    def release(self, conn: HTTPConnection) -> None:
        reusable = conn.reusable
        conn.end_exchange()
        if not reusable:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        self._idle.append(conn)
        self._wake_one()
        if self._sweep is None:
            self._sweep = self.loop.call_at(conn.idle_since + self._idle_timeout, self._close_expired)

    def forget(self, conn: HTTPConnection) -> None:
        """`conn` no longer counts: it closed or is closing."""
        conn.closed = True
        if conn in self._conns:
            self._conns.discard(conn)
            with contextlib.suppress(ValueError):
                self._idle.remove(conn)
            self._wake_one()

    def _wake_one(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
                return

    def _close_expired(self) -> None:
        self._sweep = None
        now = self.loop.time()
        for conn in [c for c in self._idle if now - c.idle_since >= self._idle_timeout]:
            conn.close()
        if self._idle:
            self._sweep = self.loop.call_at(min(c.idle_since for c in self._idle) + self._idle_timeout,
                                            self._close_expired)


class Stream:
    """A response whose body arrives in chunks: next_chunk() until it returns None, then close()."""

    def __init__(self, pool: ConnectionPool, conn: HTTPConnection) -> None:
        self._pool, self._conn = pool, conn
        self.status, self.headers = conn.status, conn.headers
        self._closed = False  # a second release would list the connection as idle twice

    async def next_chunk(self) -> bytes | None:
        conn = self._conn
        while not conn.body:
            if conn.complete:
                return None
            await conn.wait()
        return conn.take()

    async def read(self) -> bytes:
        """The rest of the body (an error's Status)."""
        chunks = []
        while (chunk := await self.next_chunk()) is not None:
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        """Back to the pool if the body was read to its end, else the connection is closed; once."""
        if not self._closed:
            self._closed = True
            self._pool.release(self._conn)
            self._conn.drop_error()  # the reader's to have seen: it is done with the stream
