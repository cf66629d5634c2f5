"""HTTPS for health, /metrics, /metrics/slis, /statusz, /flagz, /configz and /debug/flags, guarded as KCM's port.

The handler chain mirrors controller-manager's BuildHandlerChain: authenticate (client
certificate signed by the cluster's client CA, else a bearer token checked with a TokenReview,
else anonymous), then authorize (`system:masters` and the always-allowed paths pass, everything
else asks the apiserver with a SubjectAccessReview). Review answers are cached for 10 s, so a
scraper costs the apiserver at most two requests per token and path every 10 s.

Anonymous requests are authenticated as `system:anonymous` and then (unless the path is always
allowed) denied with 403, exactly as KCM answers; a token the apiserver rejects gets 401.
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence

import orjson
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, REGISTRY, CollectorRegistry, generate_latest

from pykcm.client.errors import ApiError, TransportError
from pykcm.serving import debugflags, zpages
from pykcm.serving.accept import parse_accept
from pykcm.serving.authn import DelegatingAuthenticator, Unauthenticated
from pykcm.serving.authz import DelegatingAuthorizer
from pykcm.serving.certs import ServingError
from pykcm.serving.healthz import (
    SLI_REGISTRY,
    HealthCheck,
    checks_for,
    evaluate,
    reset_slis,
    run_check,
)
from pykcm.serving.http import HTTPServer
from pykcm.serving.listen import listen_failure
from pykcm.serving.messages import Request, Response
from pykcm.util.hostport import join_host_port
from pykcm.util.log import get_logger, one_line
from pykcm.util.process import process_start_time

_NAME_ESCAPINGS = frozenset({"allow-utf-8", "underscores", "dots", "values"})
log = get_logger("server")

HEALTH_ENDPOINTS = ("healthz", "livez", "readyz")
# What /statusz lists, as KCM's mux had them listed when /statusz was installed (so without it);
# /debug/flags is unlisted there too.
LISTED_PATHS = ("/configz", "/flagz", "/healthz", "/livez", "/metrics", "/metrics/slis", "/readyz")


def _status(code: int, reason: str, message: str) -> Response:
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
    headers = {"Content-Type": "application/json"}
    if code == 401:
        del body["details"]
    else:  # the apiserver's Forbidden and InternalError writers add it; its Unauthorized does not
        headers["X-Content-Type-Options"] = "nosniff"
    return Response(code, orjson.dumps(body, option=orjson.OPT_INDENT_2), headers)


class SecureServer:
    """The secure port's handler chain on pykcm.serving.http, on the manager's event loop."""

    def __init__(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        health_checks: Callable[[], Sequence[HealthCheck]],
        authenticator: DelegatingAuthenticator,
        authorizer: DelegatingAuthorizer,
        debug_flags: bool = True,  # --profiling
        component: zpages.Component | None = None,  # for /statusz and /flagz; None: not served
    ) -> None:
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.health_checks = health_checks
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.debug_flags = debug_flags
        self.component = component
        self._http: HTTPServer | None = None

    async def start(self) -> None:
        http = HTTPServer(self._guard)
        try:
            await http.start(self.host, self.port, self.ssl_context)
        except OSError as err:
            raise ServingError(listen_failure(self.host, self.port, err)) from None
        self._http = http
        # KCM's printf-style line, with the listener's address (as KCM's: [::]:10257).
        log.info(f"Serving securely on {join_host_port(*http.sockname)}")

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.stop()
            self._http = None

    async def _guard(self, request: Request) -> Response:
        start = time.monotonic()
        response = await self._authorized(request)
        response.headers["Cache-Control"] = "no-cache, private"
        log.v(3).info(
            "HTTP", verb=request.method, path=request.path, status=response.status,
            latency=f"{(time.monotonic() - start) * 1000:.3f}ms",
        )
        return response

    async def _authorized(self, request: Request) -> Response:
        """Authenticate, authorize, then route: an unknown path is a 404 only to whom may ask for it."""
        try:
            user = await self.authenticator.authenticate(request)
        except Unauthenticated:
            return _status(401, "Unauthorized", "Unauthorized")
        verb = request.method.lower()
        try:
            decision = await self.authorizer.authorize(user, verb, request.path)
        except (ApiError, TransportError) as err:
            log.error(err, "Authorization failed", user=user.name, path=request.path)
            # As the apiserver's authorization filter (responsewriters.InternalError, Go's http.Error)
            reason = one_line(err)
            return _text(500, f"Internal Server Error: {orjson.dumps(request.target).decode()}: {reason}\n")
        if not decision.allowed:
            message = f"forbidden: User {orjson.dumps(user.name).decode()} cannot {verb} path "
            message += orjson.dumps(request.path).decode()
            if decision.reason:
                message += f": {decision.reason}"
            return _status(403, "Forbidden", message)
        handler = self._route(request.path)
        if handler is None:
            return _not_found()
        return await handler(request)  # any method, as KCM's health and metrics handlers answer

    def _route(self, path: str) -> Callable[[Request], Awaitable[Response]] | None:
        """The handler of a path (the metrics, debugging pages, /{endpoint} or /{endpoint}/{check}), matched
        on the percent-decoded path, as KCM's mux matches URL.Path (/%6detrics is /metrics)."""
        if path == "/metrics":
            return self._metrics
        if path == "/metrics/slis":
            return self._slis
        if self.debug_flags and debugflags.is_debug_flags_path(path):
            return debugflags.serve
        component = self.component
        if component is not None and path in (zpages.STATUSZ_PATH, zpages.FLAGZ_PATH):
            served = component.statusz if path == zpages.STATUSZ_PATH else component.flagz
            return (lambda request: _zpage(component, request)) if served else None
        if component is not None and component.config is not None and path == zpages.CONFIGZ_PATH:
            return lambda request: _configz(component)
        _, endpoint, *rest = path.split("/")
        if endpoint not in HEALTH_ENDPOINTS or len(rest) > 1 or (rest and not rest[0]):
            return None
        if not rest:
            return lambda request: self._health(endpoint, request)
        return lambda request: self._single_check(endpoint, rest[0])

    async def _health(self, endpoint: str, request: Request) -> Response:
        checks = checks_for(endpoint, self.health_checks())
        result = evaluate(endpoint, checks, request.query.getall("exclude", []), "verbose" in request.query)
        return _text(result.status, result.body)

    async def _single_check(self, endpoint: str, name: str) -> Response:
        check = next((c for c in checks_for(endpoint, self.health_checks()) if c.name == name), None)
        if check is None:
            return _not_found()
        reason = run_check(check)
        if reason is None:
            return _text(200, "ok")
        return _text(500, f"internal server error: {reason}\n")

    async def _metrics(self, request: Request) -> Response:
        return _exposition(REGISTRY, request)

    async def _slis(self, request: Request) -> Response:
        if request.method == "DELETE":
            reset_slis()
            return Response(200, b"metrics reset\n", {"Content-Type": _PLAIN})
        return _exposition(SLI_REGISTRY, request)


