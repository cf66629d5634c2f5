"""Async REST transport over pykcm.client.http: rate limited, instrumented, JSON dicts in and out."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from time import monotonic
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from pykcm import __version__
from pykcm.client import metrics, retry
from pykcm.client.certrotation import CLIENT_CERT_REFRESH, TLSFileRotation
from pykcm.client.config import ClientConfig
from pykcm.client.errors import ApiError, TransportError, error_from_status, generic_server_response
from pykcm.client.fence import FencedWrite, sending
from pykcm.client.http import ConnectionPool, Stream, Timeout
from pykcm.client.httpconnection import HTTPError
from pykcm.client.protobuf import MAGIC, PROTOBUF, WATCH_ACCEPT, WatchDecoder, decode_status
from pykcm.client.resources import Resource
from pykcm.util.durations import go_duration
from pykcm.util.flowcontrol import client_rate_limiter
from pykcm.util.hostport import host_of, redacted
from pykcm.util.log import get_logger, one_line

JSON = "application/json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
# Metadata-only list/delete responses keep memory small for generic resources.
PARTIAL_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1," + JSON
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1," + JSON

REQUEST_TIMEOUT = Timeout(total=60, connect=10)
WATCH_CONNECT_TIMEOUT = 10.0
WATCH_READ_MARGIN = 30.0  # a watch is given up if nothing came this long past its server-side timeout
CONNECTIONS = 256  # per API server
# client-go logs a wait for its rate limiter over LONG_THROTTLE at V(3); over EXTRA_LONG_THROTTLE
# also at V(2) at most once a second, or at V(0) at most once in 10 s: KCM's well-known hint
# to raise --kube-api-qps.
LONG_THROTTLE, EXTRA_LONG_THROTTLE = 0.05, 1.0
CLIENT_SIDE_THROTTLING = "client-side throttling, not priority and fairness"

log = get_logger("rest")


class _Transport:
    """One connection pool per API server, shared by every named client."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.host_label = host_of(config.host)  # no user info: a password in --master is no label
        self._ssl_context = config.ssl_context
        self._pool: ConnectionPool | None = None
        self._rotation: TLSFileRotation | None = None
        if config.ssl_context is not None and (config.ca_file or (config.cert_file and config.key_file)):
            self._rotation = TLSFileRotation(config.ca_file, config.cert_file, config.key_file,
                                             config.client_tls_context, monotonic(), CLIENT_CERT_REFRESH)

    def pool(self) -> ConnectionPool:
        self._rotate_tls_files()
        if self._pool is None:
            # The fence is checked by the pool in the step that writes a request (see fence.py).
            self._pool = ConnectionPool(self.config.host, self._ssl_context, CONNECTIONS, self.config.write_fence,
                                        server_name=self.config.server_name, proxy=self.config.proxy_url,
                                        disable_compression=self.config.disable_compression)
        return self._pool

    def _rotate_tls_files(self) -> None:
        """New connections present a rotated client certificate and trust a rotated CA. For a new
        certificate pooled connections are closed (client-go CloseAll()s its dialer), so requests in
        flight on them fail and are retried by their callers; for a new CA only idle ones, as client-go."""
        rotated = self._rotation.rotated(monotonic()) if self._rotation is not None else None
        if rotated is None:
            return
        self._ssl_context = rotated.context
        if self._pool is not None:
            self._pool.use_tls(rotated.context, close_busy=rotated.client_certificate)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


def request_url(host: str, path: str) -> str:
    """The URL of an API path on `host`, whose own path (a proxy's, e.g. Rancher's
    /k8s/clusters/c-x) prefixes every request, as client-go keeps rest.Config.Host's path."""
    return f"{host.rstrip('/')}/{path.lstrip('/')}"


