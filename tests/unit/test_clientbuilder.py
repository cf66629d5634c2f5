"""Service-account credentials: tokens are renewed before they expire, and failures back off."""

import asyncio
import datetime
import time

import pytest

from pykcm.app import clientbuilder
from pykcm.client.config import ClientConfig
from pykcm.client.errors import Forbidden, NotFound, ServiceUnavailable, TransportError
from pykcm.client.rest import RestClient


class FakeRoot(RestClient):
    """Answers TokenRequest with tokens that live `lifetime` seconds; optionally fails once first."""

    def __init__(self, lifetime: float, fail_first: bool = False) -> None:
        super().__init__(ClientConfig(host="https://127.0.0.1:1", ssl_context=None))
        self.lifetime = lifetime
        self.fail_first = fail_first
        self.issued = 0
        self.accounts = {"replicaset-controller"}
        self.calls: list[tuple[str, str]] = []

    async def request(self, method, path, **kw):
        self.calls.append((method, path))
        if method == "GET" and "/serviceaccounts/" in path:  # the builder checks its account first
            if path.rsplit("/", 1)[1] not in self.accounts:
                raise NotFound(404, "NotFound", "serviceaccounts not found")
            return {}
        if method == "GET" and path == "/api/v1/namespaces/kube-system":
            return {}
        if method == "POST" and path.endswith("/serviceaccounts"):
            self.accounts.add(kw["body"]["metadata"]["name"])
            return kw["body"]
        assert method == "POST" and path.endswith("/serviceaccounts/replicaset-controller/token")
        assert kw["body"]["spec"]["expirationSeconds"] == clientbuilder.TOKEN_LIFETIME
        if self.fail_first:
            self.fail_first = False
            raise ServiceUnavailable(503, "ServiceUnavailable", "try later")
        self.issued += 1
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=self.lifetime)
        return {"status": {"token": f"t{self.issued}", "expirationTimestamp": expires.isoformat()}}


async def renew_for(root: FakeRoot, seconds: float) -> clientbuilder._Token:
    builder = clientbuilder.ServiceAccountClientBuilder(root)
    token = await builder._request_token("replicaset-controller")
    task = asyncio.create_task(builder._keep_renewed("replicaset-controller", token))
    await asyncio.sleep(seconds)
    task.cancel()
    return token


async def test_token_is_renewed_before_it_expires(monkeypatch):
    monkeypatch.setattr(clientbuilder, "TOKEN_LIFETIME", 1)  # so "80 % of the lifetime" comes quickly
    root = FakeRoot(lifetime=1.0)
    token = await renew_for(root, 1.5)
    assert root.issued >= 2  # renewed at ~0.8 s, before the 1 s expiry
    assert token.value == f"t{root.issued}" and token.expires > time.monotonic()


async def test_failed_renewal_is_retried(monkeypatch):
    monkeypatch.setattr(clientbuilder, "TOKEN_LIFETIME", 1)
    root = FakeRoot(lifetime=1.0)
    builder = clientbuilder.ServiceAccountClientBuilder(root)
    token = await builder._request_token("replicaset-controller")
    root.fail_first = True
    task = asyncio.create_task(builder._keep_renewed("replicaset-controller", token))
    await asyncio.sleep(3.5)  # fails at ~0.8 s, backs off 1-2 s, then succeeds
    task.cancel()
    assert token.value != "t1"


class MalformedOnce(FakeRoot):
    """The first renewal gets an answer pykcm cannot use (no status): an unexpected exception."""

    def __init__(self, lifetime: float) -> None:
        super().__init__(lifetime)
        self.malformed = False

    async def request(self, method, path, **kw):
        if self.issued == 1 and not self.malformed and path.endswith("/token"):
            self.malformed = True
            return {"kind": "TokenRequest"}
        return await super().request(method, path, **kw)


