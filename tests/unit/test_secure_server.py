"""pykcm's handler chain on the secure port (pykcm.serving.server), without an apiserver: what is
authorized before routing, what is routed, and KCM's answers and headers."""

from __future__ import annotations

import logging
import time

import orjson
import pytest

from pykcm.client.config import ClientConfig
from pykcm.client.rest import RestClient
from pykcm.serving.authn import DelegatingAuthenticator
from pykcm.serving.authz import DelegatingAuthorizer
from pykcm.serving.certs import ServingError
from pykcm.serving.healthz import HealthCheck
from pykcm.serving.server import SecureServer, go_bounds, metrics_content_type
from pykcm.util.log import get_logger, set_verbosity
from tests.support import free_port
from tests.unit.test_serving_http import connect, exchange, get, read_response


async def secure_server(always_allow: list[str]) -> SecureServer:
    """pykcm's handler chain on plain TCP, with no apiserver: anonymous users pass only `always_allow`."""
    checks = [HealthCheck("ping", lambda: None)]
    server = SecureServer(
        "127.0.0.1", free_port(), None,  # type: ignore[arg-type]
        lambda: checks, DelegatingAuthenticator(None), DelegatingAuthorizer(None, always_allow),
    )
    await server.start()
    return server


async def test_the_secure_port_authorizes_before_it_routes() -> None:
    server = await secure_server(["/healthz", "/livez", "/readyz"])
    try:
        status, headers, body, _ = await exchange(server.port, get("/healthz", "Connection: close"))
        assert (status, body) == ("HTTP/1.1 200 OK", b"ok")
        assert headers["cache-control"] == "no-cache, private" and headers["x-content-type-options"] == "nosniff"
        assert headers["content-type"] == "text/plain; charset=utf-8"
        for data in (get("/nope", "Connection: close"), get("/metrics", "Connection: close", method="POST")):
            status, headers, body, _ = await exchange(server.port, data)
            assert status == "HTTP/1.1 403 Forbidden" and headers["cache-control"] == "no-cache, private"
            assert orjson.loads(body)["code"] == 403 and headers["x-content-type-options"] == "nosniff"
        status, headers, body, _ = await exchange(server.port, get("/healthz", "Connection: close", method="POST"))
        assert (status, body) == ("HTTP/1.1 200 OK", b"ok")  # KCM's handlers answer any method
        assert headers["cache-control"] == "no-cache, private"
    finally:
        await server.stop()


async def test_the_secure_port_routes_what_it_serves() -> None:
    server = await secure_server(["/*"])
    try:
        for path in ("/nope", "/healthz/", "/healthz/nope", "/healthz/ping/x", "/metrics/", "/healthz%2Fping%2Fx"):
            status, headers, body, _ = await exchange(server.port, get(path, "Connection: close"))
            assert (status, body) == ("HTTP/1.1 404 Not Found", b"404 page not found\n"), path
            assert headers["cache-control"] == "no-cache, private"
        assert (await exchange(server.port, get("/readyz/ping", "Connection: close")))[2] == b"ok"
        # Matched once percent-decoded, as KCM's mux matches URL.Path.
        assert (await exchange(server.port, get("/readyz%2Fping", "Connection: close")))[2] == b"ok"
        status, headers, _, _ = await exchange(server.port, get("/%6detrics", "Connection: close"))
        assert status == "HTTP/1.1 200 OK" and headers["content-type"] == metrics_content_type("")
        status, _, body, _ = await exchange(server.port, get("/livez?verbose&exclude=ping", "Connection: close"))
        assert body == b"[+]ping excluded: ok\nlivez check passed\n"
        reader, writer = await connect(server.port)
        writer.write(get("/metrics", method="HEAD") + get("/healthz/ping", "Connection: close"))
        status, headers, _ = await read_response(reader, head_only=True)
        assert status == "HTTP/1.1 200 OK" and headers["content-type"] == metrics_content_type("")
        assert int(headers["content-length"]) > 0
        assert (await read_response(reader))[2] == b"ok"  # the HEAD answer carried no body
        writer.close()
    finally:
        await server.stop()


