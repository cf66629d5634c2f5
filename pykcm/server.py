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
import datetime
import hashlib
import ipaddress
import os
import socket
import ssl
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from pykcm.client.errors import ApiError, TransportError
from pykcm.client.resources import CONFIGMAPS
from pykcm.client.rest import RestClient
from pykcm.healthz import HealthCheck, evaluate, run_check
from pykcm.log import get_logger

log = get_logger("server")

ANONYMOUS_USER = "system:anonymous"
UNAUTHENTICATED_GROUP = "system:unauthenticated"
AUTHENTICATED_GROUP = "system:authenticated"
PRIVILEGED_GROUPS = ("system:masters",)  # KCM's --authorization-always-allow-groups default
REVIEW_CACHE_TTL = 10.0  # KCM: --authentication-token-webhook-cache-ttl and the authz allow/deny TTLs
REVIEW_CACHE_SIZE = 4096
CLIENT_CA_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
HEALTH_ENDPOINTS = ("healthz", "livez", "readyz")
CERT_VALIDITY = datetime.timedelta(days=365)


class ServingError(Exception):
    """The server could not start (bad certificate files, port taken); one line for the user."""


class Unauthenticated(Exception):
    """The request carried credentials the apiserver did not accept."""


@dataclass(frozen=True)
class UserInfo:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)


ANONYMOUS = UserInfo(ANONYMOUS_USER, groups=(UNAUTHENTICATED_GROUP,))

K = TypeVar("K")
V = TypeVar("V")
_MISSING: Any = object()


class TTLCache(Generic[K, V]):
    """A small expiring map; the oldest entry goes when full, so memory stays bounded."""

    def __init__(self, ttl: float, size: int = REVIEW_CACHE_SIZE, clock: Callable[[], float] = time.monotonic):
        self.ttl = ttl
        self.size = size
        self._clock = clock
        self._entries: dict[K, tuple[float, V]] = {}

    def get(self, key: K, default: Any = None) -> Any:
        entry = self._entries.get(key)
        if entry is None:
            return default
        if entry[0] <= self._clock():
            del self._entries[key]
            return default
        return entry[1]

    def put(self, key: K, value: V) -> None:
        self._entries.pop(key, None)
        if len(self._entries) >= self.size:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = (self._clock() + self.ttl, value)


def _authenticated(user: UserInfo) -> UserInfo:
    """Every authenticated user is in system:authenticated (apiserver's AuthenticatedGroupAdder)."""
    if AUTHENTICATED_GROUP in user.groups:
        return user
    return UserInfo(user.name, user.uid, (*user.groups, AUTHENTICATED_GROUP), user.extra)


# --------------------------------------------------------------------------------------------
# authentication
# --------------------------------------------------------------------------------------------


class DelegatingAuthenticator:
    """Client certificate, else bearer token via TokenReview, else anonymous."""

    def __init__(self, client: RestClient | None, cache_ttl: float = REVIEW_CACHE_TTL) -> None:
        self.client = client
        self._cache: TTLCache[str, UserInfo | None] = TTLCache(cache_ttl)

    async def authenticate(self, request: web.Request) -> UserInfo:
        user = _certificate_user(request)
        if user is not None:
            return user
        token = bearer_token(request.headers.get("Authorization", ""))
        if token is None:
            return ANONYMOUS
        return await self._review_token(token)

    async def _review_token(self, token: str) -> UserInfo:
        key = hashlib.sha256(token.encode()).hexdigest()  # the cache holds no usable tokens
        user = self._cache.get(key, _MISSING)
        if user is _MISSING:
            user = await self._token_review(token)
            self._cache.put(key, user)  # rejections too, so a bad token cannot hammer the apiserver
        if user is None:
            raise Unauthenticated("token not accepted")
        return user

    async def _token_review(self, token: str) -> UserInfo | None:
        if self.client is None:
            return None
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        try:
            review = await self.client.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body)
        except (ApiError, TransportError) as err:
            log.error(err, "Unable to authenticate the request (TokenReview failed)")
            raise Unauthenticated(str(err)) from None
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        return _authenticated(
            UserInfo(
                name=user.get("username", ""),
                uid=user.get("uid", ""),
                groups=tuple(user.get("groups") or ()),
                extra={k: list(v) for k, v in (user.get("extra") or {}).items()},
            )
        )


def bearer_token(header: str) -> str | None:
    parts = header.split(" ")
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]


def _certificate_user(request: web.Request) -> UserInfo | None:
    """The user of a verified client certificate: CN is the name, each O a group."""
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
    cert = ssl_object.getpeercert() if ssl_object is not None else None
    if not cert:
        return None  # no certificate, or no client CA configured (then nothing is verified)
    name, groups = "", []
    for rdn in cert.get("subject", ()):
        for attr, value in rdn:
            if attr == "commonName":
                name = value
            elif attr == "organizationName":
                groups.append(value)
    return _authenticated(UserInfo(name, groups=tuple(groups))) if name else None


