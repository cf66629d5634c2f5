"""A tiny reverse proxy on 127.0.0.1 that serves the test apiserver under a path prefix, as
Rancher serves downstream clusters at https://rancher/k8s/clusters/<id>. It authenticates
upstream as the admin and records every path it is asked for; paths outside the prefix get 404."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from pykcm.testenv.controlplane import ControlPlane

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


@dataclass
class PrefixProxy:
    url: str  # http://127.0.0.1:<port><prefix>
    prefix: str
    paths: list[str] = field(default_factory=list)

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
    try:
        yield proxy
    finally:
        await runner.cleanup()
        await upstream.close()