async def test_the_start_is_said_in_kcms_words(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pykcm"):
        server = await secure_server([])
    await server.stop()
    said = [(r.getMessage(), r.kv) for r in caplog.records if r.name == "pykcm.server"]  # type: ignore[attr-defined]
    assert said == [(f"Serving securely on 127.0.0.1:{server.port}", {})]  # apiserver's secure_serving.go


async def test_a_port_in_use_is_named_once_in_one_line() -> None:
    server = await secure_server([])
    second = SecureServer("127.0.0.1", server.port, None, lambda: [], DelegatingAuthenticator(None),  # type: ignore[arg-type]
                          DelegatingAuthorizer(None, []))
    try:
        with pytest.raises(ServingError) as err:
            await second.start()
        assert str(err.value) == f"failed to listen on 127.0.0.1:{server.port}: address already in use"
    finally:
        await server.stop()


async def test_an_authorizer_that_cannot_be_asked_is_a_plain_500() -> None:
    # As the apiserver's filter: Go's http.Error text with the path and the reason, not a Status.
    unreachable = RestClient(ClientConfig(host=f"http://127.0.0.1:{free_port()}", ssl_context=None))
    server = SecureServer("127.0.0.1", free_port(), None, lambda: [], DelegatingAuthenticator(None),  # type: ignore[arg-type]
                          DelegatingAuthorizer(unreachable, []))
    await server.start()
    try:
        status, headers, body, _ = await exchange(server.port, get("/metrics", "Connection: close"))
        assert status == "HTTP/1.1 500 Internal Server Error"
        assert (headers["content-type"], headers["x-content-type-options"]) == ("text/plain; charset=utf-8", "nosniff")
        assert body.startswith(b'Internal Server Error: "/metrics": POST /apis/authorization.k8s.io/v1/subjectaccess')
    finally:
        await server.stop()
        await unreachable.close()


PROMETHEUS_3_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;"
    "q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


# What the built KCM (v1.36.3) answered to each Accept, by curl.
@pytest.mark.parametrize(
    ("accept", "escaping"),
    [("", "underscores"), (PROMETHEUS_3_ACCEPT, "allow-utf-8"), ("*/*", "underscores"),
     ("text/plain;version=0.0.4;q=0.3,*/*;q=0.2", "underscores"), ("text/plain;version=1.0.0;escaping=dots", "dots")],
)
def test_the_metrics_content_type_is_kcms(accept: str, escaping: str) -> None:
    assert metrics_content_type(accept) == f"text/plain; version=0.0.4; charset=utf-8; escaping={escaping}"


def test_bucket_bounds_and_quantiles_are_spelled_as_go_writes_them() -> None:
    # prometheus/common's writeFloat: 1 -> "1", 10 -> "10", 262144 -> "262144"; fractions and
    # exponents are already the same; a label merely containing `le="1.0"` is not one.
    python = (b'h_bucket{name="a",le="1.0"} 2.0\nh_bucket{le="10.0"} 2.0\nh_bucket{le="0.5"} 1.0\n'
              b'h_bucket{le="262144.0"} 1.0\nh_bucket{le="1.048576e+06"} 1.0\ns{quantile="1.0"} 3.0\n'
              b'g{q="le=\\"1.0\\""} 1.0\n')
    assert go_bounds(python) == (b'h_bucket{name="a",le="1"} 2.0\nh_bucket{le="10"} 2.0\nh_bucket{le="0.5"} 1.0\n'
                                 b'h_bucket{le="262144"} 1.0\nh_bucket{le="1.048576e+06"} 1.0\ns{quantile="1"} 3.0\n'
                                 b'g{q="le=\\"1.0\\""} 1.0\n')


async def test_metrics_slis_has_each_aggregated_checks_result_and_delete_resets_it() -> None:
    server = await secure_server(["/*"])
    try:
        reset = await exchange(server.port, get("/metrics/slis", "Connection: close", method="DELETE"))
        assert reset[::2] == ("HTTP/1.1 200 OK", b"metrics reset\n")
        for path in ("/healthz", "/healthz", "/livez?exclude=ping", "/readyz/ping"):  # excluded and single: not counted
            await exchange(server.port, get(path, "Connection: close"))
        status, headers, body, _ = await exchange(server.port, get("/metrics/slis", "Connection: close"))
        assert status == "HTTP/1.1 200 OK" and headers["content-type"] == metrics_content_type("")
        assert abs(int(headers["process-start-time-unix"]) - time.time()) < 3600  # promhttp's header, as KCM's
        text = body.decode()
        assert 'kubernetes_healthcheck{name="ping",type="healthz"} 1.0' in text
        assert 'kubernetes_healthchecks_total{name="ping",status="success",type="healthz"} 2.0' in text
        assert 'type="livez"' not in text and 'type="readyz"' not in text and "_created" not in text
        assert "process_start_time_seconds " in text and "workqueue_" not in text
        await exchange(server.port, get("/metrics/slis", "Connection: close", method="DELETE"))
        body = (await exchange(server.port, get("/metrics/slis", "Connection: close")))[2]
        assert b"kubernetes_healthcheck{" not in body
    finally:
        await server.stop()


async def test_debug_flags_v_changes_the_log_verbosity_as_kcms_does() -> None:
    server = await secure_server(["/*"])
    put = "PUT /debug/flags/v HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{}"
    try:
        status, headers, body, _ = await exchange(server.port, put.format(1, "4").encode())
        assert (status, body) == ("HTTP/1.1 200 OK", b"successfully set klog.logging.verbosity to 4\n")
        assert (headers["content-type"], headers["x-content-type-options"]) == ("text/plain", "nosniff")
        assert get_logger("test").v(4).enabled()
        for value, error in [("x", 'strconv.ParseUint: parsing "x": invalid syntax'),
                             ("-1", 'strconv.ParseUint: parsing "-1": invalid syntax'),
                             ("4294967296", 'strconv.ParseUint: parsing "4294967296": value out of range')]:
            status, _, body, _ = await exchange(server.port, put.format(len(value), value).encode())
            assert (status, body) == ("HTTP/1.1 400 Bad Request", f"{error}\n".encode()), value
        status, _, body, _ = await exchange(server.port, get("/debug/flags/v", "Connection: close"))
        assert (status, body) == ("HTTP/1.1 406 Not Acceptable", b"unsupported http method\n")
        status, headers, body, _ = await exchange(server.port, get("/debug/flags/", "Connection: close"))
        assert status == "HTTP/1.1 200 OK" and headers["content-type"] == "text/html; charset=utf-8"
        assert b"<tr>v<br>" in body
    finally:
        set_verbosity(0)
        await server.stop()


async def test_without_profiling_debug_flags_are_not_served() -> None:
    server = SecureServer("127.0.0.1", free_port(), None, lambda: [], DelegatingAuthenticator(None),  # type: ignore[arg-type]
                          DelegatingAuthorizer(None, ["/*"]), debug_flags=False)
    await server.start()
    try:
        status = (await exchange(server.port, get("/debug/flags/v", "Connection: close", method="PUT")))[0]
        assert status == "HTTP/1.1 404 Not Found"
    finally:
        await server.stop()
