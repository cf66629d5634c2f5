"""A minimal HTTP/1.1 server on an asyncio protocol: just what the secure port's few GET endpoints take.

aiohttp's server cost 0.1-0.2 s of CPU at every start only to be imported. Here a connection is a
protocol that parses requests as bytes arrive and hands each one, whole, to an `async (Request) ->
Response` handler; the answer is written with one transport.write(). Keep-alive and pipelining are
served one request at a time, in order. A Content-Length body is read up to Go's cap and handed over
(only PUT /debug/flags/v reads one); a larger or a chunked body is not read at all: the request is
answered and the connection closed, as Go's net/http does with a body too large to discard.

On a TLS port the first five bytes are peeked at before the handshake: a plain-HTTP request there
gets Go's net/http answer (400, "Client sent an HTTP request to an HTTPS server.") instead of a
dropped connection, so a scraper set to `scheme: http` is told what is wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import Callable
from email.utils import formatdate  # prometheus_client imports it anyway (urllib.request)
from http import HTTPStatus
from typing import Any

from pykcm.serving.listen import create_server
from pykcm.serving.messages import (
    Handler,
    Refused,
    Request,
    Response,
    head_end,
    parse_headers,
    parse_query,
    request_line,
)
from pykcm.util.log import get_logger

log = get_logger("server")

MAX_HEAD = (1 << 20) + 4096  # request line and headers: Go's DefaultMaxHeaderBytes plus its 4 KiB slack
MAX_BODY = 256 * 1024  # Go's maxPostHandlerReadBytes: a body under it is read and dropped, one as large is not read
CLOSE_LINGER = 0.5  # seconds: Go's rstAvoidanceDelay
READ_AHEAD = 64 * 1024  # what is read of pipelined requests while one is handled (Go reads one at a time)
IDLE_TIMEOUT = 90.0  # the apiserver's secure serving: IdleTimeout
HEAD_TIMEOUT = 32.0  # ... and ReadHeaderTimeout: a request's head must be whole this long after it began
STOP_GRACE = 5.0  # stop() lets a request being handled finish this long before cutting it off
ACCEPT_ERROR_EVERY = 5.0  # seconds: at most one line this often says connections are being refused
_OWN_HEADERS = frozenset({"content-length", "date", "connection", "transfer-encoding"})  # written here only
_PLAIN = "text/plain; charset=utf-8"
# Go's tlsRecordHeaderLooksLikeHTTP: a first TLS record header that is a plain-HTTP request's start.
_HTTP_ON_TLS = frozenset({b"GET /", b"HEAD ", b"POST ", b"PUT /", b"OPTIO"})
_HTTP_ON_TLS_ANSWER = b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"


_reasons: dict[int, str] = {}
_date: tuple[int, bytes] = (0, b"")
_accept_error_logged = -ACCEPT_ERROR_EVERY  # when the last such line was written (time.monotonic())


def _reason(status: int) -> str:
    reason = _reasons.get(status)
    if reason is None:
        try:
            reason = _reasons[status] = HTTPStatus(status).phrase
        except ValueError:
            reason = f"status code {status}"
    return reason


def _http_date() -> bytes:
    """The Date header's value, made once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True).encode())
    return _date[1]


