"""One HTTP/1.1 keep-alive connection as an asyncio protocol: it writes a request and parses the
response in data_received(), for pykcm.client.http's pool.

One exchange at a time. The parser keeps its place in the response as state (status line and
headers, a Content-Length body, chunks, or a body that ends when the server closes) so that a
response may arrive in any pieces; a buffered exchange wakes its caller once, at the end, a
streamed one at its head and at each piece of body.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import zlib
from collections.abc import Callable, Mapping
from types import MappingProxyType

from pykcm.client.fence import WriteFence

# A response's status line and headers, however they arrive: far above any apiserver's (it cuts
# warnings at 4 KB). Go's client allows 10 MB; a head arriving in pieces is joined and searched
# again at each, so a limit that size would let a broken proxy cost seconds of CPU a connection.
MAX_HEAD = 64 * 1024
PAUSE_ABOVE = 4 << 20  # a streamed body stops reading from the socket with this much unconsumed
# A request larger than this is handed to the transport in pieces until it is full (pause_writing),
# in the fenced step as one write would, so what it has not sent is ours or in its count (reusable).
# A TLS transport counts only its own buffer and passes a whole write to the socket's one below.
WRITE_PIECE = 64 * 1024
KEEPALIVE = 30  # seconds idle before TCP keep-alive probes, and between them (client-go's dialer)

# Where the parser is in the current response.
_IDLE, _HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_EOF, _DONE = range(9)
_HEX = b"0123456789abcdefABCDEF"
_END_OF_HEAD = re.compile(rb"\n\r?\n")  # an empty line; bare LF line ends too, as Go's textproto reads them
_GZIP = 16 + zlib.MAX_WBITS
# Headers read as one value: a repeated one counts with its first value, as Go's Header.Get (the
# others are joined with ", ", as a list). Retry-After "1, 1" would read as no number at all.
_FIRST_VALUE_ONLY = frozenset({"retry-after", "content-type", "content-encoding", "x-kubernetes-pf-flowschema-uid",
                               "x-kubernetes-pf-prioritylevel-uid"})


class HTTPError(Exception):
    """The connection broke, the server's answer was not HTTP/1.1, or a header value would break
    the request's head (nothing sent)."""

    status = 0  # the response's when its head had arrived: the error came while reading the body
    headers: Mapping[str, str] = MappingProxyType({})  # and its headers


class ServerDisconnected(HTTPError):
    """The connection closed before the response was complete; `reset` where the peer reset it."""

    def __init__(self, message: str, reset: bool = False) -> None:
        super().__init__(message)
        self.reset = reset


class NotSent(Exception):
    """The pooled connection was closing before a byte of the request was written."""


