"""A leader that loses its Lease to another writer, and a renew interval that keeps the fence open.

A Lease deleted or handed to another holder (an operator forcing a failover) ends the leading term
at once, with the fence shut from the lease thread, rather than after the renew deadline with two
leaders acting meanwhile. Between healthy renewals the leader waits at most half the fence's
window, so a short lease with a long retry period does not refuse its own writes.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from pykcm.app import leasethread
from pykcm.app.leaderelection import LeaderElectionConfig, LeaderElector, LeaseLock
from pykcm.app.leasethread import ThreadedElector, fence_window, renew_interval
from pykcm.app.options import LEADER_ELECTION_JITTER
from pykcm.client import events
from pykcm.client.config import ClientConfig
from pykcm.client.errors import NotFound
from pykcm.client.fence import WriteFence
from pykcm.util.log import kref
from tests.unit.test_leaderelection import DEFAULTS, FakeLeaseApi, unique

FAST = LeaderElectionConfig(lease_duration=1.5, renew_deadline=1.0, retry_period=0.1)


def lease_path(name: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{name}"


def set_holder(api: FakeLeaseApi, name: str, holder: str) -> None:
    """An edit by hand (kubectl patch), or another candidate's takeover: a new resourceVersion."""
    edited = copy.deepcopy(api.objects[lease_path(name)])
    edited["spec"]["holderIdentity"] = holder
    api._store(lease_path(name), edited)


async def leading(
    api: FakeLeaseApi, name: str, lost: list[str], stop: asyncio.Event | None = None
) -> tuple[LeaderElector, asyncio.Task[bool]]:
    lock = LeaseLock(api, "kube-system", name, "host_a")  # type: ignore[arg-type]
    elector = LeaderElector(lock, FAST, on_lost=lost.append)
    assert await elector.acquire(asyncio.Event())
    renewing = asyncio.create_task(elector.renew(stop or asyncio.Event()))
    await asyncio.sleep(0.25)  # a few renewals on the fast path
    assert not renewing.done()
    return elector, renewing


# -- F1: a Lease taken or deleted under the leader ----------------------------------------------------


async def test_a_leader_that_finds_another_holder_gives_up_at_once(caplog: pytest.LogCaptureFixture) -> None:
    api, name, lost = FakeLeaseApi(), unique(), []
    elector, renewing = await leading(api, name, lost)

    with caplog.at_level(logging.INFO, logger="pykcm"):
        set_holder(api, name, "host_b")
        # Within a retry period or two, not after the 1 s renew deadline.
        assert await asyncio.wait_for(renewing, 0.35) is False

    assert lost == ["lease taken by host_b"] and elector.lost_reason == "lease taken by host_b"
    assert api.spec(name)["holderIdentity"] == "host_b"  # not fought over
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]  # one line, not "Failed to renew"
    assert [r.getMessage() for r in errors] == ["Lease taken by another candidate, stopping"]
    assert errors[0].kv["holder"] == "host_b"  # type: ignore[attr-defined]
    assert not elector.is_leader() and elector.check() is None


async def test_a_leader_whose_lease_is_deleted_creates_it_again_and_leads_on() -> None:
    """As client-go: a Lease deleted by hand is created again by its leader; a standby's create
    then fails (AlreadyExists), so no two lead."""
    api, name, lost, stop = FakeLeaseApi(), unique(), [], asyncio.Event()
    elector, renewing = await leading(api, name, lost, stop)

    del api.objects[lease_path(name)]
    await asyncio.sleep(0.35)

    assert not renewing.done() and lost == []
    assert api.spec(name)["holderIdentity"] == "host_a"
    stop.set()
    assert await asyncio.wait_for(renewing, 1) is True and elector.is_leader()


async def test_a_leader_whose_deleted_lease_another_created_first_gives_up_at_once() -> None:
    api, name, lost = FakeLeaseApi(), unique(), []
    _, renewing = await leading(api, name, lost)
    original_get = api.request

    async def deleted_then_taken(method: str, path: str, **kwargs: object) -> object:
        if method == "GET" and path == lease_path(name) and api.spec(name)["holderIdentity"] == "host_a":
            # Between our GET's 404 and our create, a standby creates it.
            set_holder(api, name, "host_b")
            raise NotFound(404, "NotFound", "not found")
        return await original_get(method, path, **kwargs)

    api.request = deleted_then_taken  # type: ignore[method-assign]
    set_holder(api, name, "host_a")  # a new resourceVersion: the fast path conflicts, the slow path reads
    assert await asyncio.wait_for(renewing, 0.35) is False
    assert lost == ["lease taken by another candidate"] and api.spec(name)["holderIdentity"] == "host_b"


async def test_a_holder_cleared_by_hand_is_taken_back_as_before() -> None:
    api, name, lost, stop = FakeLeaseApi(), unique(), [], asyncio.Event()
    elector, renewing = await leading(api, name, lost, stop)
    transitions = api.spec(name)["leaseTransitions"]

    set_holder(api, name, "")
    await asyncio.sleep(0.35)

    assert not renewing.done() and lost == []
    assert api.spec(name)["holderIdentity"] == "host_a" and api.spec(name)["leaseTransitions"] == transitions + 1
    stop.set()
    assert await asyncio.wait_for(renewing, 1) is True and elector.is_leader()


