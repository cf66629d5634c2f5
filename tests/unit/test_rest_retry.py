"""client-go's retries and rate-limiter logs in RestClient (pykcm/client/retry.py), against loopback
servers: a 429 or 5xx is sent again only when it carries an integer Retry-After, at most ten
times, counted in rest_client_request_retries_total; a GET whose connection broke is sent again
after 1 s, a write is not."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import orjson
import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from pykcm.client import retry
from pykcm.client.config import ClientConfig
from pykcm.client.errors import ApiError, InternalError, ServiceUnavailable, TooManyRequests, TransportError
from pykcm.client.httpconnection import ServerDisconnected
from pykcm.client.rest import RestClient, _ThrottleLog
from pykcm.util.log import set_verbosity
from tests.support import loopback_server
from tests.unit.test_http import Handler, answer_once, client, ok, raw_server, read_request

Answer = tuple[int, dict[str, str]]  # a status code (200: a ConfigMap) and headers
CONFIGMAP = {"kind": "ConfigMap"}


def answer(code: int, headers: dict[str, str]) -> web.Response:
    if code == 200:
        return web.json_response(CONFIGMAP, headers=headers)
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "message": "try later"}
    return web.json_response(body, status=code, headers=headers)


_counted_before: dict[tuple[str, str, str], float] = {}  # retries a server's address had counted at its start


def counted_from_now(url: str) -> str:
    """Retries are counted per host and port, and the kernel may give a new server the port of an
    earlier test's: retries() counts those since this call only (a CI run once saw 2 for 1)."""
    host = url.removeprefix("http://")
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == "rest_client_request_retries_total" and sample.labels.get("host") == host:
                _counted_before[(sample.labels["code"], sample.labels["verb"], host)] = sample.value
    return url


def retries(url: str, code: str, verb: str = "GET") -> float:
    host = url.removeprefix("http://")
    labels = {"code": code, "verb": verb, "host": host}
    total = REGISTRY.get_sample_value("rest_client_request_retries_total", labels) or 0.0
    return total - _counted_before.get((code, verb, host), 0.0)


async def serve(answers: list[Answer], method: str = "GET", qps: float = 1000) -> tuple[object, int, str]:
    """Send one request to a server giving `answers` in turn (the last one again when they run
    out): what the request returned or raised, how many times it was sent, the server's URL."""
    sent = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        sent += 1
        return answer(*answers[min(sent, len(answers)) - 1])

    async with loopback_server(handle) as url:
        url = counted_from_now(url)
        api = RestClient(ClientConfig(host=url, ssl_context=None, qps=qps, burst=1 if qps < 1000 else 1000))
        try:
            outcome: object = await api.request(method, PATH, body={} if method != "GET" else None)
        except (ApiError, TransportError) as err:
            outcome = err
        finally:
            await api.close()
    return outcome, sent, url


PATH = "/api/v1/namespaces/a/configmaps/c"
AGAIN = {"Retry-After": "0"}
OK: Answer = (200, {})


@pytest.mark.parametrize("code", [429, 500, 503, 504])
async def test_a_429_or_5xx_with_retry_after_is_sent_again(code: int) -> None:
    outcome, sent, url = await serve([(code, AGAIN), OK])
    assert (outcome, sent) == (CONFIGMAP, 2)
    assert retries(url, "200") == 1


@pytest.mark.parametrize(("code", "error"), [(429, TooManyRequests), (500, InternalError), (503, ServiceUnavailable)])
async def test_without_retry_after_the_error_is_the_callers(code: int, error: type[ApiError]) -> None:
    outcome, sent, url = await serve([(code, {}), OK])
    assert isinstance(outcome, error) and sent == 1
    assert retries(url, "200") == 0