class HTTPServer:
    """Listens on host:port (TLS when an ssl context is given) and serves every request with `handler`."""

    def __init__(self, handler: Handler, idle_timeout: float = IDLE_TIMEOUT, head_timeout: float = HEAD_TIMEOUT):
        self.handler, self.idle_timeout, self.head_timeout = handler, idle_timeout, head_timeout
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._tls: ssl.SSLContext | None = None
        self._admitting: set[asyncio.Task[None]] = set()  # TLS connections not yet past their handshake

    async def start(self, host: str | None, port: int, ssl_context: Any = None) -> int:
        """Listen; returns the port (the one picked when `port` is 0)."""
        loop = asyncio.get_running_loop()
        self._tls = ssl_context
        # With TLS, the listener's transports only accept: _admit() takes each socket over.
        factory: Callable[[HTTPServer], asyncio.Protocol] = _Accepted if ssl_context is not None else _Connection
        # Every interface (0.0.0.0, ::, ""): both IP families on one socket, as KCM listens.
        self._server = await create_server(loop, lambda: factory(self), host, port)
        _quiet_failed_accepts(loop)
        self.sockname: tuple[str, int] = self._server.sockets[0].getsockname()[:2]  # ("::", 10257)
        return int(self.sockname[1])

    async def stop(self) -> None:
        """Stop listening, close idle connections, let busy ones finish their answer (STOP_GRACE at most)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._admitting:  # a handshake cut short closes its socket
            for task in self._admitting:
                task.cancel()
            await asyncio.wait(list(self._admitting))
        conns = list(self.connections)
        for conn in conns:
            conn.shut()
        if conns:
            await asyncio.wait([conn.lost for conn in conns], timeout=STOP_GRACE)
        for conn in list(self.connections):
            conn.abort()

    async def _admit(self, sock: socket.socket) -> None:
        """A TLS port's connection: plain HTTP is answered as Go answers it, the rest goes on to TLS."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.head_timeout  # Go's handshake deadline: the first record's header included
        try:
            async with asyncio.timeout_at(deadline):
                head = await _peek(loop, sock, 5)
        except BaseException as err:
            _close(sock)
            if isinstance(err, OSError):  # the timeout too: dropped without a word, as a failed handshake is
                return
            raise
        if head in _HTTP_ON_TLS:
            _close(sock, _HTTP_ON_TLS_ANSWER)  # unencrypted, as Go writes it
            return
        with contextlib.suppress(OSError):  # a failed handshake: the transport closes the socket, nothing is logged
            await loop.connect_accepted_socket(
                lambda: _Connection(self), sock, ssl=self._tls, ssl_handshake_timeout=max(deadline - loop.time(), 1e-3)
            )


class _Accepted(asyncio.Protocol):
    """A TLS port's connection as accepted: its socket, duplicated, goes to _admit(); this transport closes unread."""

    def __init__(self, server: HTTPServer) -> None:
        self._server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Peeking takes the socket itself, which a transport keeps; the duplicate keeps the connection open.
        try:
            sock = transport.get_extra_info("socket").dup()
        except OSError as err:  # EMFILE: no descriptor for the duplicate; the client is dropped
            transport.abort()
            _accept_failed(err)
            return
        transport.abort()
        if self._server._server is None:  # accepted while stopping
            sock.close()
            return
        task = asyncio.get_running_loop().create_task(self._server._admit(sock))
        self._server._admitting.add(task)
        task.add_done_callback(self._server._admitting.discard)


_ACCEPT_OUT_OF_RESOURCES = "socket.accept() out of system resource"  # asyncio's words; uvloop drops such silently


def _quiet_failed_accepts(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio's own loop reports an accept() that failed for lack of descriptors to the loop's
    exception handler, a traceback every second while it lasts: one rate-limited line instead."""
    previous = loop.get_exception_handler()
    if getattr(previous, "quiets_failed_accepts", False):
        return

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        err = context.get("exception")
        if context.get("message") == _ACCEPT_OUT_OF_RESOURCES and isinstance(err, OSError):
            _accept_failed(err)
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    handle.quiets_failed_accepts = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handle)


def _accept_failed(err: OSError) -> None:
    """One line, at most every ACCEPT_ERROR_EVERY seconds, however many connections fail (uvloop
    would print a traceback for each)."""
    global _accept_error_logged
    now = time.monotonic()
    if now - _accept_error_logged >= ACCEPT_ERROR_EVERY:
        _accept_error_logged = now
        log.error(err, "Cannot accept a connection, closed it")


async def _peek(loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int) -> bytes:
    """The client's first `size` bytes, left in the socket for the TLS handshake; fewer if it closed sooner."""
    sock.setblocking(False)
    # Readable only once `size` bytes are in (or at EOF): a client trickling bytes wakes nothing.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, size)
    fd = sock.fileno()
    try:
        while True:
            ready = loop.create_future()
            loop.add_reader(fd, lambda fut=ready: fut.done() or fut.set_result(None))
            try:
                await ready
            finally:
                loop.remove_reader(fd)
            with contextlib.suppress(BlockingIOError):
                return sock.recv(size, socket.MSG_PEEK)
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)


