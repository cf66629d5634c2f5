"""Delegated authentication, as controller-manager's BuildHandlerChain does it: a client
certificate signed by the cluster's client CA, else a bearer token checked with a TokenReview,
else anonymous. Answers are cached for 10 s (rejections too), so a scraper costs the apiserver at
most one TokenReview per token every 10 s. Each attempt and each TokenReview is counted as KCM
counts them (pykcm.serving.metrics).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

from pykcm.client.errors import ApiError, TransportError
from pykcm.client.rest import RestClient
from pykcm.serving import metrics
from pykcm.serving.messages import Request
from pykcm.serving.reviews import REVIEW_TIMEOUT, send_review
from pykcm.util.log import get_logger
from pykcm.util.ttlcache import TTLCache

log = get_logger("server")

ANONYMOUS_USER = "system:anonymous"
UNAUTHENTICATED_GROUP = "system:unauthenticated"
AUTHENTICATED_GROUP = "system:authenticated"
CREDENTIAL_ID_KEY = "authentication.kubernetes.io/credential-id"  # k8s.io/apiserver's user.CredentialIDKey
REVIEW_CACHE_TTL = 10.0  # KCM: --authentication-token-webhook-cache-ttl and the authz allow/deny TTLs


class Unauthenticated(Exception):
    """The request carried credentials the apiserver did not accept."""


@dataclass(frozen=True)
class UserInfo:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)


ANONYMOUS = UserInfo(ANONYMOUS_USER, groups=(UNAUTHENTICATED_GROUP,))


def _authenticated(user: UserInfo) -> UserInfo:
    """Every authenticated user is in system:authenticated (apiserver's AuthenticatedGroupAdder)."""
    if AUTHENTICATED_GROUP in user.groups:
        return user
    return UserInfo(user.name, user.uid, (*user.groups, AUTHENTICATED_GROUP), user.extra)


class DelegatingAuthenticator:
    """Client certificate, else bearer token via TokenReview, else anonymous."""

    def __init__(self, client: RestClient | None, cache_ttl: float = REVIEW_CACHE_TTL) -> None:
        self.client = client
        self._cache: TTLCache[str, UserInfo | None] = TTLCache(cache_ttl)

    async def authenticate(self, request: Request) -> UserInfo:
        """The request's user, or Unauthenticated; counted as apiserver's authentication filter counts."""
        start = time.monotonic()
        try:
            user = await self._authenticate(request)
        except Unauthenticated:
            # A rejected token is an error, not a failure: apiserver's bearer token authenticator
            # turns "not authenticated" into "invalid bearer token".
            metrics.record_authentication("error", time.monotonic() - start)
            raise
        metrics.record_authentication("success", time.monotonic() - start, user.name)
        return user

    async def _authenticate(self, request: Request) -> UserInfo:
        user = _certificate_user(request)
        if user is not None:
            return user
        token = bearer_token(request.headers.get("Authorization", ""))
        if token is None:
            return ANONYMOUS
        return await self._review_token(token)

    async def _review_token(self, token: str) -> UserInfo:
        key = hashlib.sha256(token.encode()).hexdigest()  # the cache holds no usable tokens
        # Rejections are cached too, so a bad token cannot hammer the apiserver.
        user = await self._cache.get_or_load(key, lambda: self._token_review(token))
        if user is None:
            raise Unauthenticated("token not accepted")
        return user

    async def _token_review(self, token: str) -> UserInfo | None:
        if self.client is None:
            return None
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        try:
            review = await send_review(self.client, "/apis/authentication.k8s.io/v1/tokenreviews", body,
                                       metrics.record_token_review, total=REVIEW_TIMEOUT)
        except (ApiError, TransportError) as err:
            log.error(err, "Unable to authenticate the request (TokenReview failed)")
            raise Unauthenticated(str(err)) from None
        status = review.get("status") or {}
        if not status.get("authenticated"):
            if status.get("error"):
                # The apiserver's authenticator failed (an expired service account token, a JWKS it
                # could not fetch): an error, which KCM's token cache does not keep, unlike a rejection.
                raise Unauthenticated(str(status["error"]))
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


def _certificate_user(request: Request) -> UserInfo | None:
    """The user of a verified client certificate, as x509.CommonNameUserConversion makes it: CN is the
    name, each O a group, the subject's UID attribute the uid (AllowParsingUserUIDFromCertAuth, on in
    KCM), and the certificate's SHA-256 its credential ID; Unauthenticated for a bad UID."""
    ssl_object = request.ssl_object
    cert = ssl_object.getpeercert() if ssl_object is not None else None
    if not cert:
        return None  # no certificate, or no client CA configured (then nothing is verified)
    name, groups, uids = "", [], []
    for rdn in cert.get("subject", ()):
        for attr, value in rdn:
            if attr == "commonName":
                name = value
            elif attr == "organizationName":
                groups.append(value)
            elif attr == "userId":  # OID 0.9.2342.19200300.100.1.1
                uids.append(value)
    if not name:
        return None
    if len(uids) > 1:
        raise Unauthenticated(f"expected 1 UID, but found multiple: [{' '.join(uids)}]")
    if uids and not uids[0]:
        raise Unauthenticated("UID cannot be an empty string")
    fingerprint = hashlib.sha256(ssl_object.getpeercert(binary_form=True)).hexdigest()
    extra = {CREDENTIAL_ID_KEY: [f"X509SHA256={fingerprint}"]}
    return _authenticated(UserInfo(name, uids[0] if uids else "", tuple(groups), extra))