class ThreadLeaseApi(FakeLeaseApi):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict] = []  # the LeaderElection Events written

    async def create(self, _resource: object, body: dict, namespace: str | None = None) -> dict:
        self.events.append(body)
        return {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}

    async def close(self) -> None:
        pass


@pytest.fixture
def threaded(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadLeaseApi]:
    """The lease thread's RestClient is this fake; no LeaderElection Events."""
    api = ThreadLeaseApi()
    monkeypatch.setattr(leasethread, "RestClient", lambda _config, _suffix: api)
    monkeypatch.setattr(leasethread, "EventRecorder", lambda _client, _component, **_kwargs: None)
    yield api


async def test_the_leader_election_events_are_logged_at_v0_as_kcms(
    threaded: ThreadLeaseApi, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """KCM's broadcaster logs them (StartStructuredLogging(0)): grepping "became leader" finds it."""
    monkeypatch.undo()  # the real recorder, writing to the fake
    monkeypatch.setattr(leasethread, "RestClient", lambda _config, _suffix: threaded)
    name = unique()
    with caplog.at_level(logging.INFO, logger="pykcm"):
        elector = threaded_elector(name, FAST, WriteFence())
        try:
            assert await elector.acquire(asyncio.Event())
        finally:
            await elector.close()
    [occurred] = [r for r in caplog.records if r.getMessage() == "Event occurred"]
    assert occurred.v == 0  # type: ignore[attr-defined]
    assert occurred.kv == {  # type: ignore[attr-defined]
        "object": kref("kube-system", name), "fieldPath": "", "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
        "type": "Normal", "reason": "LeaderElection", "message": "host_a became leader",
    }
    assert [e["message"] for e in threaded.events] == ["host_a became leader"]


def threaded_elector(name: str, config: LeaderElectionConfig, fence: WriteFence) -> ThreadedElector:
    heartbeat = SimpleNamespace(age=lambda: 0.0)  # the main loop is never wedged here
    client_config = ClientConfig(host="https://127.0.0.1:1", ssl_context=None)
    return ThreadedElector(client_config, "kube-system", name, "host_a", config, fence, heartbeat, "pykcm")  # type: ignore[arg-type]


async def test_the_lease_thread_shuts_the_fence_as_soon_as_it_sees_another_holder(threaded: ThreadLeaseApi) -> None:
    name, fence = unique(), WriteFence()
    elector = threaded_elector(name, FAST, fence)
    try:
        assert await elector.acquire(asyncio.Event())
        renewing = asyncio.create_task(elector.renew(asyncio.Event()))
        await asyncio.sleep(0.25)
        assert fence.reason_to_refuse() is None

        async def take_over() -> None:  # on the thread's loop, between two of its renewals
            set_holder(threaded, name, "host_b")

        await elector._call(take_over())
        # The main loop is busy (blocked) for a retry period and a margin, far under the 1 s deadline:
        # only the lease thread can shut the fence meanwhile.
        time.sleep(0.25)

        assert fence.reason_to_refuse() == "lease taken by host_b"
        assert await asyncio.wait_for(renewing, 1) is False
        assert fence.reason_to_refuse() == "lease taken by host_b"  # the main loop keeps the reason
    finally:
        await elector.close()


# -- F2: the renew interval against the fence's window ------------------------------------------------


def valid_settings() -> Iterator[LeaderElectionConfig]:
    """A grid of the (L, R, P) KCM accepts: L > R > 1.2 P > 0, L from 1 s to 20 s."""
    for lease in [1.0 + step / 2 for step in range(39)] + [2.9, 3.9, 4.99]:
        for renew in (lease * f for f in (0.3, 0.5, 0.66, 0.8, 0.95, 0.999)):
            for retry in (renew / LEADER_ELECTION_JITTER * f for f in (0.1, 0.5, 0.9, 0.999)):
                yield LeaderElectionConfig(lease, renew, retry)


def test_a_renewal_always_has_half_the_window_to_be_sent_and_answered() -> None:
    checked = 0
    for config in valid_settings():
        interval, window = renew_interval(config), fence_window(config)
        assert 0 < interval <= config.retry_period, config
        # A round trip (0.5 s, or half the window for leases under 3 s) fits before the window closes.
        assert interval + min(0.5, window / 2) <= window, config
        checked += 1
    assert checked > 900


def test_the_renew_interval_is_the_retry_period_for_usual_settings() -> None:
    assert renew_interval(DEFAULTS) == 2.0
    assert renew_interval(LeaderElectionConfig(60.0, 40.0, 5.0)) == 5.0
    # The review's crash loop: the window is 2 s, renewals were every 2 s plus a round trip.
    assert renew_interval(LeaderElectionConfig(3.0, 2.5, 2.0)) == 1.0


async def test_a_healthy_leader_with_a_short_lease_keeps_its_fence_open(
    threaded: ThreadLeaseApi, caplog: pytest.LogCaptureFixture
) -> None:
    # KCM accepts 2s/1.5s/1.2s; the write window is 1 s, under the 1.2 s retry period.
    config, fence = LeaderElectionConfig(2.0, 1.5, 1.2), WriteFence()
    with caplog.at_level(logging.INFO, logger="pykcm"):
        elector = threaded_elector(unique(), config, fence)
    shortened = [r for r in caplog.records if r.getMessage().startswith("Renewing the lease more often")]
    assert len(shortened) == 1 and shortened[0].kv["interval"] == "0.5s"  # type: ignore[attr-defined]
    try:
        assert await elector.acquire(asyncio.Event())
        stop = asyncio.Event()
        renewing = asyncio.create_task(elector.renew(stop))
        for _ in range(32):  # 1.6 s: past the window and the retry period
            assert fence.reason_to_refuse() is None
            await asyncio.sleep(0.05)
        stop.set()
        assert await asyncio.wait_for(renewing, 2) is True
    finally:
        await elector.close()


async def test_default_settings_say_nothing_of_the_renew_interval(
    threaded: ThreadLeaseApi, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="pykcm"):
        elector = threaded_elector(unique(), DEFAULTS, WriteFence())
    await elector.close()
    assert not [r for r in caplog.records if "more often" in r.getMessage()]
    assert elector.elector.renew_interval == DEFAULTS.retry_period


# -- a renewal that ends other than renewed -------------------------------------------------------


def master_status(name: str) -> float | None:
    return REGISTRY.get_sample_value("leader_election_master_status", {"name": name})


async def test_a_crashed_renewal_shuts_the_fence_and_is_no_longer_leading(threaded: ThreadLeaseApi) -> None:
    """A bug raising in the renewal (not a False answer) must not leave writes passing until the
    window closes, nor the metric saying this process leads."""
    name, fence = unique(), WriteFence()
    elector = threaded_elector(name, FAST, fence)
    try:
        assert await elector.acquire(asyncio.Event())
        assert master_status(name) == 1 and fence.reason_to_refuse() is None

        async def crash(_stop: asyncio.Event) -> bool:  # on the thread, as the elector's renew runs
            raise KeyError("boom")

        elector.elector.renew = crash  # type: ignore[method-assign]
        with pytest.raises(KeyError):
            await elector.renew(asyncio.Event())
        assert (fence.reason_to_refuse() or "").startswith("lease renewal crashed: KeyError: 'boom'")
        assert master_status(name) == 0
    finally:
        await elector.close()


async def test_a_cancelled_renewal_shuts_the_fence_and_stops_renewing(threaded: ThreadLeaseApi) -> None:
    name, fence = unique(), WriteFence()
    elector = threaded_elector(name, FAST, fence)
    try:
        assert await elector.acquire(asyncio.Event())
        renewing = asyncio.create_task(elector.renew(asyncio.Event()))
        await asyncio.sleep(0.25)
        renewing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await renewing
        assert fence.reason_to_refuse() == "leader election stopped" and master_status(name) == 0
        renewed = threaded.objects[lease_path(name)]["spec"]["renewTime"]
        await asyncio.sleep(0.3)  # three renew intervals: the renewal on the thread was cancelled too
        assert threaded.objects[lease_path(name)]["spec"]["renewTime"] == renewed
    finally:
        await elector.close()


async def test_a_lost_lease_sends_no_event_a_retry_still_waits_to_send(
    threaded: ThreadLeaseApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "became leader" Event's first write fails and waits to be retried; the lease is lost
    meanwhile: closing drops it, as KCM's exit at once does, where a flush would send it late."""
    monkeypatch.undo()  # the real recorder, writing to the fake
    monkeypatch.setattr(leasethread, "RestClient", lambda _config, _suffix: threaded)
    monkeypatch.setattr(events, "RETRY_SLEEP", 1.0)
    monkeypatch.setattr(events, "random", SimpleNamespace(random=lambda: 1.0))
    failed: list[str] = []
    write = threaded.create

    async def first_write_fails(resource: object, body: dict, namespace: str | None = None) -> dict:
        if not failed:
            failed.append(body["message"])
            raise ConnectionResetError("connection reset by peer")
        return await write(resource, body, namespace)

    monkeypatch.setattr(threaded, "create", first_write_fails)
    name = unique()
    elector = threaded_elector(name, FAST, WriteFence())
    try:
        assert await elector.acquire(asyncio.Event())
        renewing = asyncio.create_task(elector.renew(asyncio.Event()))

        async def take_over() -> None:
            set_holder(threaded, name, "host_b")

        await elector._call(take_over())
        assert await asyncio.wait_for(renewing, 1) is False
    finally:
        started = time.monotonic()
        await elector.close()
    assert time.monotonic() - started < 0.5  # no flush waited for
    await asyncio.sleep(1.2)  # past the retry
    assert failed == ["host_a became leader"] and threaded.events == []