def _close(sock: socket.socket, answer: bytes = b"") -> None:
    """Close, once what came in is read (as Go's record reader has): unread bytes would make the close a
    reset, which can reach the client before the answer does."""
    with contextlib.suppress(OSError):
        sock.recv(64 * 1024)
    with contextlib.suppress(OSError):
        sock.send(answer)
    sock.close()


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed from a buffer, handled one at a time, answered in order."""

    def __init__(self, server: HTTPServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self.lost = self._loop.create_future()  # stop() waits for it
        # What came in and is not parsed yet: a bytearray, as a request is cut from its front
        # (in place, in constant time) and data is added at its end.
        self._buf = bytearray()
        self._scanned = 0  # how far the buffer was searched for the head's end: not searched again
        self._continued = False  # 100 Continue was sent for the request in the buffer
        self._busy: asyncio.Task[None] | None = None  # the request being handled
        self._closing = False  # no further request is read: the last answer said Connection: close
        self._write_paused = False
        self._read_paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._head_timer = False  # the timer running is the head's, not the idle one

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._server.connections.add(self)
        self._arm(self._server.head_timeout)  # the first request's head: from the connection on, as Go
        self._head_timer = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._closing = True
        self._disarm()
        self._transport = None  # a handler still running finishes; its answer has nowhere to go
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return  # after a final answer, the rest (a chunked body, say) is never parsed
        self._buf += data
        if self._busy is not None or self._write_paused:
            # Pipelined requests wait their turn; past this much the client is not waiting for answers
            # (resumed once the one in hand is answered: a request bigger than this is read whole then).
            if len(self._buf) > READ_AHEAD and not self._read_paused and self._transport is not None:
                self._read_paused = True
                self._transport.pause_reading()
            return
        self._next()

    def pause_writing(self) -> None:
        self._write_paused = True  # the client is not reading its answers: read no more requests

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._busy is None:
            self._resume_reading()
            self._next()

    def shut(self) -> None:
        """From stop(): an idle connection closes now, a busy one after its answer."""
        self._closing = True
        if self._busy is None and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._busy is not None:
            self._busy.cancel()
        if self._transport is not None:
            self._transport.abort()

    def _next(self) -> None:
        """Start on the next whole request in the buffer, if there is one."""
        if self._closing or self._write_paused or self._transport is None:
            return
        try:
            parsed = self._parse()
        except Refused as failure:
            text = f"{failure.status} {_reason(failure.status)}".encode()
            self._write(Response(failure.status, text, {"Content-Type": _PLAIN}), "HTTP/1.1", True)
            return
        if parsed is None:
            if self._buf and not self._head_timer:  # a head begun: whole within head_timeout, however slow
                self._arm(self._server.head_timeout)
                self._head_timer = True
            return
        self._disarm()
        self._busy = self._loop.create_task(self._handle(*parsed))

    def _parse(self) -> tuple[Request, bool] | None:
        """The next request and whether the connection closes after it, or None until more bytes come."""
        buf = self._buf
        if self._scanned == 0:
            while buf[:1] in (b"\r", b"\n") and buf:  # stray line ends before a request line are ignored
                del buf[:1]
        found = head_end(buf, max(self._scanned - 2, 0))
        if found is None:
            if len(buf) > MAX_HEAD:
                raise Refused(431)
            self._scanned = len(buf)
            return None
        eoh, body_start = found
        if eoh > MAX_HEAD:
            raise Refused(431)
        self._scanned = eoh  # the head is found; only the body may be missing
        lines = [line[:-1] if line.endswith(b"\r") else line for line in bytes(buf[:eoh]).split(b"\n")]
        method, target, version = request_line(lines[0])
        headers = parse_headers(lines[1:])
        if version == "HTTP/1.1" and "host" not in headers:
            raise Refused(400)  # Go's "missing required Host header"
        tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
        close = "close" in tokens or (version == "HTTP/1.0" and "keep-alive" not in tokens)
        if "transfer-encoding" in headers:
            # Go answers such a request and closes when the body is more than it will discard; the
            # body is never parsed here, so nothing in it can be taken for a request.
            length, close = 0, True
        else:
            value = headers.get("content-length", "0")
            if not value.isdigit() or not value.isascii():
                raise Refused(400)
            length = int(value) if len(value) < 16 else MAX_BODY  # int() refuses 4300 digits and more
            if length >= MAX_BODY:
                length, close = 0, True  # answered unread, then closed
            if len(buf) - body_start < length:
                if not self._continued and headers.get("expect", "").lower() == "100-continue":
                    self._continued = True  # the client waits for this before it sends the body
                    self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]
                return None
        body = bytes(buf[body_start : body_start + length])
        del buf[: body_start + length]
        self._scanned, self._continued = 0, False
        path, _, query = target.partition("?")
        ssl_object = self._transport.get_extra_info("ssl_object") if self._transport is not None else None
        return Request(method, path, parse_query(query), headers, version, ssl_object, body, target), close

    async def _handle(self, request: Request, close: bool) -> None:
        try:
            response = await self._server.handler(request)
        except Exception as err:  # the handler's bug: answered, logged, and the connection serves on
            log.error(err, "Request handler failed", verb=request.method, path=request.path)
            response = Response(500, b"500 Internal Server Error", {"Content-Type": _PLAIN})
        self._busy = None
        try:
            self._write(response, request.version, close, with_body=request.method != "HEAD")
        except Exception as err:  # an answer that cannot be written (a header not in latin-1): drop the connection
            log.error(err, "Cannot write the response", verb=request.method, path=request.path)
            self.abort()
            return
        self._resume_reading()
        if not self._closing:
            self._arm(self._server.idle_timeout)
            self._next()

    def _write(self, response: Response, version: str, close: bool, with_body: bool = True) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        close = close or self._closing
        parts = [f"{version} {response.status} {_reason(response.status)}\r\n"]
        parts += [f"{k}: {v}\r\n" for k, v in response.headers.items() if k.lower() not in _OWN_HEADERS]
        if close:
            parts.append("Connection: close\r\n")
        elif version == "HTTP/1.0":
            parts.append("Connection: keep-alive\r\n")
        # HEAD: the length the body would have, and no body.
        parts.append(f"Content-Length: {len(response.body)}\r\nDate: ")
        head = "".join(parts).encode("latin-1") + _http_date() + b"\r\n\r\n"
        transport.write(head + response.body if with_body and response.body else head)
        if close:
            self._closing = True
            if self._buf:  # more came than was answered (a refused head, an unread body): drop what
                # still comes for a while, so that the close is no reset overtaking the answer (Go's
                # rstAvoidanceDelay); the client, having its answer, usually closes first
                self._buf = bytearray()
                self._resume_reading()
                self._loop.call_later(CLOSE_LINGER, transport.close)
            else:
                transport.close()  # once the answer is flushed

    def _resume_reading(self) -> None:
        if self._read_paused and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()

    def _arm(self, timeout: float) -> None:
        """The connection closes unless a whole request has come within `timeout`."""
        self._disarm()
        self._timer = self._loop.call_later(timeout, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._head_timer = False

    def _expire(self) -> None:
        self._timer = None
        if self._busy is None and self._transport is not None:
            self._closing = True
            if self._transport.get_write_buffer_size():  # answers the client is not reading: a close
                self._transport.abort()  # would wait for them to drain, for ever
            else:
                self._transport.close()
