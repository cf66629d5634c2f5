"""The write fence (pykcm.client.fence) and what the elector gives it: the time the last
successful renewal was sent, and no renewal while the main event loop is wedged."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from pykcm.app import eventloop
from pykcm.app.leaderelection import LeaderElector, LeaseLock
from pykcm.client.config import ClientConfig
from pykcm.client.fence import FencedWrite, WriteFence
from pykcm.client.resources import CONFIGMAPS
from pykcm.client.rest import RestClient
from pykcm.serving.certs import self_signed_certificate
from tests.support import loopback_server
from tests.unit.test_leaderelection import DEFAULTS, FakeClock, FakeLeaseApi


def armed_fence(clock: FakeClock, renew_sent: float, window: float = 12.0) -> tuple[WriteFence, list[str]]:
    refusals: list[str] = []
    fence = WriteFence(clock)
    fence.arm(lambda: renew_sent, window, lambda _request, reason: refusals.append(reason))
    return fence, refusals


def test_an_unarmed_fence_lets_everything_through() -> None:
    WriteFence().check("POST", "/api/v1/namespaces/a/pods")


def test_writes_pass_within_the_window_and_are_refused_after_it() -> None:
    clock = FakeClock()
    fence, refusals = armed_fence(clock, renew_sent=clock.now)
    clock.step(11.9)
    fence.check("POST", "/api/v1/namespaces/a/pods")
    clock.step(0.2)
    with pytest.raises(FencedWrite, match=r"POST /api/v1/namespaces/a/pods: refused, lease last renewed 12\.1s ago"):
        fence.check("POST", "/api/v1/namespaces/a/pods")
    assert len(refusals) == 1


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE"])
def test_every_mutating_verb_is_fenced(method: str) -> None:
    clock = FakeClock()
    fence, _ = armed_fence(clock, renew_sent=clock.now - 30)
    with pytest.raises(FencedWrite):
        fence.check(method, "/apis/apps/v1/namespaces/a/replicasets/web/status")


def test_reads_and_reviews_are_never_fenced() -> None:
    clock = FakeClock()
    fence, refusals = armed_fence(clock, renew_sent=clock.now - 30)
    fence.check("GET", "/api/v1/pods")
    fence.check("POST", "/apis/authentication.k8s.io/v1/tokenreviews")
    fence.check("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews")
    assert refusals == []


def test_a_shut_fence_refuses_every_write() -> None:
    clock = FakeClock()
    fence, _ = armed_fence(clock, renew_sent=clock.now)
    fence.shut("leader election lost")
    with pytest.raises(FencedWrite, match="leader election lost"):
        fence.check("DELETE", "/api/v1/namespaces/a/pods/p")


# -- the check at the socket ------------------------------------------------------------------------


class FreezingClock(FakeClock):
    """Jumps `freeze` seconds after its first `ticks` readings: a process frozen between the
    check after the rate limiter and the moment the request's bytes go to the socket."""

    def __init__(self, ticks: int, freeze: float) -> None:
        super().__init__()
        self.ticks, self.freeze = ticks, freeze

    def __call__(self) -> float:
        self.ticks -= 1
        if self.ticks == -1:
            self.step(self.freeze)
        return self.now


@pytest.fixture
async def recording_server() -> AsyncIterator[tuple[str, list[str]]]:
    """A fake apiserver on loopback that records each request it receives as "METHOD path"."""
    received: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        received.append(f"{request.method} {request.path}")
        return web.json_response({"kind": "ConfigMap", "metadata": {"name": "c"}})

    async with loopback_server(handle) as url:
        yield url, received


def fenced_client(url: str, fence: WriteFence) -> RestClient:
    return RestClient(ClientConfig(host=url, ssl_context=None, qps=1000, burst=1000, write_fence=fence))


@pytest.mark.parametrize("method", ["POST", "DELETE"], ids=["with a body", "without a body"])
async def test_a_write_frozen_after_the_first_check_is_refused_at_the_socket(
    recording_server: tuple[str, list[str]], method: str
) -> None:
    url, received = recording_server
    clock = FreezingClock(ticks=1, freeze=30.0)  # the first check passes, the one at the socket does not
    fence, refusals = armed_fence(clock, renew_sent=clock.now)
    client = fenced_client(url, fence)
    try:
        body = {"metadata": {"name": "c"}} if method == "POST" else None
        with pytest.raises(FencedWrite, match=rf"{method} /api/v1/namespaces/a/configmaps: refused"):
            await client.request(method, CONFIGMAPS.path("a"), body=body)
        await asyncio.sleep(0.1)  # anything sent would have arrived by now
    finally:
        await client.close()
    assert received == []
    assert len(refusals) == 1