# --------------------------------------------------------------------------------------------
# authorization
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


class DelegatingAuthorizer:
    """Privileged groups, then always-allowed paths, then a SubjectAccessReview."""

    def __init__(
        self,
        client: RestClient | None,
        always_allow_paths: Iterable[str],
        always_allow_groups: Iterable[str] = PRIVILEGED_GROUPS,
        cache_ttl: float = REVIEW_CACHE_TTL,
    ) -> None:
        self.client = client
        self.always_allow_paths = tuple(always_allow_paths)
        self.always_allow_groups = frozenset(always_allow_groups)
        self._cache: TTLCache[bytes, Decision] = TTLCache(cache_ttl)

    async def authorize(self, user: UserInfo, verb: str, path: str) -> Decision:
        if self.always_allow_groups.intersection(user.groups):
            return Decision(True)
        if path_allowed(path, self.always_allow_paths):
            return Decision(True)
        if self.client is None:
            return Decision(False, "no authorization configured")
        spec = {
            "user": user.name,
            "uid": user.uid,
            "groups": list(user.groups),
            "extra": user.extra,
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        key = orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)
        decision = self._cache.get(key)
        if decision is None:
            decision = await self._subject_access_review(spec)
            self._cache.put(key, decision)
        return decision

    async def _subject_access_review(self, spec: dict[str, Any]) -> Decision:
        assert self.client is not None
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        review = await self.client.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=body)
        status = review.get("status") or {}
        return Decision(bool(status.get("allowed")) and not status.get("denied"), status.get("reason", ""))


def path_allowed(path: str, patterns: Sequence[str]) -> bool:
    """apiserver's path authorizer: exact match, or prefix match for a pattern ending in `*`."""
    for pattern in patterns:
        if pattern.endswith("*"):
            if path.startswith(pattern[:-1]):
                return True
        elif path == pattern:
            return True
    return False


# --------------------------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------------------------


def self_signed_certificate(bind_address: str) -> tuple[bytes, bytes]:
    """A fresh serving certificate and key (PEM), valid for localhost and the bind address."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"localhost@{int(now.timestamp())}")])
    ips = {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    bind = ipaddress.ip_address(bind_address)
    if not bind.is_unspecified:
        ips.add(bind)
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.DNSName(socket.gethostname())]
    sans += [x509.IPAddress(ip) for ip in sorted(ips, key=str)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + CERT_VALIDITY)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def server_ssl_context(
    cert_file: str | None, key_file: str | None, bind_address: str, client_ca: str | None
) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if cert_file and key_file:
            ctx.load_cert_chain(cert_file, key_file)
        else:
            _load_in_memory_pair(ctx, *self_signed_certificate(bind_address))
        if client_ca:
            ctx.load_verify_locations(cadata=client_ca)
            ctx.verify_mode = ssl.CERT_OPTIONAL  # a certificate is one way to authenticate, not required
    except (OSError, ssl.SSLError, ValueError) as err:
        raise ServingError(f"invalid serving certificate: {err}") from None
    return ctx


def _load_in_memory_pair(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    # The ssl module only loads key pairs from files: a private directory that exists for one call.
    with tempfile.TemporaryDirectory(prefix="pykcm-serving-") as directory:
        cert_path, key_path = os.path.join(directory, "tls.crt"), os.path.join(directory, "tls.key")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        ctx.load_cert_chain(cert_path, key_path)


async def load_client_ca(client: RestClient | None) -> str | None:
    """The cluster's client CA bundle from kube-system/extension-apiserver-authentication, if readable."""
    if client is None:
        return None
    namespace, name = CLIENT_CA_CONFIGMAP
    try:
        configmap = await client.get(CONFIGMAPS, name, namespace=namespace)
    except (ApiError, TransportError) as err:
        log.warning(
            "Client certificates will not be accepted: cannot read the client CA",
            configmap=f"{namespace}/{name}", err=" ".join(str(err).split()),
        )
        return None
    return (configmap.get("data") or {}).get("client-ca-file") or None


# --------------------------------------------------------------------------------------------
# the server
# --------------------------------------------------------------------------------------------


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
            app.router.add_get(f"/{endpoint}/{{check}}", self._single_check)
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
            result = evaluate(
                endpoint, self.health_checks(), request.query.getall("exclude", []), "verbose" in request.query
            )
            return _text(result.status, result.body)

        return handle

    async def _single_check(self, request: web.Request) -> web.Response:
        name = request.match_info["check"]
        check = next((c for c in self.health_checks() if c.name == name), None)
        if check is None:
            return web.Response(status=404, text="404 page not found\n")
        reason = run_check(check)
        if reason is None:
            return _text(200, "ok")
        return _text(500, f"internal server error: {reason}\n")

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
