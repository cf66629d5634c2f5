"""`--use-service-account-credentials`: each controller talks to the API as its own ServiceAccount.

As KCM's SAControllerClientBuilder: the account `kube-system/<client name>` is created if
missing, a token is requested with TokenRequest (1 h) and renewed when 80 % of its lifetime has
passed, so the controller is `system:serviceaccount:kube-system:<client name>` to RBAC and audit.
A token the apiserver refuses (401: the account deleted, the signing key rotated) is replaced at
once, and the account (and its namespace) created again first, as KCM's token source does
before every TokenRequest. Shared informers and discovery keep the manager's own credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from pykcm.client.config import bearer_token_config
from pykcm.client.errors import AlreadyExists, ApiError, NotFound, TransportError
from pykcm.client.resources import NAMESPACES, SERVICEACCOUNTS
from pykcm.client.rest import RestClient
from pykcm.util.apitime import parse_time
from pykcm.util.backoff import Backoff
from pykcm.util.durations import go_duration
from pykcm.util.log import get_logger

NAMESPACE = "kube-system"
TOKEN_LIFETIME = 3600  # seconds
RENEW_AT = 0.8  # renew with 20 % of the lifetime left
# The expiry is the apiserver's time, read against this machine's clock: a clock ahead of the
# apiserver's makes a fresh token look nearly expired. No renewal follows a success sooner than
# this part of the lifetime (6 minutes), rather than one after another without a pause.
MIN_RENEW_AFTER = 0.1
REFUSED_RENEW_AFTER = 5.0  # seconds: a burst of 401s (every request in flight) asks for one new token

log = get_logger("clientbuilder")


@dataclass
class _Token:
    value: str
    expires: float  # monotonic
    received: float = 0.0  # monotonic
    refused: asyncio.Event = field(default_factory=asyncio.Event)  # a request with it got a 401


class ServiceAccountClientBuilder:
    def __init__(self, root: RestClient, namespace: str = NAMESPACE) -> None:
        self.root = root
        self.namespace = namespace
        self._renewers: list[asyncio.Task] = []
        self._skew_said: set[str] = set()

    async def client_for(self, name: str, qps: float, burst: int) -> RestClient:
        await self._ensure_service_account(name)
        token = await self._request_token(name)
        self._renewers.append(asyncio.create_task(self._keep_renewed(name, token), name=f"token {name}"))
        config = bearer_token_config(self.root.config, lambda: f"Bearer {token.value}", token.refused.set)
        log.info("Using service account credentials", controller=name, serviceAccount=f"{self.namespace}/{name}")
        return RestClient(config.with_limits(qps, burst), name)

    async def close(self) -> None:
        for task in self._renewers:
            task.cancel()
        await asyncio.gather(*self._renewers, return_exceptions=True)

    async def _ensure_service_account(self, name: str) -> None:
        try:
            await self.root.get(SERVICEACCOUNTS, name, self.namespace)
            return
        except NotFound:
            pass
        if await self._namespace_missing():  # as KCM: created too, tolerating a manager that may not create it
            try:
                await self.root.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": self.namespace}})
            except AlreadyExists:
                pass
            except ApiError as err:
                log.warning("create non-exist namespace failed", namespace=self.namespace, err=str(err))
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        with contextlib.suppress(AlreadyExists):
            await self.root.create(SERVICEACCOUNTS, body, self.namespace)

    async def _namespace_missing(self) -> bool:
        """Only a NotFound says so: any other answer (a 403, say) leaves the namespace alone, as KCM."""
        try:
            await self.root.get(NAMESPACES, self.namespace)
        except NotFound:
            return True
        except (ApiError, TransportError) as err:
            log.v(2).info("Cannot tell whether the namespace exists", namespace=self.namespace, err=str(err))
        return False

    async def _request_token(self, name: str) -> _Token:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": TOKEN_LIFETIME},
        }
        path = SERVICEACCOUNTS.path(self.namespace, name, "token")
        response = await self.root.request("POST", path, body=body)
        status = response.get("status") or {}
        stamp, value = status.get("expirationTimestamp"), status.get("token")
        expires_at = parse_time(stamp)
        if expires_at is None or not isinstance(value, str) or not value:
            # An answer that cannot be used (no renewal could be scheduled): fail the request, as one
            # that did not decode, which the start and the renewal both report in one line.
            raise TransportError(f"TokenRequest answer without a token and a valid expirationTimestamp: {stamp!r}")
        lifetime = expires_at - time.time()
        now = time.monotonic()
        return _Token(value, now + lifetime, now)

    async def _keep_renewed(self, name: str, token: _Token) -> None:
        account = f"{self.namespace}/{name}"
        backoff = Backoff(1.0, 60.0)
        wait = self._renew_in(name, token)
        while True:
            if await _refused_within(token, wait):
                log.info("Service account token refused, requesting a new one", serviceAccount=account)
                await asyncio.sleep(max(0.0, token.received + REFUSED_RENEW_AFTER - time.monotonic()))
            while True:
                token.refused.clear()  # 401s to requests sent with the token being replaced
                try:
                    await self._ensure_service_account(name)
                    fresh = await self._request_token(name)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    # Whatever went wrong, stopping here would let the token expire within the hour and
                    # the controller fail every call: say it in one line and keep trying, backing off.
                    reason = err if isinstance(err, (ApiError, TransportError)) else f"{type(err).__name__}: {err}"
                    log.error(reason, "Failed to renew service account token", serviceAccount=account)
                    await asyncio.sleep(backoff.next())
            backoff.reset()
            token.value, token.expires, token.received = fresh.value, fresh.expires, fresh.received
            token.refused.clear()
            log.v(2).info("Renewed service account token", serviceAccount=account)
            wait = self._renew_in(name, token)

    def _renew_in(self, name: str, token: _Token) -> float:
        """Seconds until a token just received is renewed: at RENEW_AT of its lifetime, not sooner than
        MIN_RENEW_AFTER of it (said once, as a clock ahead of the apiserver's is the likely cause)."""
        wait = token.expires - time.monotonic() - (1 - RENEW_AT) * TOKEN_LIFETIME
        floor = MIN_RENEW_AFTER * TOKEN_LIFETIME
        if wait < floor and name not in self._skew_said:
            self._skew_said.add(name)
            log.warning("A new service account token looks nearly expired: is this machine's clock ahead of "
                        "the apiserver's?", serviceAccount=f"{self.namespace}/{name}", renewIn=go_duration(floor))
        return max(wait, floor)


async def _refused_within(token: _Token, seconds: float) -> bool:
    """Wait `seconds`, or less if a request is refused the token meanwhile; say which."""
    try:
        # Not wait_for: on Python 3.11 it can swallow a cancellation (at shutdown) that arrives as the
        # wait ends, and this renewer would then run on.
        async with asyncio.timeout(seconds):
            await token.refused.wait()
    except TimeoutError:
        return False
    return True
