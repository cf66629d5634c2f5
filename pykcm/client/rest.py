"""Async REST transport over aiohttp: rate limited, instrumented, JSON dicts in and out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from time import monotonic
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from pykcm import __version__
from pykcm.client import metrics
from pykcm.client.certrotation import CLIENT_CERT_REFRESH, ClientCertRotation
from pykcm.client.config import ClientConfig
from pykcm.client.errors import TooManyRequests, TransportError, error_from_status
from pykcm.client.fence import FencedWrite, WriteFence, guard_connection, sending
from pykcm.client.resources import Resource
from pykcm.util.flowcontrol import TokenBucket

JSON = "application/json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
# Metadata-only list/delete responses keep memory small for generic resources.
PARTIAL_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1," + JSON
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1," + JSON

REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=60, connect=10)
CONNECTIONS = 256  # per API server
MAX_THROTTLE_RETRIES = 10  # client-go retries 429s honouring Retry-After up to 10 times


class _Transport:
    """One connection pool per API server, shared by every named client."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.host_label = urlsplit(config.host).netloc
        self._ssl_context = config.ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._rotation: ClientCertRotation | None = None
        if config.ssl_context is not None and config.cert_file and config.key_file:
            self._rotation = ClientCertRotation(
                config.cert_file, config.key_file, config.client_tls_context, monotonic(), CLIENT_CERT_REFRESH
            )
        self._closing: set[asyncio.Task] = set()

    def session(self) -> aiohttp.ClientSession:
        self._rotate_client_certificate()
        if self._session is None or self._session.closed:
            fence = self.config.write_fence
            connector = (
                FencedConnector(fence, ssl=self._ssl_context or False, limit=CONNECTIONS)
                if fence is not None
                else aiohttp.TCPConnector(ssl=self._ssl_context or False, limit=CONNECTIONS)
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                json_serialize=lambda o: orjson.dumps(o).decode(),
                # No cookies, as client-go (a nil Jar): nothing to match or store per request.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    def _rotate_client_certificate(self) -> None:
        """New connections present a rotated client certificate; pooled ones are closed (client-go
        CloseAll()s its dialer), so requests in flight on them fail and are retried by their callers."""
        context = self._rotation.rotated(monotonic()) if self._rotation is not None else None
        if context is None:
            return
        self._ssl_context = context
        if self._session is not None:
            task = asyncio.get_running_loop().create_task(self._session.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
            self._session = None

    def url(self, path: str) -> str:
        return request_url(self.config.host, path)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await asyncio.gather(*self._closing, return_exceptions=True)


class FencedConnector(aiohttp.TCPConnector):
    """Guards every connection it hands out with the write fence (fence.guard_connection): a write
    is checked when its bytes go to the socket, not some event-loop iterations earlier (aiohttp
    sends a request body from a task of its own, which a busy loop may start milliseconds later)."""

    def __init__(self, fence: WriteFence, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._fence = fence

    async def connect(self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout) -> Any:
        conn = await super().connect(req, traces, timeout)
        if conn.protocol is not None:
            guard_connection(conn.protocol, self._fence)
        return conn


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
        self._limiter = TokenBucket(config.qps, config.burst)
        agent = config.user_agent or f"pykcm/{__version__}"
        self.user_agent = f"{agent}/{name}" if name else agent

    def named(self, name: str, qps: float | None = None, burst: int | None = None) -> RestClient:
        """A client of its own for one user of the API (a controller, the shared informers, leader
        election, delegated auth): its own user agent suffix and rate limit, this connection pool."""
        config = self.config.with_limits(qps or self.config.qps, burst or self.config.burst)
        return RestClient(config, name, self._transport)

    async def close(self) -> None:
        await self._transport.close()

    def throttled(self) -> bool:
        """Whether a request sent now would wait for this client's rate limiter."""
        return self._limiter.available() < 1.0

    # -- raw requests ---------------------------------------------------------------------------------

    def _headers(self, accept: str, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": self.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        token = self.config.token_source()
        if token:
            headers["Authorization"] = token
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
        timeout: aiohttp.ClientTimeout = REQUEST_TIMEOUT,
    ) -> Any:
        host = self._transport.host_label
        data = orjson.dumps(body) if body is not None else None
        for attempt in range(MAX_THROTTLE_RETRIES + 1):
            waited = await self._limiter.wait()
            metrics.rate_limiter_duration_by(method, host).observe(waited)
            if self.config.write_fence is not None:  # after the limiter's wait, and again at the socket
                self.config.write_fence.check(method, path)
            start = time.monotonic()
            try:
                with sending(method, path):
                    raw, code, is_json = await self._send(method, path, params, data, accept, content_type, timeout)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                metrics.requests_by("<error>", method, host).inc()
                if isinstance(exc.__cause__, FencedWrite):  # refused at the socket, in aiohttp's body writer
                    raise exc.__cause__ from None
                raise TransportError(f"{method} {path}: {exc or type(exc).__name__}") from None
            finally:
                metrics.request_duration_by(method, host).observe(time.monotonic() - start)
            metrics.requests_by(str(code), method, host).inc()
            if code < 300:
                if not raw:
                    return None
                return orjson.loads(raw) if is_json else raw.decode(errors="replace")
            err = error_from_status(code, _decode(raw))
            if isinstance(err, TooManyRequests) and attempt < MAX_THROTTLE_RETRIES:
                await asyncio.sleep(err.retry_after or 1.0)
                continue
            raise err
        raise AssertionError("unreachable")

    async def _send(
        self, method: str, path: str, params: dict[str, Any] | None, data: bytes | None, accept: str,
        content_type: str, timeout: aiohttp.ClientTimeout,
    ) -> tuple[bytes, int, bool]:
        """One HTTP exchange: the raw body, the status and whether the body is JSON."""
        async with self._transport.session().request(
            method,
            self._transport.url(path),
            params=_query(params),
            data=data,
            headers=self._headers(accept, content_type if data is not None else None),
            timeout=timeout,
        ) as resp:
            return await resp.read(), resp.status, "json" in resp.content_type

    async def watch(self, path: str, params: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events ({"type", "object"}) until the server ends the stream."""
        host = self._transport.host_label
        waited = await self._limiter.wait()
        metrics.rate_limiter_duration_by("GET", host).observe(waited)
        server_timeout = float(params.get("timeoutSeconds") or 0)
        read_timeout = server_timeout + 30 if server_timeout else None
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=read_timeout)
        try:
            async with self._transport.session().get(
                self._transport.url(path),
                params=_query({**params, "watch": "true"}),
                headers=self._headers(JSON, None),
                timeout=timeout,
            ) as resp:
                metrics.requests_by(str(resp.status), "GET", host).inc()
                if resp.status >= 300:
                    raise error_from_status(resp.status, _decode(await resp.read()))
                buffer = b""
                # Lines can be far larger than aiohttp's readline limit (big CRDs), so split by hand;
                # a chunk often holds many events: walk it by offset, keep only the unfinished tail.
                async for chunk in resp.content.iter_any():
                    buffer = buffer + chunk if buffer else chunk
                    start = 0
                    while (newline := buffer.find(b"\n", start)) >= 0:
                        line = buffer[start:newline]
                        start = newline + 1
                        if line and not line.isspace():
                            yield orjson.loads(line)
                    buffer = buffer[start:]
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise TransportError(f"watch {path}: {exc or type(exc).__name__}") from None

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


def _query(params: dict[str, Any] | None) -> dict[str, str] | None:
    if not params:
        return None
    out = {}
    for key, value in params.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def _decode(raw: bytes) -> dict[str, Any] | None:
    try:
        decoded = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"kind": "Status", "message": raw.decode(errors="replace").strip()[:500]}
    return decoded if isinstance(decoded, dict) else None