_PLAIN = "text/plain; charset=utf-8"


async def _zpage(component: zpages.Component, request: Request) -> Response:
    accept = request.headers.get("Accept", "")
    pretty = zpages.pretty_requested(request.headers.get("User-Agent", ""), request.query)
    respond = zpages.statusz_response if request.path == zpages.STATUSZ_PATH else zpages.flagz_response
    status, headers, body = respond(component, accept, pretty=pretty)
    return Response(status, body, headers)


async def _configz(component: zpages.Component) -> Response:
    status, headers, body = zpages.configz_response(component)
    return Response(status, body, headers)


def _exposition(registry: CollectorRegistry, request: Request) -> Response:
    """Prometheus text with KCM's headers (promhttp's, with its process start time)."""
    headers = {
        "Content-Type": metrics_content_type(request.headers.get("Accept", "")),
        "Process-Start-Time-Unix": str(int(process_start_time())),
    }
    return Response(200, go_bounds(generate_latest(registry)), headers)


# prometheus/common writes a whole-number bucket bound or quantile as Go does ("1", "10"),
# prometheus_client as Python does ("1.0"). Prometheus 2 keeps `le` as scraped, so a query
# naming le="1", written against KCM, would find none of pykcm's buckets.
_WHOLE_BOUND = re.compile(rb'([{,](?:le|quantile)="-?[0-9]+)\.0"')


def go_bounds(exposition: bytes) -> bytes:
    """The `le` and `quantile` label values of a text exposition spelled as Go spells them."""
    return _WHOLE_BOUND.sub(rb'\1"', exposition)


def _not_found() -> Response:
    return Response(404, b"404 page not found\n", {"Content-Type": _PLAIN})


def _text(status: int, body: str) -> Response:
    return Response(status, body.encode(), {"X-Content-Type-Options": "nosniff", "Content-Type": _PLAIN})


def metrics_content_type(accept: str) -> str:
    """KCM's /metrics Content-Type for `accept` (prometheus/common's expfmt.Negotiate, text only):
    the text format 0.0.4 with the name escaping the Accept asks for, underscores by default.
    prometheus_client's CONTENT_TYPE_LATEST says version=1.0.0 for the same bytes (pykcm's
    metric names need no escaping, so the bytes do not depend on it)."""
    escaping = "underscores"
    for typ, sub, params in parse_accept(accept):  # goautoneg's order, as expfmt.Negotiate reads it
        if params.get("escaping") in _NAME_ESCAPINGS:
            escaping = params["escaping"]
        if (typ, sub) == ("text", "plain") and params.get("version", "") in ("0.0.4", ""):
            break
    return f"{CONTENT_TYPE_PLAIN_0_0_4}; escaping={escaping}"
