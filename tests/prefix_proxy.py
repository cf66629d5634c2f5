"""A tiny reverse proxy on 127.0.0.1 that serves the test apiserver under a path prefix, as
Rancher serves downstream clusters at https://rancher/k8s/clusters/<id>. It authenticates
upstream as the admin and records every path it is asked for; paths outside the prefix get 404.

The fault tests control it: `partition()` makes the apiserver unreachable (requests and open
watch streams hang, as when packets are dropped, and carry on once `heal()` is called), and
`storm(code)` answers every request with 429 or 503 (with Retry-After: 1) until `calm()`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from pykcm.testenv.controlplane import ControlPlane

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


@dataclass
class PrefixProxy:
    url: str  # http://127.0.0.1:<port><prefix>
    prefix: str
    paths: list[str] = field(default_factory=list)
    storm_code: int = 0  # answer every request with this status while set
    stormed: int = 0  # requests answered by the storm
    reachable: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.reachable.set()

    def partition(self) -> None:
        self.reachable.clear()

    def heal(self) -> None:
        self.reachable.set()

    def storm(self, code: int) -> None:
        self.storm_code = code

    def calm(self) -> None:
        self.storm_code = 0

    def outside_prefix(self) -> list[str]:
        return [p for p in self.paths if not p.startswith(self.prefix + "/")]


@contextlib.asynccontextmanager
async def prefix_proxy(plane: ControlPlane, prefix: str = "/k8s/clusters/c-test") -> AsyncIterator[PrefixProxy]:
    upstream = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=plane.ssl_context()), auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, connect=10),
    )
    proxy = PrefixProxy("", prefix)

    async def forward(request: web.Request) -> web.StreamResponse:
        proxy.paths.append(request.path)
        if not request.path.startswith(prefix + "/"):
            return web.Response(status=404, text="404 page not found\n")
        await proxy.reachable.wait()
        if proxy.storm_code:
            proxy.stormed += 1
            return web.json_response(
                {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": proxy.storm_code,
                 "message": "injected by the test proxy"}, status=proxy.storm_code, headers={"Retry-After": "1"},
            )
        target = plane.apiserver_url + request.path_qs.removeprefix(prefix)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read() if request.can_read_body else None
        async with upstream.request(request.method, target, headers=headers, data=body) as answer:
            response = web.StreamResponse(status=answer.status)
            for key, value in answer.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers[key] = value
            await response.prepare(request)
            async for chunk in answer.content.iter_any():  # streams watches event by event
                await proxy.reachable.wait()
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    proxy.url = f"http://127.0.0.1:{port}{prefix}"
    proxy.reachable.set()
    try:
        yield proxy
    finally:
        await runner.cleanup()
        await upstream.close()


def proxy_kubeconfig(path: Path, server: str) -> Path:
    """No credentials: the proxy authenticates upstream, as Rancher does for its users."""
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))
    return path
