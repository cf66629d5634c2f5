"""HTTPS for /healthz, /livez, /readyz and /metrics, guarded the way KCM guards its port.

The handler chain mirrors controller-manager's BuildHandlerChain: authenticate (client
certificate signed by the cluster's client CA, else a bearer token checked with a TokenReview,
else anonymous), then authorize (`system:masters` and the always-allowed paths pass, everything
else asks the apiserver with a SubjectAccessReview). Review answers are cached for 10 s, so a
scraper costs the apiserver at most two requests per token and path every 10 s.

Anonymous requests are authenticated as `system:anonymous` and then (unless the path is always
allowed) denied with 403, exactly as KCM answers; a token the apiserver rejects gets 401.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from pykcm.client.errors import ApiError, TransportError
from pykcm.serving.authn import DelegatingAuthenticator, Unauthenticated
from pykcm.serving.authz import DelegatingAuthorizer
from pykcm.serving.certs import ServingError
from pykcm.serving.healthz import HealthCheck, checks_for, evaluate, run_check
from pykcm.util.log import get_logger

log = get_logger("server")

HEALTH_ENDPOINTS = ("healthz", "livez", "readyz")


def _status(code: int, reason: str, message: str) -> web.Response:
    """A metav1.Status body, as the apiserver's filters write them."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {},
        "code": code,
    }
    if code == 401:
        del body["details"]
    return web.Response(
        status=code, body=orjson.dumps(body, option=orjson.OPT_INDENT_2), content_type="application/json"
    )


class SecureServer:
    """The aiohttp application on the manager's event loop."""

    def __init__(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        health_checks: Callable[[], Sequence[HealthCheck]],
        authenticator: DelegatingAuthenticator,
        authorizer: DelegatingAuthorizer,
    ) -> None:
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.health_checks = health_checks
        self.authenticator = authenticator
        self.authorizer = authorizer
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        for endpoint in HEALTH_ENDPOINTS:
            app.router.add_get(f"/{endpoint}", self._health(endpoint))
            app.router.add_get(f"/{endpoint}/{{check}}", self._single_check(endpoint))
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> None:
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=self.ssl_context, reuse_address=True)
        try:
            await site.start()
        except OSError as err:
            await runner.cleanup()
            raise ServingError(f"failed to listen on {self.host}:{self.port}: {err.strerror or err}") from None
        self._runner = runner
        log.info("Serving securely", address=f"{self.host}:{self.port}")

    async def stop(self) -> None:
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        start = time.monotonic()
        response = await self._authorized(request, handler)
        response.headers["Cache-Control"] = "no-cache, private"
        log.v(3).info(
            "HTTP", verb=request.method, path=request.path, status=response.status,
            latency=f"{(time.monotonic() - start) * 1000:.3f}ms",
        )
        return response

    async def _authorized(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        try:
            user = await self.authenticator.authenticate(request)
        except Unauthenticated:
            return _status(401, "Unauthorized", "Unauthorized")
        verb = request.method.lower()
        try:
            decision = await self.authorizer.authorize(user, verb, request.path)
        except (ApiError, TransportError) as err:
            log.error(err, "Authorization failed", user=user.name, path=request.path)
            return _status(500, "InternalError", "Internal error occurred: authorization failed")
        if not decision.allowed:
            message = f"forbidden: User {orjson.dumps(user.name).decode()} cannot {verb} path "
            message += orjson.dumps(request.path).decode()
            if decision.reason:
                message += f": {decision.reason}"
            return _status(403, "Forbidden", message)
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return web.Response(status=404, text="404 page not found\n")

    def _health(self, endpoint: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            checks = checks_for(endpoint, self.health_checks())
            result = evaluate(endpoint, checks, request.query.getall("exclude", []), "verbose" in request.query)
            return _text(result.status, result.body)

        return handle

    def _single_check(self, endpoint: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            name = request.match_info["check"]
            check = next((c for c in checks_for(endpoint, self.health_checks()) if c.name == name), None)
            if check is None:
                return web.Response(status=404, text="404 page not found\n")
            reason = run_check(check)
            if reason is None:
                return _text(200, "ok")
            return _text(500, f"internal server error: {reason}\n")

        return handle

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _text(status: int, body: str) -> web.Response:
    return web.Response(
        status=status,
        text=body,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )
