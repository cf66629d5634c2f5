"""HTTP/1.1 requests as the secure port's server (serving/http.py) reads them: the types a handler
sees, and the parsing of a request's head, as strict as Go's net/http about what it refuses."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, unquote

_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


class Headers(dict[str, str]):
    """Request headers under lower-case names; a repeated header's values joined with ', '."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())


class Query(dict[str, list[str]]):
    """The query's values by name, in order; `?verbose` has the value ''."""

    def getall(self, name: str, default: list[str] | None = None) -> list[str]:
        return self.get(name, default if default is not None else [])


class Request:
    __slots__ = ("body", "headers", "method", "path", "query", "raw_path", "ssl_object", "target", "version")

    def __init__(
        self, method: str, raw_path: str, query: Query, headers: Headers, version: str, ssl_object: Any,
        body: bytes = b"", target: str = "",
    ) -> None:
        self.method, self.raw_path, self.query, self.headers = method, raw_path, query, headers
        self.path = unquote(raw_path)  # what authorization and routing see, as Go's URL.Path
        self.target = target or raw_path  # the request line's, query included (Go's RequestURI)
        self.version, self.ssl_object = version, ssl_object  # ssl.SSLObject: the client certificate
        self.body = body  # empty where it was not read (chunked, or over MAX_BODY)


class Response:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers if headers is not None else {}


Handler = Callable[[Request], Awaitable[Response]]


class Refused(Exception):
    """A request the protocol itself refuses: answered with this status, then the connection closes."""

    def __init__(self, status: int) -> None:
        self.status = status


def head_end(buf: bytearray, start: int) -> tuple[int, int] | None:
    """Where the head's blank line is (its first byte, and where the body starts), looked for line
    by line from `start`; None if not yet there. A line at a time: a search for the blank line
    itself would scan every pipelined request behind this one, again for each of them."""
    pos = start
    while (newline := buf.find(b"\n", pos)) >= 0:
        if buf[newline + 1 : newline + 2] == b"\n":
            return newline, newline + 2
        if buf[newline + 1 : newline + 3] == b"\r\n":
            return newline, newline + 3
        pos = newline + 1
    return None


def request_line(line: bytes) -> tuple[str, str, str]:
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _TOKEN or not parts[1]:
        raise Refused(400)
    method, target, version = parts
    if not version.startswith(b"HTTP/") or len(version) != 8 or version[6:7] != b".":
        raise Refused(400)
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise Refused(505)
    if target.startswith((b"http://", b"https://")):  # absolute-form: only its path counts
        target = b"/" + target.split(b"/", 3)[3] if target.count(b"/") >= 3 else b"/"
    if not target.startswith(b"/") or any(c <= 0x20 or c == 0x7F for c in target):
        raise Refused(400)
    return method.decode("ascii"), target.decode("latin-1"), version.decode("ascii")


def parse_headers(lines: list[bytes]) -> Headers:
    headers = Headers()
    for line in lines:
        name, colon, value = line.partition(b":")
        # No space before the colon, no folded lines, no stray CR: ambiguous heads are refused.
        if not colon or not name or not set(name) <= _TOKEN or b"\r" in value or b"\0" in value:
            raise Refused(400)
        key, text = name.decode("ascii").lower(), value.strip(b" \t").decode("latin-1")
        if key in headers:
            if key == "content-length" and headers[key] != text:
                raise Refused(400)  # two different lengths: which body is meant cannot be known
            if key != "content-length":
                text = f"{headers[key]}, {text}"
        dict.__setitem__(headers, key, text)
    return headers


def parse_query(query: str) -> Query:
    values = Query()
    if query:
        for name, value in parse_qsl(query, keep_blank_values=True):
            values.setdefault(name, []).append(value)
    return values