class RestClient:
    """A named API client: its own QPS/burst bucket and user agent, a shared connection pool."""

    def __init__(self, config: ClientConfig, name: str = "", _transport: _Transport | None = None) -> None:
        self.config = config
        self.name = name
        self._transport = _transport or _Transport(config)
        self._limiter = client_rate_limiter(config.qps, config.burst)  # None: not limited
        agent = config.user_agent or f"pykcm/{__version__}"
        self.user_agent = f"{agent}/{name}" if name else agent
        self._impersonation: dict[str, list[str]] = {}  # each Impersonate-* header with its values
        for header, value in config.impersonate:
            self._impersonation.setdefault(header, []).append(value)

    def named(self, name: str, qps: float | None = None, burst: int | None = None) -> RestClient:
        """A client of its own for one user of the API (a controller, the shared informers, leader
        election, delegated auth): its own user agent suffix and rate limit, this connection pool."""
        config = self.config.with_limits(qps or self.config.qps, burst or self.config.burst)
        return RestClient(config, name, self._transport)

    async def close(self) -> None:
        await self._transport.close()

    # -- raw requests ---------------------------------------------------------------------------------

    def _headers(self, accept: str, content_type: str | None) -> dict[str, str | list[str]]:
        headers: dict[str, str | list[str]] = {"Accept": accept, "User-Agent": self.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        token = self.config.token_source()
        if token:
            headers["Authorization"] = token
        if self.config.impersonate:
            headers.update(self._impersonation)
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        accept: str = JSON,
        timeout: Timeout = REQUEST_TIMEOUT,
    ) -> Any:
        host = self._transport.host_label
        data = orjson.dumps(body) if body is not None else None
        target = _target(path, params)
        again: retry.Retry | None = None  # what the last attempt asked for
        attempt = 0
        while True:
            attempt += 1
            if self._limiter is not None:
                waited = await self._limiter.wait()
                metrics.rate_limiter_duration_by(method, host).observe(waited)
                if waited > LONG_THROTTLE:
                    _throttle_log.waited(waited, again.reason if again else CLIENT_SIDE_THROTTLING, method,
                                         request_url(redacted(self.config.host), target))
            if self.config.write_fence is not None:  # after the limiter's wait, and again at the socket
                self.config.write_fence.check(method, path)
            start = time.monotonic()
            failed: BaseException | None = None
            try:
                with sending(method, path):  # the pool checks the fence again as it writes
                    headers = self._headers(accept, content_type if data is not None else None)
                    resp = await self._transport.pool().request(method, target, headers, data, timeout)
            except FencedWrite:
                self._count(attempt, "<error>", method, host)
                raise
            except (TimeoutError, HTTPError, OSError) as exc:
                failed = exc
            finally:  # the attempt's own time, not the wait before the next one
                metrics.request_duration_by(method, host).observe(time.monotonic() - start)
                metrics.request_size_by(method, host).observe(len(data) if data else 0)  # as client-go: sent or not
            if failed is not None:
                message = f"{method} {path}: {one_line(failed)}"
                again = await self._retry_after(attempt, method, target, error=failed, message=message)
                if again is None:
                    raise TransportError(message, retry.is_connection_reset(failed)) from None
                continue
            again = await self._retry_after(attempt, method, target, status=resp.status, headers=resp.headers)
            if again is not None:
                continue
            metrics.response_size_by(method, host).observe(len(resp.body))  # the answer the caller gets
            if resp.status < 300:
                return _success_body(method, path, accept, resp.headers.get("content-type", ""), resp.body)
            self._refused(resp.status)
            raise response_error(method, resp.status, resp.headers, resp.body)

    def _refused(self, status: int) -> None:
        if status == 401 and self.config.on_unauthorized is not None:  # the token is bad: ask for a new one
            self.config.on_unauthorized()

    @staticmethod
    def _count(attempt: int, code: str, method: str, host: str) -> None:
        """Every attempt counts as a request; the second and later also as retries, as in client-go."""
        metrics.requests_by(code, method, host).inc()
        if attempt > 1:
            metrics.retries_by(code, method, host).inc()

    async def _retry_after(
        self,
        attempt: int,
        method: str,
        target: str,
        *,
        status: int = 0,
        headers: Mapping[str, str] | None = None,
        error: BaseException | None = None,
        message: str = "",
        timeouts: bool = False,
    ) -> retry.Retry | None:
        """Count attempt `attempt`'s answer (`status` and `headers`) or `error`; when retry.py says
        it is to be sent again, wait the delay and return why, else None (the caller's to raise)."""
        if error is not None:  # a body cut after the head counts as its status, as client-go's
            code = retry.head_status(error)
            self._count(attempt, str(code) if code else "<error>", method, self._transport.host_label)
            again = retry.after_error(attempt, method, error, message, timeouts=timeouts)
        else:
            self._count(attempt, str(status), method, self._transport.host_label)
            again = retry.after_response(attempt, status, headers or {})
        if again is not None:
            log.v(4).info("Got a Retry-After response", delay=go_duration(again.wait), attempt=attempt,
                          url=request_url(redacted(self.config.host), target))
            await asyncio.sleep(again.wait)
        return again

    async def watch(
        self, path: str, params: dict[str, Any], decoder: WatchDecoder | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events ({"type", "object"}) until the server ends the stream; with `decoder`,
        protobuf is asked for (client/protobuf.py) and JSON accepted, as client-go does: the
        server answers JSON for a type it cannot encode as protobuf (a custom resource)."""
        # Not rate limited, as client-go's Watch is not (the reflector backs off on its own): a
        # re-watch after an outage does not wait behind writes, nor take their tokens.
        server_timeout = float(params.get("timeoutSeconds") or 0)
        read_timeout = server_timeout + WATCH_READ_MARGIN if server_timeout else None
        timeout = Timeout(connect=WATCH_CONNECT_TIMEOUT, read=read_timeout)
        accept = f"{WATCH_ACCEPT}, {JSON}" if decoder is not None else JSON
        try:
            resp = await self._open_watch(_target(path, {**params, "watch": "true"}), accept, timeout, path)
            try:
                if not resp.headers.get("content-type", "").startswith(PROTOBUF):
                    decoder = None
                # A chunk often holds many events, and an event (a big CRD) may span many chunks:
                # walk each chunk by offset, keep only the unfinished tail, grown in place (linear
                # time however many chunks an event spans).
                tail = bytearray()
                while (chunk := await resp.next_chunk()) is not None:
                    scanned = len(tail)  # no newline in it
                    data: bytes | bytearray = chunk
                    if tail:
                        tail += chunk
                        data = tail
                    start = 0
                    if decoder is not None:  # frames: a 4-byte big-endian length, then the event
                        while len(data) - start >= 4:
                            size = int.from_bytes(data[start : start + 4], "big")
                            if not 0 < size <= MAX_WATCH_FRAME:  # as client-go's stream decoder
                                yield watch_decoding_error("empty data" if size == 0 else OBJECT_TOO_LARGE)
                                return
                            end = start + 4 + size
                            if end > len(data):
                                break
                            yield decoder.event(data[start + 4 : end])
                            start = end
                    else:
                        while (newline := data.find(b"\n", max(start, scanned))) >= 0:
                            line = data[start:newline]
                            start = newline + 1
                            if line and not line.isspace():
                                try:
                                    event = orjson.loads(line)
                                except orjson.JSONDecodeError as err:  # client-go's decoder error event
                                    yield watch_decoding_error(str(err))
                                    return
                                if not isinstance(event, dict):
                                    yield watch_decoding_error(f"not a watch event: {line[:64]!r}")
                                    return
                                yield event
                    if data is tail:
                        del tail[:start]  # from the front: CPython moves no bytes
                    else:
                        tail += memoryview(chunk)[start:]
            finally:
                resp.close()
        except (TimeoutError, HTTPError, OSError) as exc:
            ended = retry.is_broken_connection(exc) or isinstance(exc, TimeoutError)
            raise TransportError(f"watch {path}: {one_line(exc)}", retry.is_connection_reset(exc), ended) from None

    async def _open_watch(self, target: str, accept: str, timeout: Timeout, path: str) -> Stream:
        """The watch's response, once its head says 2xx. As client-go's Watch, the request is sent
        again after a 429 or 5xx's Retry-After, and after 1 s when its connection broke or timed out;
        other failures are the caller's (the reflector backs off and watches again)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = await self._transport.pool().stream("GET", target, self._headers(accept, None), timeout)
            except (TimeoutError, HTTPError, OSError) as exc:
                message = f"watch {path}: {one_line(exc)}"
                if await self._retry_after(attempt, "GET", target, error=exc, message=message, timeouts=True):
                    continue
                raise
            if resp.status < 300:
                self._count(attempt, str(resp.status), "GET", self._transport.host_label)
                return resp
            try:
                body = await resp.read()
            finally:
                resp.close()
            if not await self._retry_after(attempt, "GET", target, status=resp.status, headers=resp.headers):
                self._refused(resp.status)
                raise response_error("GET", resp.status, resp.headers, body)

    # -- typed helpers over Resource ------------------------------------------------------------------

    async def get(self, res: Resource, name: str, namespace: str | None = None, subresource: str | None = None) -> dict:
        return await self.request("GET", res.path(namespace, name, subresource))

    async def list(self, res: Resource, namespace: str | None = None, accept: str = JSON, **params: Any) -> dict:
        return await self.request("GET", res.path(namespace), params=params, accept=accept)

    async def create(self, res: Resource, body: dict, namespace: str | None = None) -> dict:
        namespace = namespace or body.get("metadata", {}).get("namespace")
        return await self.request("POST", res.path(namespace), body=body)

    async def update(self, res: Resource, body: dict, subresource: str | None = None) -> dict:
        meta = body["metadata"]
        return await self.request("PUT", res.path(meta.get("namespace"), meta["name"], subresource), body=body)

    async def patch(
        self,
        res: Resource,
        name: str,
        body: dict,
        namespace: str | None = None,
        content_type: str = STRATEGIC_MERGE_PATCH,
        subresource: str | None = None,
    ) -> dict:
        return await self.request(
            "PATCH", res.path(namespace, name, subresource), body=body, content_type=content_type
        )

    async def delete(
        self, res: Resource, name: str, namespace: str | None = None, body: dict | None = None, accept: str = JSON
    ) -> Any:
        return await self.request("DELETE", res.path(namespace, name), body=body, accept=accept)

    async def delete_collection(
        self, res: Resource, namespace: str | None = None, body: dict | None = None, accept: str = JSON, **params: Any
    ) -> Any:
        return await self.request("DELETE", res.path(namespace), params=params, body=body, accept=accept)


def _target(path: str, params: dict[str, Any] | None) -> str:
    """The request target: the API path, escaped as a URL path, and its query string."""
    query = _query(params)
    path = quote(path, safe="/:@!$&'()*+,;=~")
    return f"{path}?{urlencode(query)}" if query else path


def _query(params: dict[str, Any] | None) -> dict[str, str] | None:
    if not params:
        return None
    out = {}
    for key, value in params.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def _success_body(method: str, path: str, accept: str, content_type: str, body: bytes) -> Any:
    """A 2xx answer's body: decoded JSON where JSON was asked for, as text where text was; an answer
    that cannot be decoded as asked is the caller's TransportError, as client-go's decode error."""
    if not body:
        return None
    if "json" not in accept:
        return body.decode(errors="replace")
    if content_type and "json" not in content_type:  # no type: the JSON asked for, as client-go assumes
        raise TransportError(f"{method} {path}: serializer for {content_type} doesn't exist")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise TransportError(f"{method} {path}: the answer is not JSON: {err}") from None


def response_error(method: str, code: int, headers: Mapping[str, str], body: bytes) -> ApiError:
    """The error an error answer stands for: its Status (JSON or protobuf), else client-go's generic
    error for the code, with the answer's text when it is text (no Status: a proxy's, a webhook's)."""
    if body[:4] == MAGIC:
        return error_from_status(code, decode_status(body))
    with contextlib.suppress(orjson.JSONDecodeError):
        status = orjson.loads(body)
        if isinstance(status, dict) and status.get("kind") == "Status":
            return error_from_status(code, status)
    content_type = headers.get("content-type", "")
    text = not content_type or content_type.split(";")[0].strip().lower().startswith("text/")
    message = body[:MAX_UNSTRUCTURED_TEXT].decode(errors="replace").strip() if text else "unknown"
    return generic_server_response(code, method, message)


MAX_UNSTRUCTURED_TEXT = 2048  # client-go's cap on an error answer's text
MAX_WATCH_FRAME = 16 * 1024 * 1024  # apimachinery's streaming decoder reads no larger object
OBJECT_TOO_LARGE = "object to decode was longer than maximum allowed size"  # its ErrObjectTooLarge


def watch_decoding_error(err: str) -> dict[str, Any]:
    """The ERROR event client-go's StreamWatcher ends a watch with when the stream cannot be read
    (its ClientWatchDecoding reporter): the reflector then lists and watches again, in protobuf."""
    message = f"unable to decode an event from the watch stream: {err}"
    status = generic_server_response(500, "GET", message).status
    status["details"]["causes"].append({"reason": "ClientWatchDecoding", "message": message})
    return {"type": "ERROR", "object": status}


class _ThrottleLog:
    """client-go's tryThrottle logging: every long wait at V(3), very long ones rate limited."""

    _EVERY = {2: 1.0, 0: 10.0}  # level: at most one line this often

    def __init__(self) -> None:
        self._last = dict.fromkeys(self._EVERY, float("-inf"))

    def waited(self, delay: float, reason: str, verb: str, url: str) -> None:
        kv = {"delay": go_duration(delay), "reason": reason, "verb": verb, "URL": url}
        log.v(3).info("Waited before sending request", **kv)
        if delay <= EXTRA_LONG_THROTTLE:
            return
        level = 2 if log.v(2).enabled() else 0
        now = monotonic()
        if now - self._last[level] >= self._EVERY[level]:
            self._last[level] = now
            log.v(level).info("Waited before sending request", **kv)


_throttle_log = _ThrottleLog()