async def test_unexpected_renewal_failure_is_logged_and_renewal_goes_on(monkeypatch, caplog):
    monkeypatch.setattr(clientbuilder, "TOKEN_LIFETIME", 1)
    root = MalformedOnce(lifetime=1.0)
    builder = clientbuilder.ServiceAccountClientBuilder(root)
    token = await builder._request_token("replicaset-controller")
    task = asyncio.create_task(builder._keep_renewed("replicaset-controller", token))
    await asyncio.sleep(3.5)  # the malformed answer at ~0.8 s, back off 1-2 s, then a good token
    assert not task.done(), task
    task.cancel()
    assert root.malformed and root.issued >= 2 and token.value == f"t{root.issued}"
    failures = [r for r in caplog.records if "Failed to renew service account token" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is None  # one line, no traceback


async def test_a_clock_ahead_of_the_apiservers_does_not_make_renewals_spin(monkeypatch, caplog):
    # Tokens that look nearly expired on arrival (this clock ahead of the apiserver's): renewed no
    # sooner than a tenth of the lifetime after the last, said once; before, one after another.
    monkeypatch.setattr(clientbuilder, "TOKEN_LIFETIME", 1)
    root = FakeRoot(lifetime=0.1)
    await renew_for(root, 0.55)
    assert 3 <= root.issued <= 7
    warnings = [r for r in caplog.records if "clock ahead" in r.getMessage()]
    assert len(warnings) == 1


async def test_a_refused_token_is_replaced_at_once_and_a_deleted_account_created_again(monkeypatch):
    # KCM's token source is reset by a 401 and gets (or creates) the account before every TokenRequest:
    # a deleted account, or a rotated signing key, no longer leaves the controller Unauthorized for good.
    monkeypatch.setattr(clientbuilder, "REFUSED_RENEW_AFTER", 0.05)
    root = FakeRoot(lifetime=3600)
    builder = clientbuilder.ServiceAccountClientBuilder(root)
    client = await builder.client_for("replicaset-controller", 5, 10)
    root.accounts.clear()  # the account is deleted: its tokens are refused
    client.config.on_unauthorized()  # what a 401 to one of the controller's requests does
    for _ in range(100):
        if root.issued == 2:
            break
        await asyncio.sleep(0.01)
    await builder.close()
    assert root.issued == 2 and "replicaset-controller" in root.accounts
    assert client.config.token_source() == "Bearer t2"
    assert ("POST", "/api/v1/namespaces/kube-system/serviceaccounts") in root.calls


async def test_a_namespace_that_cannot_be_read_is_left_alone_and_the_account_still_created() -> None:
    class NoNamespaceReads(FakeRoot):
        async def request(self, method, path, **kw):
            if method == "GET" and path == "/api/v1/namespaces/kube-system":
                self.calls.append((method, path))
                raise Forbidden(403, "Forbidden", "namespaces is forbidden")
            return await super().request(method, path, **kw)

    root = NoNamespaceReads(lifetime=3600)
    root.accounts.clear()
    await clientbuilder.ServiceAccountClientBuilder(root)._ensure_service_account("replicaset-controller")
    assert ("POST", "/api/v1/namespaces") not in root.calls  # KCM creates it only on a NotFound
    assert "replicaset-controller" in root.accounts


async def test_a_token_lives_until_its_expiration_timestamp() -> None:
    builder = clientbuilder.ServiceAccountClientBuilder(FakeRoot(lifetime=3600))
    token = await builder._request_token("replicaset-controller")
    assert abs(token.expires - token.received - 3600) < 5


async def test_a_token_without_a_readable_expiry_is_a_failed_request() -> None:
    class BadExpiry(FakeRoot):
        async def request(self, method, path, **kw):
            answer = await super().request(method, path, **kw)
            if path.endswith("/token"):
                answer["status"]["expirationTimestamp"] = "soon"
            return answer

    builder = clientbuilder.ServiceAccountClientBuilder(BadExpiry(lifetime=3600))
    with pytest.raises(TransportError, match="answer without a token and a valid expirationTimestamp: 'soon'"):
        await builder._request_token("replicaset-controller")