@pytest.mark.parametrize("header", ["1.5", "soon", "Wed, 21 Oct 2015 07:28:00 GMT", ""])
async def test_a_retry_after_that_is_not_whole_seconds_is_no_retry(header: str) -> None:
    """client-go reads the header with strconv.Atoi: an HTTP date or a fraction is not honoured."""
    outcome, sent, _ = await serve([(503, {"Retry-After": header}), OK])
    assert isinstance(outcome, ServiceUnavailable) and sent == 1


async def test_a_4xx_other_than_429_is_never_retried() -> None:
    outcome, sent, _ = await serve([(409, AGAIN), OK], method="PUT")
    assert isinstance(outcome, ApiError) and outcome.code == 409 and sent == 1


async def test_ten_retries_then_the_last_answer_is_the_callers() -> None:
    outcome, sent, url = await serve([(503, AGAIN)], method="POST")
    assert isinstance(outcome, ServiceUnavailable)
    assert sent == 1 + retry.MAX_RETRIES
    assert retries(url, "503", "POST") == retry.MAX_RETRIES


def cut_first(arrivals: list[float], cut: bytes, then: bytes) -> Handler:
    """A raw server's handler: the first request gets `cut` and the connection closed, every later
    one `then`; each arrival's time goes to `arrivals`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader):
            arrivals.append(time.monotonic())
            writer.write(cut if len(arrivals) == 1 else then)
            await writer.drain()
            if len(arrivals) == 1:
                return

    return handle


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
async def test_a_get_whose_connection_broke_is_sent_again_after_a_second_and_a_write_is_not(method: str) -> None:
    """The first answer is cut short (the server closed the connection inside the response's head):
    the GET may be repeated, a write may have been done and is not."""
    arrivals: list[float] = []
    async with raw_server(cut_first(arrivals, ok(b'{"items": [1, 2, 3]}')[:20], ok(b'{"items": []}'))) as url:
        api = client(counted_from_now(url))
        labels = {"verb": "GET", "host": url.removeprefix("http://")}
        count_before, sum_before = (
            REGISTRY.get_sample_value(f"rest_client_request_duration_seconds_{part}", labels) or 0.0
            for part in ("count", "sum"))
        try:
            if method == "GET":
                assert await api.request(method, "/a") == {"items": []}
            else:
                with pytest.raises(TransportError, match="before the response was complete"):
                    await api.request(method, "/a", body={})
        finally:
            await api.close()
    if method == "GET":
        assert len(arrivals) == 2 and arrivals[1] - arrivals[0] >= 0.95
        assert retries(url, "200") == 1
        # Each attempt's latency is its own, as client-go observes it: not the second's wait.
        assert REGISTRY.get_sample_value("rest_client_request_duration_seconds_count", labels) - count_before == 2
        assert REGISTRY.get_sample_value("rest_client_request_duration_seconds_sum", labels) - sum_before < 0.5
    else:
        assert len(arrivals) == 1


async def test_a_get_whose_body_was_cut_after_its_head_fails_at_once_counted_as_its_status() -> None:
    """client-go's withRetry sees only what client.Do returns, which ends at the response's head: a
    body read error is the caller's at once, the attempt counted with the head's status."""
    arrivals: list[float] = []
    async with raw_server(cut_first(arrivals, ok(b'{"items": [1, 2, 3]}')[:-5], ok(b'{"items": []}'))) as url:
        api = client(counted_from_now(url))
        labels = {"code": "200", "method": "GET", "host": url.removeprefix("http://")}
        errors = {**labels, "code": "<error>"}
        before = [REGISTRY.get_sample_value("rest_client_requests_total", each) or 0.0 for each in (labels, errors)]
        try:
            with pytest.raises(TransportError, match="before the response was complete"):
                await api.request("GET", "/a")
        finally:
            await api.close()
    assert len(arrivals) == 1
    after = [REGISTRY.get_sample_value("rest_client_requests_total", each) or 0.0 for each in (labels, errors)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 0]
    assert retries(url, "200") == retries(url, "<error>") == 0


async def test_a_throttled_answer_whose_body_was_cut_is_sent_again_after_its_retry_after() -> None:
    """client-go decides from the head before it reads the body: a 429 with Retry-After is retried,
    a write too, even when its body breaks off."""
    arrivals: list[float] = []
    throttled = (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{")
    async with raw_server(cut_first(arrivals, throttled, ok(b'{"ok": true}'))) as url:
        api = client(url)
        try:
            assert await api.request("POST", "/a", body={}) == {"ok": True}
        finally:
            await api.close()
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] >= 0.95


def test_the_reasons_are_client_gos() -> None:
    throttled = retry.after_response(1, 429, {"retry-after": "2", "x-kubernetes-pf-flowschema-uid": "f-1"})
    assert throttled == retry.Retry(
        2, 'retries: 1, retry-after: 2s - retry-reason: due to server-side throttling, FlowSchema UID: "f-1"')
    assert retry.after_response(3, 500, {"retry-after": "+2"}) == retry.Retry(
        2, "retries: 3, retry-after: 2s - retry-reason: 500")
    assert retry.after_response(1, 503, {"retry-after": "-5"}).wait == 0  # type: ignore[union-attr]
    broken = retry.after_error(1, "GET", ConnectionResetError(), "GET /api: reset")
    assert broken == retry.Retry(
        1, "retries: 1, retry-after: 1s - retry-reason: due to retryable error, error: GET /api: reset")
    assert retry.after_error(1, "GET", ConnectionRefusedError(), "refused") is None
    cut = ServerDisconnected("server closed the connection before the response was complete")
    assert retry.after_error(1, "GET", cut, "cut") is not None  # before the head
    cut.status = 200
    assert retry.after_error(1, "GET", cut, "cut") is None  # a body cut after it
    assert retry.after_error(1, "GET", TimeoutError(), "timed out") is None
    assert retry.after_response(retry.MAX_RETRIES + 1, 429, {"retry-after": "1"}) is None


@pytest.fixture
def verbosity_3() -> Iterator[None]:
    set_verbosity(3)
    yield
    set_verbosity(0)


async def test_waits_for_the_rate_limiter_are_logged_with_the_reason(verbosity_3: None,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Over 50 ms at V(3), as client-go's tryThrottle; a retry's wait names the retry."""
    with caplog.at_level(logging.INFO, logger="pykcm.rest"):
        _, sent, url = await serve([(503, AGAIN), OK], qps=5)
    assert sent == 2
    waits = [r for r in caplog.records if r.getMessage() == "Waited before sending request"]
    assert len(waits) == 1
    kv = waits[0].kv  # type: ignore[attr-defined]
    assert kv["reason"] == "retries: 1, retry-after: 0s - retry-reason: 503"
    assert kv["verb"] == "GET" and kv["URL"] == f"{url}{PATH}"
    assert kv["delay"].endswith("ms")


def test_waits_over_a_second_reach_the_default_verbosity_once_in_ten_seconds(caplog: pytest.LogCaptureFixture) -> None:
    log = _ThrottleLog()
    with caplog.at_level(logging.INFO, logger="pykcm.rest"):
        for delay in (1.5, 2.0, 0.5, 3.0):
            log.waited(delay, "client-side throttling, not priority and fairness", "POST", "https://h/api")
    lines = [orjson.dumps(r.kv).decode() for r in caplog.records]  # type: ignore[attr-defined]
    assert len(lines) == 1 and '"delay":"1.5s"' in lines[0]


# -- watches: retried until their response head arrives, as client-go's Watch ----------------------


async def watched(answers: list[Answer]) -> tuple[object, int, str]:
    """Watch a server that gives `answers` in turn, then a stream of one ADDED event: the names
    seen (or the error raised), how many times the watch was sent, the server's URL."""
    sent = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        sent += 1
        if sent <= len(answers):
            return answer(*answers[sent - 1])
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(orjson.dumps({"type": "ADDED", "object": {"metadata": {"name": "c"}}}) + b"\n")
        return resp

    async with loopback_server(handle) as url:
        api = client(counted_from_now(url))
        try:
            outcome: object = [e["object"]["metadata"]["name"] async for e in api.watch(PATH, {})]
        except (ApiError, TransportError) as err:
            outcome = err
        finally:
            await api.close()
    return outcome, sent, url


async def test_a_watch_answered_429_or_5xx_with_retry_after_is_sent_again() -> None:
    outcome, sent, url = await watched([(429, AGAIN), (503, AGAIN)])
    assert (outcome, sent) == (["c"], 3)
    assert retries(url, "503") == 1 and retries(url, "200") == 1


async def test_a_watch_refused_without_retry_after_is_the_reflectors_to_handle() -> None:
    outcome, sent, _ = await watched([(410, AGAIN), (429, {})])
    assert isinstance(outcome, ApiError) and outcome.code == 410 and sent == 1
    outcome, sent, _ = await watched([(429, {})])
    assert isinstance(outcome, TooManyRequests) and sent == 1


async def test_a_watch_whose_connection_broke_before_its_head_is_sent_again() -> None:
    arrivals: list[float] = []
    stream = ok(b'{"type": "ADDED", "object": {"metadata": {"name": "c"}}}\n')
    async with raw_server(cut_first(arrivals, b"HTTP/1.1 200 OK\r\nContent-Ty", stream)) as url:  # cut in the head
        api = client(url)
        try:
            assert [e["object"]["metadata"]["name"] async for e in api.watch(PATH, {})] == ["c"]
        finally:
            await api.close()
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] >= 0.95


