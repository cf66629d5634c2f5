"""Unit tests for pykcm.serving.healthz and the request-independent parts of pykcm.serving.server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pykcm.controller.progress import NO_PROGRESS_AFTER, STUCK_SYNC_AFTER, stuck_reason
from pykcm.serving.authn import DelegatingAuthenticator, UserInfo, bearer_token
from pykcm.serving.authz import DelegatingAuthorizer, path_allowed
from pykcm.serving.healthz import HealthCheck, checks_for, controller_checks, evaluate
from pykcm.serving.messages import Headers, Query, Request
from pykcm.util.ttlcache import TTLCache

OK = HealthCheck("leaderElection", lambda: None)
BROKEN = HealthCheck("replicaset-controller", lambda: "stuck for 700s")


def raising() -> str | None:
    raise RuntimeError("boom")


def test_plain_ok_when_healthy() -> None:
    result = evaluate("healthz", [OK], [], verbose=False)
    assert (result.status, result.body) == (200, "ok")


def test_verbose_lists_every_check_in_order() -> None:
    checks = [OK, HealthCheck("serviceaccount-controller", lambda: None)]
    result = evaluate("healthz", checks, [], verbose=True)
    assert result.status == 200
    assert result.body == "[+]leaderElection ok\n[+]serviceaccount-controller ok\nhealthz check passed\n"


def test_failure_is_500_verbose_and_withholds_the_reason() -> None:
    result = evaluate("readyz", [OK, BROKEN], [], verbose=False)
    assert result.status == 500
    assert result.body == (
        "[+]leaderElection ok\n[-]replicaset-controller failed: reason withheld\nreadyz check failed\n"
    )
    assert "700s" not in result.body


def test_a_raising_check_fails_instead_of_breaking_the_endpoint() -> None:
    result = evaluate("livez", [HealthCheck("x", raising)], [], verbose=True)
    assert result.status == 500 and "[-]x failed: reason withheld" in result.body


def test_exclude_skips_a_check_and_warns_about_unknown_names() -> None:
    result = evaluate("healthz", [OK, BROKEN], ["replicaset-controller", "nope"], verbose=True)
    assert result.status == 200
    assert result.body == (
        "[+]leaderElection ok\n[+]replicaset-controller excluded: ok\n"
        'warn: some health checks cannot be excluded: no matches for "nope"\nhealthz check passed\n'
    )


def test_no_checks_means_ping() -> None:
    assert evaluate("healthz", [], [], verbose=True).body == "[+]ping ok\nhealthz check passed\n"


@pytest.mark.parametrize(
    ("starts", "queued", "idle", "stuck"),
    [
        ([], 0, 10 * NO_PROGRESS_AFTER, False),  # idle and nothing to do
        ([], 3, NO_PROGRESS_AFTER - 1, False),  # a backlog, but workers finished something recently
        ([], 3, NO_PROGRESS_AFTER + 1, True),  # a backlog and nothing finishes
        ([STUCK_SYNC_AFTER - 1], 0, 0, False),  # a long sync
        ([STUCK_SYNC_AFTER + 1], 0, 0, True),  # a wedged sync
    ],
)
def test_stuck_reason(starts: list[float], queued: int, idle: float, stuck: bool) -> None:
    now = 10_000.0
    reason = stuck_reason(now, [now - age for age in starts], queued, last_progress=now - idle)
    assert (reason is not None) is stuck


def endpoint_status(checks: list[HealthCheck], endpoint: str) -> int:
    return evaluate(endpoint, checks_for(endpoint, checks), [], verbose=True).status


def test_a_stuck_controller_is_unready_but_neither_unhealthy_nor_dead() -> None:
    """KCM's /healthz is leader election plus a ping per controller, so a slow or throttled
    controller never makes a liveness probe restart it: being stuck only fails /readyz."""
    checks = controller_checks("replicaset-controller", cannot_start=lambda: None, stuck=lambda: "a sync ran 700s")
    assert endpoint_status(checks, "livez") == 200
    assert endpoint_status(checks, "healthz") == 200
    assert endpoint_status(checks, "readyz") == 500


def test_a_controller_that_cannot_start_fails_healthz_and_readyz_but_not_livez() -> None:
    checks = controller_checks(
        "serviceaccount-controller", cannot_start=lambda: "serviceaccounts: forbidden", stuck=lambda: None
    )
    assert endpoint_status(checks, "livez") == 200
    assert endpoint_status(checks, "healthz") == 500
    assert endpoint_status(checks, "readyz") == 500


def test_every_endpoint_lists_each_controller_once() -> None:
    checks = [HealthCheck("leaderElection", lambda: None),
              *controller_checks("replicaset-controller", lambda: None, lambda: None)]
    for endpoint in ("livez", "healthz", "readyz"):
        body = evaluate(endpoint, checks_for(endpoint, checks), [], verbose=True).body
        assert body == f"[+]leaderElection ok\n[+]replicaset-controller ok\n{endpoint} check passed\n"


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/healthz", True),
        ("/healthz/leaderElection", False),
        ("/metrics", False),
        ("/debug/x", True),
        ("/livez", False),
    ],
)
def test_always_allowed_paths_match_exactly_or_by_star_prefix(path: str, allowed: bool) -> None:
    assert path_allowed(path, ["/healthz", "/readyz", "/debug/*"]) is allowed


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer abc", "abc"), ("bearer abc", "abc"), ("Bearer ", None), ("Basic abc", None), ("", None)],
)
def testbearer_token_parsing(header: str, token: str | None) -> None:
    assert bearer_token(header) == token


def test_ttl_cache_expires_and_stays_bounded() -> None:
    now = [0.0]
    cache: TTLCache[str, int] = TTLCache(10.0, size=2, clock=lambda: now[0])
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)  # evicts the oldest
    assert cache.get("a") is None and cache.get("b") == 2
    now[0] = 10.0
    assert cache.get("b") is None and cache.get("c", "missing") == "missing"


def test_ttl_cache_drops_expired_entries_as_new_ones_come() -> None:
    """Not only when read again: an answer for a key never asked for again would stay until 4096
    newer ones pushed it out."""
    now = [0.0]
    cache: TTLCache[str, int] = TTLCache(10.0, clock=lambda: now[0])
    cache.put("a", 1)
    now[0] = 5.0
    cache.put("b", 2)
    now[0] = 12.0
    cache.put("c", 3)
    assert list(cache._entries) == ["b", "c"]


async def test_a_long_path_is_not_kept_in_the_review_cache() -> None:
    apiserver = SlowApiserver()
    authz = DelegatingAuthorizer(apiserver, ["/healthz"])  # type: ignore[arg-type]
    user = UserInfo("system:anonymous", groups=("system:unauthenticated",))
    assert (await authz.authorize(user, "get", "/" + "x" * (1 << 20))).allowed
    assert [len(key) for key in authz._cache._entries] == [32]  # a digest of the review, not the review


async def test_callers_of_a_key_being_loaded_share_the_load_and_its_failure() -> None:
    cache: TTLCache[str, int] = TTLCache(10.0)
    loads = 0

    async def load() -> int:
        nonlocal loads
        loads += 1
        await asyncio.sleep(0.05)
        if loads == 1:
            raise RuntimeError("apiserver unreachable")
        return 7

    failed = await asyncio.gather(*(cache.get_or_load("k", load) for _ in range(10)), return_exceptions=True)
    assert loads == 1 and all(isinstance(result, RuntimeError) for result in failed)  # shared, not cached
    leaving = asyncio.ensure_future(cache.get_or_load("k", load))
    staying = asyncio.ensure_future(cache.get_or_load("k", load))
    await asyncio.sleep(0)
    leaving.cancel()  # one caller leaving does not cancel the load the other waits for
    assert await staying == 7 and loads == 2
    assert await cache.get_or_load("k", load) == 7 and loads == 2  # cached


class SlowApiserver:
    def __init__(self) -> None:
        self.reviews: dict[str, int] = {}

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict:
        self.reviews[path.rsplit("/", 1)[1]] = self.reviews.get(path.rsplit("/", 1)[1], 0) + 1
        await asyncio.sleep(0.05)
        if path.endswith("tokenreviews"):
            return {"status": {"authenticated": True, "user": {"username": "prometheus"}}}
        return {"status": {"allowed": True}}


async def test_concurrent_scrapes_with_one_token_make_one_review_of_each_kind() -> None:
    apiserver = SlowApiserver()
    authn = DelegatingAuthenticator(apiserver)  # type: ignore[arg-type]
    authz = DelegatingAuthorizer(apiserver, ["/healthz"])  # type: ignore[arg-type]

    async def scrape() -> bool:
        headers = Headers({"authorization": "Bearer abc"})
        user = await authn.authenticate(Request("GET", "/metrics", Query(), headers, "HTTP/1.1", None))
        return (await authz.authorize(user, "get", "/metrics")).allowed

    assert all(await asyncio.gather(*(scrape() for _ in range(50))))
    assert apiserver.reviews == {"tokenreviews": 1, "subjectaccessreviews": 1}