async def test_a_guarded_connection_carries_writes_in_the_window_and_reads_after_it(
    recording_server: tuple[str, list[str]],
) -> None:
    url, received = recording_server
    clock = FakeClock()
    fence, _ = armed_fence(clock, renew_sent=clock.now)
    client = fenced_client(url, fence)
    try:
        await client.create(CONFIGMAPS, {"metadata": {"name": "c"}}, "a")
        fence.shut("leader election lost")
        await client.get(CONFIGMAPS, "c", "a")  # the same pooled, guarded connection
        with pytest.raises(FencedWrite):
            await client.delete(CONFIGMAPS, "c", "a")
    finally:
        await client.close()
    assert received == ["POST /api/v1/namespaces/a/configmaps", "GET /api/v1/namespaces/a/configmaps/c"]


LOOPS = [
    "asyncio",
    pytest.param("uvloop", marks=pytest.mark.skipif(eventloop.loop_factory(True) is None, reason="no uvloop")),
]


def tls_contexts(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    cert, key = self_signed_certificate("127.0.0.1")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    return server, client


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("loop", LOOPS)
def test_the_check_at_the_socket_holds_on_either_event_loop(loop: str, tls: bool, tmp_path: Path) -> None:
    """uvloop's transports are extension types (their write cannot be replaced on an instance):
    the fence wraps the connection's transport instead, and its check still comes first."""
    server_tls, client_tls = tls_contexts(tmp_path) if tls else (None, None)
    received: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        received.append(f"{request.method} {request.path}")
        return web.json_response({"kind": "ConfigMap", "metadata": {"name": "c"}})

    async def scenario() -> tuple[str, list[str]]:
        async with loopback_server(handle, server_tls) as url:
            clock = FreezingClock(ticks=1, freeze=30.0)  # a read never looks; the write's second look fails
            fence, refusals = armed_fence(clock, renew_sent=clock.now)
            client = RestClient(ClientConfig(host=url, ssl_context=client_tls, qps=1000, burst=1000, write_fence=fence))
            try:
                await client.get(CONFIGMAPS, "c", "a")
                with pytest.raises(FencedWrite):
                    await client.create(CONFIGMAPS, {"metadata": {"name": "c"}}, "a")
                await asyncio.sleep(0.1)  # anything sent would have arrived by now
            finally:
                await client.close()
        return eventloop.implementation(asyncio.get_running_loop()), refusals

    implementation, refusals = eventloop.run(scenario(), use_uvloop=loop == "uvloop")
    assert implementation == loop
    assert received == ["GET /api/v1/namespaces/a/configmaps/c"]
    assert len(refusals) == 1


class SlowLeaseApi(FakeLeaseApi):
    """Answers each write `delay` fake seconds after it was sent."""

    def __init__(self, clock: FakeClock, delay: float) -> None:
        super().__init__()
        self.clock, self.delay = clock, delay

    async def request(self, method: str, path: str, **kwargs: object) -> object:
        answer = await super().request(method, path, **kwargs)
        if method != "GET":
            self.clock.step(self.delay)
        return answer


async def test_renew_sent_is_when_the_renewal_was_sent_not_answered() -> None:
    clock = FakeClock()
    api = SlowLeaseApi(clock, delay=3.0)
    elector = LeaderElector(LeaseLock(api, "kube-system", "lease", "a"), DEFAULTS, clock=clock)  # type: ignore[arg-type]
    sent = clock.now
    assert await elector.try_acquire_or_renew()
    assert elector.renew_sent == sent and clock.now == sent + 3.0
    sent = clock.now
    assert await elector.try_acquire_or_renew()  # the fast path
    assert elector.renew_sent == sent


async def test_no_acquire_or_renew_while_the_loop_is_reported_wedged() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    wedged: list[str] = []
    elector = LeaderElector(
        LeaseLock(api, "kube-system", "lease", "a"), DEFAULTS, clock=clock,  # type: ignore[arg-type]
        may_write=lambda: wedged[0] if wedged else None,
    )
    assert await elector.try_acquire_or_renew()
    writes = len(api.writes)
    wedged.append("event loop has not run for 6.0s")
    assert not await elector.try_acquire_or_renew()
    assert len(api.writes) == writes
    wedged.clear()
    await asyncio.sleep(0)
    assert await elector.try_acquire_or_renew()


def test_the_write_window_keeps_its_margin_from_the_whole_seconds_the_lease_says() -> None:
    from pykcm.app.leaderelection import LeaderElectionConfig
    from pykcm.app.leasethread import fence_window

    # A standby waits out leaseDurationSeconds, the duration's whole seconds: 3.9 s is written as 3.
    assert fence_window(LeaderElectionConfig(lease_duration=3.9, renew_deadline=2.0, retry_period=0.5)) == 2.0
    assert fence_window(LeaderElectionConfig(lease_duration=15.0, renew_deadline=10.0, retry_period=2.0)) == 12.0
    # a lease of a second still leaves writes half of it, where every write was refused
    assert fence_window(LeaderElectionConfig(lease_duration=1.0, renew_deadline=0.5, retry_period=0.1)) == 0.5
