"""What /metrics and /metrics/slis say about themselves and about the secure port: component-base's
stability level at the head of each HELP KCM also has, and k8s.io/apiserver's delegated
authentication and authorization metrics, checked through pykcm's handler chain with a fake
apiserver answering the TokenReviews and SubjectAccessReviews."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pykcm.client.errors import ApiError, InternalError, TooManyRequests, TransportError
from pykcm.serving import reviews
from pykcm.serving.authn import DelegatingAuthenticator, UserInfo
from pykcm.serving.authz import DelegatingAuthorizer
from pykcm.serving.healthz import HealthCheck
from pykcm.serving.server import SecureServer
from tests.support import free_port
from tests.unit.test_serving_http import exchange, get

# Each family's StabilityLevel in its Go definition (component-base@v0.36.3/metrics/prometheus/...,
# client-go's FIFO metrics there, kubernetes@v1.36.3/pkg/controller/replicaset/metrics,
# apiserver@v0.36.3's authenticatorfactory, authorizerfactory and endpoints/filters).
KCM_LEVELS = {
    **dict.fromkeys(
        ["workqueue_adds_total", "workqueue_depth", "workqueue_queue_duration_seconds", "workqueue_retries_total",
         "workqueue_work_duration_seconds", "workqueue_unfinished_work_seconds",
         "workqueue_longest_running_processor_seconds", "running_managed_controllers", "kubernetes_feature_enabled"],
        "BETA"),
    **dict.fromkeys(
        ["rest_client_requests_total", "rest_client_request_retries_total", "rest_client_request_duration_seconds",
         "rest_client_rate_limiter_duration_seconds", "rest_client_request_size_bytes",
         "rest_client_response_size_bytes", "informer_queued_items", "informer_processing_latency_seconds",
         "informer_store_resource_version", "leader_election_master_status", "leader_election_slowpath_total",
         "replicaset_controller_sorting_deletion_age_ratio", "replicaset_controller_stale_sync_skips_total",
         "apiserver_delegated_authn_request_total", "apiserver_delegated_authn_request_duration_seconds",
         "apiserver_delegated_authz_request_total", "apiserver_delegated_authz_request_duration_seconds",
         "authentication_attempts", "authentication_duration_seconds", "authenticated_user_requests",
         "authorization_attempts_total", "authorization_duration_seconds"],
        "ALPHA"),
}
PYKCM_ONLY = ("pykcm_", "process_", "python_")  # no level: KCM has none of them, or (process_*) Go's collector's


def help_lines(text: str) -> dict[str, str]:
    return {name: help_text for line in text.splitlines() if line.startswith("# HELP ")
            for name, _, help_text in [line[len("# HELP "):].partition(" ")]}


async def scrape(port: int, path: str, *headers: str) -> tuple[str, str]:
    status, _, body, _ = await exchange(port, get(path, *headers, "Connection: close"))
    return status, body.decode()


@pytest.fixture
async def open_port() -> AsyncIterator[int]:
    """pykcm's handler chain with every path allowed, with every metric family registered."""
    import pykcm.app.manager  # noqa: F401 - every layer, as pykcm run imports them
    from pykcm.controller import discover_controllers

    discover_controllers()
    server = SecureServer("127.0.0.1", free_port(), None,  # type: ignore[arg-type]
                          lambda: [HealthCheck("ping", lambda: None)], DelegatingAuthenticator(None),
                          DelegatingAuthorizer(None, ["/*"]))
    await server.start()
    yield server.port
    await server.stop()


async def test_every_help_kcm_also_has_carries_its_stability_level_as_kcm_prints_it(open_port: int) -> None:
    status, text = await scrape(open_port, "/metrics")
    assert status == "HTTP/1.1 200 OK"
    helps = help_lines(text)
    assert helps["workqueue_adds_total"] == "[BETA] Total number of adds handled by workqueue"
    assert helps["rest_client_requests_total"] == (
        "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host.")
    for name, help_text in helps.items():
        if name.startswith(PYKCM_ONLY):
            assert not help_text.startswith("["), name
        else:
            assert name in KCM_LEVELS, f"{name}: which level has it in KCM, or is it pykcm's own?"
            assert help_text.startswith(f"[{KCM_LEVELS[name]}] "), name
    assert set(KCM_LEVELS) <= set(helps)  # every family KCM has is registered, if not yet set

    _, slis = await scrape(open_port, "/metrics/slis")
    assert help_lines(slis) == {
        "kubernetes_healthcheck": "[STABLE] This metric records the result of a single healthcheck.",
        "kubernetes_healthchecks_total": "[STABLE] This metric records the results of all healthcheck.",
        "process_start_time_seconds": "[ALPHA] Start time of the process since unix epoch in seconds.",
    }