class HTTPConnection(asyncio.Protocol):
    """One keep-alive connection, one exchange at a time: the response is parsed as bytes arrive."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_close: Callable[[HTTPConnection], None]) -> None:
        self._loop = loop
        self._on_close = on_close  # the pool stops counting it
        self.transport: asyncio.Transport | None = None
        self.lost = self._loop.create_future()
        self.closed = False
        self.reused = False
        self.keep_alive = True
        self.idle_since = 0.0
        # The current exchange: what send() resets and the parser fills in.
        self.status, self.headers, self.received = 0, {}, False
        self.error: BaseException | None = None
        self.body: list[bytes] = []
        self._buf, self._remaining, self._buffered = b"", 0, 0
        self._no_body, self._streaming = False, False
        self._gunzip: zlib._Decompress | None = None
        self._gzipped = False  # body bytes went through _gunzip
        self._state = _IDLE
        self._waiter: asyncio.Future[None] | None = None
        self._total_timer: asyncio.TimerHandle | None = None
        self._read_timer: asyncio.TimerHandle | None = None
        self._read_timeout = 0.0
        self._last_read = 0.0
        self._paused = False
        self._unsent = memoryview(b"")  # the request's bytes not handed to the transport yet
        self._writing_paused = False

    # -- the exchange, as the caller sees it ----------------------------------------------------------

    def send(
        self, data: bytes, fence: WriteFence | None, method: str, streaming: bool, deadline: float | None,
        read_timeout: float | None,
    ) -> None:
        """Write a request; the fence is checked in the same synchronous step (FencedWrite: nothing sent)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise NotSent
        if fence is not None:
            fence.check_sending()
        self.status, self.headers, self.keep_alive, self.received = 0, {}, True, False
        self.error = None
        self.body = []
        self._buf, self._remaining, self._buffered = b"", 0, 0
        self._no_body, self._streaming, self._gunzip, self._gzipped = method == "HEAD", streaming, None, False
        self._state = _HEAD
        if len(data) > WRITE_PIECE:
            self._unsent = memoryview(data)
            self._write_more()  # in this step, the fence's, until the transport is full
        else:
            transport.write(data)
        if deadline is not None:
            self._total_timer = self._loop.call_at(deadline, self._expire, "the request took too long")
        if read_timeout is not None:
            self._read_timeout, self._last_read = read_timeout, self._loop.time()
            self._read_timer = self._loop.call_at(self._last_read + read_timeout, self._check_read)

    async def wait(self) -> None:
        """Until the parser has news (the head, body bytes, the end) or the exchange failed."""
        if self.error is not None:
            raise self.error
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    @property
    def complete(self) -> bool:
        return self._state == _DONE

    @property
    def reusable(self) -> bool:
        """Open, either unused or done with a response that lets it stay open, and done writing:
        a body the server answered early (a 413, a 429) still being written would be read as the
        next request's start (Go reuses a connection only once wroteRequest())."""
        return (not self.closed and self.keep_alive and self._state in (_IDLE, _DONE) and not self._unsent
                and self.transport is not None and self.transport.get_write_buffer_size() == 0)

    def take(self) -> bytes:
        """The body bytes received and not taken yet."""
        data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self._last_read = self._loop.time()  # the time spent paused was the reader's, not the server's
            self.transport.resume_reading()
        return data

    def end_exchange(self) -> None:
        self._cancel_timers()
        self._state = _IDLE
        self._unsent = memoryview(b"")  # not reusable then: the connection is closed
        self.body.clear()  # a stream closed with its last chunks unread
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.abort()  # a half-done exchange is not worth flushing
        self._on_close(self)
        self._cancel_timers()  # armed, they would keep a dead connection up to a minute

    def drop_error(self) -> None:
        """For the owner that has raised the error and drops the connection: its traceback holds this
        connection's frames, a cycle only the collector frees, and never once frozen (util/memory.py).
        Not in close(): a stream's reader may not have seen it yet."""
        self.error = None

    def _cancel_timers(self) -> None:
        for timer in (self._total_timer, self._read_timer):
            if timer is not None:
                timer.cancel()
        self._total_timer = self._read_timer = None
        self._read_timeout = 0.0

    # -- asyncio.Protocol -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # requests are written whole: no reason to wait for more
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(OSError, AttributeError):  # client-go's dialer: KeepAlive 30 s, so a
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # vanished apiserver is noticed
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._write_more()

    def _write_more(self) -> None:
        """Hand the transport the request's next pieces until it says it is full, or all are sent."""
        transport = self.transport
        while self._unsent and not self._writing_paused and transport is not None and not transport.is_closing():
            piece, self._unsent = self._unsent[:WRITE_PIECE], self._unsent[WRITE_PIECE:]
            transport.write(piece)

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_close(self)
        if self._state == _UNTIL_EOF and exc is None:  # a body without a length ends at a clean close
            self._finish()
        elif self._state not in (_IDLE, _DONE):  # a reset is no end: Go's io.ErrUnexpectedEOF
            reason = f": {exc}" if exc else ""
            self._fail(ServerDisconnected(f"server closed the connection before the response was complete{reason}",
                                          isinstance(exc, ConnectionResetError)))
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._state in (_IDLE, _DONE):  # nothing asked for, or a response that was not one
            self.keep_alive = False
            if self._state == _IDLE:
                self.close()
            return
        self.received = True
        if self._read_timeout:
            self._last_read = self._loop.time()
        try:
            self._feed(self._buf + data if self._buf else data)
        except HTTPError as err:
            self._fail(err)
            self.close()

    # -- parsing --------------------------------------------------------------------------------------

    def _feed(self, buf: bytes) -> None:
        pos, end = 0, len(buf)
        while pos < end or self._state == _DONE:
            state = self._state
            if state in (_LENGTH, _CHUNK_DATA):
                take = min(end - pos, self._remaining)
                self._body_bytes(buf if take == end else buf[pos : pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    if state == _LENGTH:
                        self._finish()
                    else:
                        self._state = _CHUNK_END
            elif state in (_CHUNK_SIZE, _TRAILERS):
                eol = buf.find(b"\n", pos)  # a bare LF ends the line too, as in Go's chunked reader
                if eol < 0:
                    if end - pos > MAX_HEAD:
                        raise HTTPError("chunk size line too long")
                    break
                line, pos = buf[pos:eol].removesuffix(b"\r"), eol + 1
                if state == _TRAILERS:
                    if not line:
                        self._finish()
                    continue
                size = line.split(b";", 1)[0].rstrip(b" \t")  # Go allows spaces before an extension
                if not size or size.strip(_HEX):  # int() would take "0x3", "1_0", "-1"
                    raise HTTPError(f"bad chunk size {line[:40]!r}")
                self._remaining = int(size, 16)
                self._state = _CHUNK_DATA if self._remaining > 0 else _TRAILERS
            elif state == _CHUNK_END:
                if end - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise HTTPError("chunk not followed by CRLF")
                pos += 2
                self._state = _CHUNK_SIZE
            elif state == _HEAD:
                eoh = _END_OF_HEAD.search(buf, pos)
                if (eoh.start() if eoh else end) - pos > MAX_HEAD:  # however the head arrived
                    raise HTTPError("response head too large")
                if eoh is None:
                    break
                self._head(buf[pos : eoh.start()])
                pos = eoh.end()
            elif state == _UNTIL_EOF:
                self._body_bytes(buf[pos:] if pos else buf)
                pos = end
            else:  # _DONE: bytes past the response's end make the connection unusable
                if pos < end:
                    self.keep_alive = False
                break
        self._buf = buf[pos:] if pos < end else b""

    def _head(self, head: bytes) -> None:
        lines = [line.removesuffix(b"\r") for line in head.split(b"\n")]
        version, _, rest = lines[0].partition(b" ")
        code = rest.lstrip(b" ").partition(b" ")[0]  # Go: exactly 3 digits, then a space or the end
        if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit() or code < b"100":
            raise HTTPError(f"bad status line {lines[0][:80]!r}")
        status = int(code)
        if status < 200:  # an interim response (100 Continue, 103 Early Hints): the real one follows
            return
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise HTTPError(f"bad header line {line[:80]!r}")
            key, text = name.strip().lower().decode("latin-1"), value.strip().decode("latin-1")
            if key not in headers:
                headers[key] = text
            elif key not in _FIRST_VALUE_ONLY:
                headers[key] = f"{headers[key]}, {text}"
        connection = headers.get("connection", "").lower()
        coding = headers.get("content-encoding", "identity").lower()
        if coding not in ("gzip", "identity"):
            raise HTTPError(f"unsupported content-encoding {coding!r}")
        # Go reads an HTTP/1.0 answer's Transfer-Encoding as absent, and takes none but one "chunked"
        # (a request-smuggling guard): "gzip, chunked" would leave gzip bytes undecoded.
        transfer = headers.get("transfer-encoding") if version != b"HTTP/1.0" else None
        if transfer is not None and transfer.lower() != "chunked":
            raise HTTPError(f"unsupported transfer encoding {transfer[:80]!r}")
        length = -1  # none: the body ends when the server closes the connection
        if self._no_body or status in (204, 304):
            length = 0
        elif transfer is None and "content-length" in headers:
            raw = headers["content-length"]
            values = {value.strip() for value in raw.split(",")}  # repeated, the same: Go takes it
            value = values.pop()
            if values or not value.isdigit() or not value.isascii():  # int() would take "-1", " 3", "1_0"
                raise HTTPError(f"bad content-length {raw!r}")
            length = int(value)
        # The head is whole and good: an error from here on is one while reading the body.
        self.status, self.headers = status, headers
        if "close" in connection or (version == b"HTTP/1.0" and "keep-alive" not in connection):
            self.keep_alive = False
        if coding == "gzip":
            self._gunzip = zlib.decompressobj(wbits=_GZIP)
        if length == 0:
            self._finish()
        elif transfer is not None:
            self._state = _CHUNK_SIZE
        elif length > 0:
            self._remaining = length
            self._state = _LENGTH
        else:
            self.keep_alive = False
            self._state = _UNTIL_EOF
        if self._streaming:
            self._wake()

    def _body_bytes(self, data: bytes) -> None:
        if self._gunzip is not None:
            self._gzipped = True
            try:
                data = self._gunzipped(self._gunzip, data)
            except zlib.error as err:  # trailing bytes that are no gzip member too, as Go's "invalid header"
                raise HTTPError(f"bad gzip body: {err}") from None
        if not data:
            return
        self.body.append(data)
        if self._streaming:
            self._buffered += len(data)
            if self._buffered > PAUSE_ABOVE and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
            self._wake()

    def _gunzipped(self, gunzip: zlib._Decompress, data: bytes) -> bytes:
        """Every gzip member of the body, one after another, as Go's (multistream) gzip reader."""
        if gunzip.eof:  # the last piece ended a member: these bytes start the next
            gunzip = self._gunzip = zlib.decompressobj(wbits=_GZIP)
        out = gunzip.decompress(data)
        while gunzip.eof and gunzip.unused_data:
            rest = gunzip.unused_data
            gunzip = self._gunzip = zlib.decompressobj(wbits=_GZIP)
            out += gunzip.decompress(rest)
        return out

    def _finish(self) -> None:
        self._state = _DONE
        if self._gunzip is not None:
            tail = self._gunzip.flush()
            if tail:
                self.body.append(tail)
            if self._gzipped and not self._gunzip.eof:  # cut inside the stream: not the whole body
                self._fail(HTTPError("the response body ended inside its gzip stream"))
                return
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self.error is None:  # the first cause, not the disconnection it led to
            self.error = error
            if isinstance(error, HTTPError):  # the head once it was whole and good (status 0 before):
                error.status, error.headers = self.status, self.headers  # retry.py decides from it
        self.keep_alive = False
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _expire(self, why: str) -> None:
        if self._state == _DONE:  # the whole answer came in the same turn of the loop: it stands
            return
        self._fail(TimeoutError(why))
        self.close()

    def _check_read(self) -> None:
        """One timer per read timeout, not one per read: moved on if bytes came since it was set."""
        due = self._last_read + self._read_timeout
        if self._state == _DONE:
            self._read_timer = None
        elif self._paused:  # waiting for the reader, not the server
            self._read_timer = self._loop.call_later(self._read_timeout, self._check_read)
        elif self._loop.time() < due:
            self._read_timer = self._loop.call_at(due, self._check_read)
        else:
            self._read_timer = None
            self._expire(f"no response data for {self._read_timeout:g}s")
