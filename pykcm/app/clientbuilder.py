"""`--use-service-account-credentials`: each controller talks to the API as its own ServiceAccount.

As KCM's SAControllerClientBuilder: the account `kube-system/<client name>` is created if
missing, a token is requested with TokenRequest (1 h) and renewed when 80 % of its lifetime has
passed, so the controller is `system:serviceaccount:kube-system:<client name>` to RBAC and audit.
Shared informers and discovery keep the manager's own credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from dataclasses import dataclass

from pykcm.client.config import bearer_token_config
from pykcm.client.errors import AlreadyExists, ApiError, NotFound, TransportError
from pykcm.client.resources import SERVICEACCOUNTS
from pykcm.client.rest import RestClient
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

log = get_logger("clientbuilder")


@dataclass
class _Token:
    value: str
    expires: float  # monotonic


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
        config = bearer_token_config(self.root.config, lambda: f"Bearer {token.value}")
        log.info("Using service account credentials", controller=name, serviceAccount=f"{self.namespace}/{name}")
        return RestClient(config.with_limits(qps, burst), name)

    async def close(self) -> None:
        for task in self._renewers:
            task.cancel()
        await asyncio.gather(*self._renewers, return_exceptions=True)

    async def _ensure_service_account(self, name: str) -> None:
        try:
            await self.root.get(SERVICEACCOUNTS, name, self.namespace)
        except NotFound:
            body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
            with contextlib.suppress(AlreadyExists):
                await self.root.create(SERVICEACCOUNTS, body, self.namespace)

    async def _request_token(self, name: str) -> _Token:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": TOKEN_LIFETIME},
        }
        path = SERVICEACCOUNTS.path(self.namespace, name, "token")
        response = await self.root.request("POST", path, body=body)
        status = response["status"]
        expires_at = datetime.datetime.fromisoformat(status["expirationTimestamp"].replace("Z", "+00:00"))
        lifetime = (expires_at - datetime.datetime.now(datetime.UTC)).total_seconds()
        return _Token(status["token"], time.monotonic() + lifetime)

    async def _keep_renewed(self, name: str, token: _Token) -> None:
        backoff = Backoff(1.0, 60.0)
        wait = self._renew_in(name, token)
        while True:
            await asyncio.sleep(wait)
            try:
                fresh = await self._request_token(name)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                # Whatever went wrong, stopping here would let the token expire within the hour and
                # the controller fail every call: say it in one line and keep trying.
                reason = err if isinstance(err, (ApiError, TransportError)) else f"{type(err).__name__}: {err}"
                log.error(reason, "Failed to renew service account token", serviceAccount=f"{self.namespace}/{name}")
                wait = backoff.next()
                continue
            backoff.reset()
            token.value, token.expires = fresh.value, fresh.expires
            log.v(2).info("Renewed service account token", serviceAccount=f"{self.namespace}/{name}")
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