class FakeApiserver:
    """TokenReview: `good` is user `prometheus`, `bad` is not authenticated (as the apiserver answers
    a token it does not know), `broken` fails with a 500 and `down` with no answer. SubjectAccessReview:
    /metrics is allowed to `prometheus`, /denied denied, anything else gets no opinion (RBAC's answer)."""

    def __init__(self) -> None:
        self.reviews = 0

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict:
        self.reviews += 1
        spec = body["spec"]
        if path.endswith("/tokenreviews"):
            if spec["token"] == "broken":
                raise InternalError(500, "InternalError", "etcd is down")
            if spec["token"] == "down":
                raise TransportError("POST /apis/authentication.k8s.io/v1/tokenreviews: connection refused")
            if spec["token"] != "good":
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            return {"status": {"authenticated": True, "user": {"username": "prometheus", "groups": ["monitoring"]}}}
        path, user = spec["nonResourceAttributes"]["path"], spec["user"]
        return {"status": {"allowed": path == "/metrics" and user == "prometheus", "denied": path == "/denied"}}


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_delegated_reviews_and_the_filters_results_are_counted_as_kcms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reviews, "FIRST_WAIT", 0.0)  # `broken` is tried five times
    apiserver = FakeApiserver()
    server = SecureServer("127.0.0.1", free_port(), None, lambda: [],  # type: ignore[arg-type]
                          DelegatingAuthenticator(apiserver), DelegatingAuthorizer(apiserver, ["/healthz"]))  # type: ignore[arg-type]
    counted = {
        "authn 201": ("apiserver_delegated_authn_request_total", {"code": "201"}),
        "authn 201 observed": ("apiserver_delegated_authn_request_duration_seconds_count", {"code": "201"}),
        "authn 500": ("apiserver_delegated_authn_request_total", {"code": "500"}),
        "authn <error>": ("apiserver_delegated_authn_request_total", {"code": "<error>"}),
        "authz 201": ("apiserver_delegated_authz_request_total", {"code": "201"}),
        "authz 201 observed": ("apiserver_delegated_authz_request_duration_seconds_count", {"code": "201"}),
        "success": ("authentication_attempts", {"result": "success"}),
        "success observed": ("authentication_duration_seconds_count", {"result": "success"}),
        "error": ("authentication_attempts", {"result": "error"}),
        "other": ("authenticated_user_requests", {"username": "other"}),
        "allowed": ("authorization_attempts_total", {"result": "allowed"}),
        "allowed observed": ("authorization_duration_seconds_count", {"result": "allowed"}),
        "denied": ("authorization_attempts_total", {"result": "denied"}),
        "no-opinion": ("authorization_attempts_total", {"result": "no-opinion"}),
    }
    before = {key: value(name, **labels) for key, (name, labels) in counted.items()}
    await server.start()
    try:
        async def status_of(path: str, token: str = "") -> str:
            return (await scrape(server.port, path, *([f"Authorization: Bearer {token}"] if token else [])))[0]

        assert await status_of("/metrics", "good") == "HTTP/1.1 200 OK"
        assert await status_of("/metrics", "good") == "HTTP/1.1 200 OK"  # both reviews cached: counted once
        assert await status_of("/metrics", "bad") == "HTTP/1.1 401 Unauthorized"
        assert await status_of("/forbidden", "good") == "HTTP/1.1 403 Forbidden"
        assert await status_of("/denied", "good") == "HTTP/1.1 403 Forbidden"
        assert await status_of("/metrics", "broken") == "HTTP/1.1 401 Unauthorized"
        assert await status_of("/metrics", "down") == "HTTP/1.1 401 Unauthorized"
        assert await status_of("/healthz") == "HTTP/1.1 200 OK"  # anonymous, always allowed: no review
        assert await status_of("/metrics") == "HTTP/1.1 403 Forbidden"  # anonymous: a review, no opinion
        status, text = await scrape(server.port, "/metrics", "Authorization: Bearer good")  # cached: no review
        assert status == "HTTP/1.1 200 OK"
    finally:
        await server.stop()
    delta = {key: value(name, **labels) - before[key] for key, (name, labels) in counted.items()}
    assert delta == {
        "authn 201": 2, "authn 201 observed": 2, "authn 500": 5, "authn <error>": 1,  # good, bad; broken 5 tries; down
        "authz 201": 4, "authz 201 observed": 4,  # good on /metrics, /forbidden, /denied; anonymous on /metrics
        "success": 7, "success observed": 7, "error": 3,  # the bad, broken and down tokens
        "other": 7,  # prometheus and system:anonymous, as apiserver's compressUsername names them
        "allowed": 4, "allowed observed": 4, "denied": 1, "no-opinion": 2,
    }
    assert apiserver.reviews == 12
    bounds = [line.split('le="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("apiserver_delegated_authz_request_duration_seconds_bucket{") and 'code="201"' in line]
    assert bounds == ["0.25", "0.5", "0.7", "1", "1.5", "3", "5", "10", "+Inf"]


async def test_a_subject_access_review_that_fails_is_an_error_with_its_code() -> None:
    class Failing:
        async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict:
            await asyncio.sleep(0)
            raise InternalError(503, "ServiceUnavailable", "apiserver is shutting down")

    server = SecureServer("127.0.0.1", free_port(), None, lambda: [], DelegatingAuthenticator(None),  # type: ignore[arg-type]
                          DelegatingAuthorizer(Failing(), []))  # type: ignore[arg-type]
    before = (value("apiserver_delegated_authz_request_total", code="503"),
              value("authorization_attempts_total", result="error"))
    await server.start()
    try:
        assert (await scrape(server.port, "/metrics"))[0] == "HTTP/1.1 500 Internal Server Error"
    finally:
        await server.stop()
    assert (value("apiserver_delegated_authz_request_total", code="503"),
            value("authorization_attempts_total", result="error")) == (before[0] + 1, before[1] + 1)


async def test_the_auth_families_are_spelled_and_bucketed_as_apiservers(open_port: int) -> None:
    await scrape(open_port, "/healthz")  # anonymous, always allowed: one success, one allowed
    _, text = await scrape(open_port, "/metrics")
    lines = text.splitlines()
    # Go names these two counters without _total, and its client prints them as named.
    assert "# TYPE authentication_attempts counter" in lines
    assert "# TYPE authenticated_user_requests counter" in lines
    assert any(line.startswith('authentication_attempts{result="success"} ') for line in lines)
    assert "# HELP authorization_attempts_total [ALPHA] Counter of authorization attempts broken down by result. " \
           "It can be either 'allowed', 'denied', 'no-opinion' or 'error'." in lines
    bounds = [line.split('le="')[1].split('"')[0] for line in lines
              if line.startswith("authentication_duration_seconds_bucket{") and 'result="success"' in line]
    assert bounds == ["0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256", "0.512",
                      "1.024", "2.048", "4.096", "8.192", "16.384", "+Inf"]  # ExponentialBuckets(0.001, 2, 15)
    assert "# HELP apiserver_delegated_authn_request_duration_seconds [ALPHA] Request latency in seconds. " \
           "Broken down by status code." in lines


class Flaky:
    """Answers each review with the next of `answers` (an exception is raised), then allows."""

    def __init__(self, *answers: Exception) -> None:
        self.answers = list(answers)
        self.tries = 0

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict:
        self.tries += 1
        if self.answers:
            raise self.answers.pop(0)
        return {"status": {"allowed": True}}


RESET = TransportError("POST /apis/authorization.k8s.io/v1/subjectaccessreviews: connection reset by peer", True)
REFUSED = TransportError("POST /apis/authorization.k8s.io/v1/subjectaccessreviews: connection refused")
THROTTLED = TooManyRequests(429, "TooManyRequests", "too many requests")
RETRY_LATER = ApiError(503, "ServiceUnavailable", "later", {"details": {"retryAfterSeconds": 1}})
UNAVAILABLE = ApiError(503, "ServiceUnavailable", "shutting down", {})


@pytest.mark.parametrize(("answers", "allowed", "tries"), [
    ((RESET, THROTTLED, RETRY_LATER), True, 4),  # each transient failure tried again
    ((InternalError(500, "InternalError", "etcd"),) * 5, False, 5),  # five tries in all
    ((REFUSED,), False, 1),  # DefaultShouldRetry: not a refused connection
    ((UNAVAILABLE,), False, 1),  # nor a 503 that does not ask to be tried again
])
async def test_a_review_is_tried_again_as_kcms_webhooks_retry(monkeypatch: pytest.MonkeyPatch, answers: tuple,
                                                            allowed: bool, tries: int) -> None:
    waits: list[float] = []

    async def no_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(reviews.asyncio, "sleep", no_sleep)
    apiserver = Flaky(*answers)
    authorizer = DelegatingAuthorizer(apiserver, [])  # type: ignore[arg-type]
    if allowed:
        assert (await authorizer.authorize(UserInfo("prometheus"), "get", "/metrics")).allowed
    else:
        with pytest.raises((ApiError, TransportError)):
            await authorizer.authorize(UserInfo("prometheus"), "get", "/metrics")
    assert apiserver.tries == tries
    # DefaultAuthWebhookRetryBackoff: 0.5 s, then 1.5 times longer, each up to a fifth more
    for wait, base in zip(waits, (0.5, 0.75, 1.125, 1.6875), strict=False):
        assert base <= wait <= base * 1.2