async def test_a_401_tells_the_token_source_and_is_not_retried() -> None:
    refused: list[int] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        return answer(401, {})

    async with loopback_server(handle) as url:
        api = RestClient(ClientConfig(host=url, ssl_context=None, on_unauthorized=lambda: refused.append(1)))
        with pytest.raises(ApiError) as err:
            await api.request("GET", PATH)
        await api.close()
    assert err.value.code == 401 and refused == [1]


async def test_a_success_answer_that_is_not_json_is_an_error_not_a_string() -> None:
    # A type served by a broken aggregated API: client-go's decode error, which the namespace
    # deleter counts against that type alone, where a string stopped the whole pass.
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(text="hello", content_type="text/plain")

    async with loopback_server(handle) as url:
        api = RestClient(ClientConfig(host=url, ssl_context=None))
        with pytest.raises(TransportError, match="serializer for text/plain; charset=utf-8 doesn't exist"):
            await api.request("GET", PATH)
        assert await api.request("GET", PATH, accept="text/plain") == "hello"
        await api.close()


async def test_a_success_answer_without_a_type_is_read_as_the_json_asked_for() -> None:
    async with raw_server(answer_once(b'HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{"kind":"ConfigMap"}')) as url:
        api = RestClient(ClientConfig(host=url, ssl_context=None))
        assert await api.request("GET", PATH) == {"kind": "ConfigMap"}
        await api.close()


@pytest.mark.parametrize(("code", "body", "content_type", "message"), [
    (500, "backend exploded", "text/plain",
     'an error on the server ("backend exploded") has prevented the request from succeeding'),
    (503, "nope", "text/plain", "the server is currently unable to handle the request"),
    (500, '{"error": "x"}', "application/json", 'an error on the server ("unknown") has prevented the request from '
                                                "succeeding"),
    (418, "", "text/plain", "the server responded with the status code 418 but did not return more information"),
    (403, "no way", "text/plain", "no way"),
])
async def test_an_error_answer_that_is_no_status_reads_as_client_gos(code: int, body: str, content_type: str,
                                                                      message: str) -> None:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, text=body, content_type=content_type)

    async with loopback_server(handle) as url:
        api = RestClient(ClientConfig(host=url, ssl_context=None))
        with pytest.raises(ApiError) as err:
            await api.request("GET", PATH)
        await api.close()
    assert err.value.code == code and err.value.message == message
