"""Unit tests for pykcm.app.leaderelection: client-go's algorithm over an in-memory Lease store.

The store behaves like the apiserver for one resource: resourceVersions, Conflict on a stale
PUT, AlreadyExists on a second create. Time is a fake monotonic clock unless a test exercises
the real loops, which then use durations of a few tenths of a second.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import logging
import re
import uuid
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pykcm.app.leaderelection import (
    LeaderElectionConfig,
    LeaderElectionRecord,
    LeaderElector,
    LeaseLock,
    micro_time,
    new_identity,
)
from pykcm.client.errors import AlreadyExists, Conflict, NotFound, TransportError

MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
DEFAULTS = LeaderElectionConfig(lease_duration=15.0, renew_deadline=10.0, retry_period=2.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds


class FakeLeaseApi:
    """Just enough of the apiserver's Lease endpoints: RVs, Conflict, AlreadyExists, NotFound."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 100
        self.down = False
        self.writes: list[tuple[str, str]] = []  # (method, holder written)

    async def request(self, method: str, path: str, *, body: Any = None, timeout: Any = None, **_: Any) -> Any:
        await asyncio.sleep(0)
        if self.down:
            raise TransportError(f"{method} {path}: connection refused")
        if method == "GET":
            if path not in self.objects:
                raise NotFound(404, "NotFound", "not found")
            return copy.deepcopy(self.objects[path])
        self.writes.append((method, body["spec"]["holderIdentity"]))
        if method == "POST":
            key = f"{path}/{body['metadata']['name']}"
            if key in self.objects:
                raise AlreadyExists(409, "AlreadyExists", "already exists")
            return self._store(key, body)
        if method == "PUT":
            current = self.objects.get(path)
            if current is None:
                raise NotFound(404, "NotFound", "not found")
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise Conflict(409, "Conflict", "the object has been modified")
            return self._store(path, body)
        raise AssertionError(method)

    def _store(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[key] = obj
        return copy.deepcopy(obj)

    def spec(self, name: str = "lease") -> dict[str, Any]:
        return self.objects[f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{name}"]["spec"]


class FakeEvents:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.recorded.append((obj["kind"], reason, message))


def candidate(
    api: FakeLeaseApi,
    clock: FakeClock,
    identity: str,
    name: str = "lease",
    config: LeaderElectionConfig = DEFAULTS,
    events: FakeEvents | None = None,
) -> LeaderElector:
    lock = LeaseLock(api, "kube-system", name, identity, events)  # type: ignore[arg-type]
    return LeaderElector(lock, config, clock=clock)


def metric(name: str, lease: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"name": lease})


def unique() -> str:
    return f"lease-{uuid.uuid4().hex[:6]}"


def test_identity_is_hostname_underscore_uuid() -> None:
    host, _, rest = new_identity().rpartition("_")
    assert host and uuid.UUID(rest)


def test_micro_time_has_six_fractional_digits_in_utc() -> None:
    stamp = micro_time(datetime.datetime(2026, 1, 2, 3, 4, 5, 60, tzinfo=datetime.UTC))
    assert stamp == "2026-01-02T03:04:05.000060Z"


async def test_first_candidate_creates_the_lease_with_client_go_record() -> None:
    api, clock, events = FakeLeaseApi(), FakeClock(), FakeEvents()
    a = candidate(api, clock, "host_a", events=events)

    assert await a.acquire(asyncio.Event())

    spec = api.spec()
    assert spec["holderIdentity"] == "host_a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert MICRO_TIME.match(spec["acquireTime"]) and MICRO_TIME.match(spec["renewTime"])
    assert a.is_leader()
    assert events.recorded == [("Lease", "LeaderElection", "host_a became leader")]


async def test_scenario_40_standby_waits_while_the_holder_renews_and_only_reads() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    a, b = candidate(api, clock, "host_a", name), candidate(api, clock, "host_b", name)
    assert await a.try_acquire_or_renew()
    writes = len(api.writes)

    for _ in range(20):  # 40 s of the holder renewing every 2 s
        assert not await b.try_acquire_or_renew()
        clock.step(2.0)
        assert await a.try_acquire_or_renew()

    assert api.spec(name)["holderIdentity"] == "host_a"
    assert all(holder == "host_a" for _, holder in api.writes[writes:]), "the standby wrote the lease"
    assert metric("leader_election_master_status", name) == 0


async def test_scenario_41_standby_takes_over_after_expiry_by_its_own_clock() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    a, b = candidate(api, clock, "host_a", name), candidate(api, clock, "host_b", name)
    assert await a.try_acquire_or_renew()
    acquired_by_a = api.spec(name)["acquireTime"]
    assert not await b.try_acquire_or_renew()  # b observes the record now

    clock.step(14.9)  # a has stopped renewing; not yet expired in b's eyes
    assert not await b.try_acquire_or_renew()
    clock.step(0.2)
    assert await b.try_acquire_or_renew()

    spec = api.spec(name)
    assert spec["holderIdentity"] == "host_b"
    assert spec["leaseTransitions"] == 1
    assert spec["acquireTime"] != acquired_by_a


async def test_expiry_ignores_the_renew_time_written_in_the_lease() -> None:
    """A renewTime from a host whose clock is an hour behind does not make the lease look expired."""
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    an_hour_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    a = LeaderElector(
        LeaseLock(api, "kube-system", name, "host_a"),  # type: ignore[arg-type]
        DEFAULTS, clock=clock, wall_clock=lambda: an_hour_ago,
    )
    b = candidate(api, clock, "host_b", name)
    assert await a.try_acquire_or_renew()

    assert not await b.try_acquire_or_renew()
    clock.step(10)
    assert not await b.try_acquire_or_renew()


async def test_a_changed_record_restarts_the_countdown() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    a, b = candidate(api, clock, "host_a", name), candidate(api, clock, "host_b", name)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    clock.step(10)
    assert await a.try_acquire_or_renew()  # a renews: b sees a new record at its next look
    clock.step(6)
    assert not await b.try_acquire_or_renew()  # 16 s since b first looked, but only now saw the renewal
    clock.step(14)
    assert not await b.try_acquire_or_renew()
    clock.step(1.1)
    assert await b.try_acquire_or_renew()


async def test_scenario_42_concurrent_takeover_conflicts_and_one_leader_wins() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    old = candidate(api, clock, "host_old", name)
    b, c = candidate(api, clock, "host_b", name), candidate(api, clock, "host_c", name)
    assert await old.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert not await c.try_acquire_or_renew()
    clock.step(16)

    results = await asyncio.gather(b.try_acquire_or_renew(), c.try_acquire_or_renew())

    assert sorted(results) == [False, True]
    assert [b.is_leader(), c.is_leader()].count(True) == 1
    winner = "host_b" if results[0] else "host_c"
    assert api.spec(name)["holderIdentity"] == winner
    assert api.spec(name)["leaseTransitions"] == 1


async def test_renewal_keeps_acquire_time_and_transitions_on_the_fast_path() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    a = candidate(api, clock, "host_a", name)
    assert await a.try_acquire_or_renew()
    first = dict(api.spec(name))
    slowpath_before = metric("leader_election_slowpath_total", name)

    clock.step(2)
    assert await a.try_acquire_or_renew()

    spec = api.spec(name)
    assert spec["acquireTime"] == first["acquireTime"]
    assert spec["leaseTransitions"] == first["leaseTransitions"]
    assert spec["renewTime"] >= first["renewTime"]
    assert metric("leader_election_slowpath_total", name) == slowpath_before == 0


async def test_a_stale_optimistic_renewal_falls_back_to_the_slow_path() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    a = candidate(api, clock, "host_a", name)
    assert await a.try_acquire_or_renew()
    # Someone else bumps the resourceVersion without changing the holder (e.g. a label edit).
    key = f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{name}"
    api._store(key, api.objects[key])

    assert await a.try_acquire_or_renew()
    assert metric("leader_election_slowpath_total", name) == 1
    assert api.spec(name)["holderIdentity"] == "host_a"


async def test_release_lets_a_standby_take_over_without_waiting() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    a, b = candidate(api, clock, "host_a", name), candidate(api, clock, "host_b", name)
    assert await a.acquire(asyncio.Event())
    assert not await b.try_acquire_or_renew()

    assert await a.release()

    spec = api.spec(name)
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1 and spec["leaseTransitions"] == 0
    assert metric("leader_election_master_status", name) == 0
    assert await b.try_acquire_or_renew()  # same instant: an empty holder is free at once
    assert api.spec(name)["leaseTransitions"] == 1


async def test_release_reads_the_lease_first_so_another_writer_does_not_make_it_fail() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    a = candidate(api, clock, "host_a", name)
    assert await a.acquire(asyncio.Event())
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{name}"
    api._store(path, {**api.objects[path], "metadata": {**api.objects[path]["metadata"], "labels": {"x": "1"}}})

    assert await a.release()  # a PUT over the Lease last renewed was a Conflict

    assert api.spec(name)["holderIdentity"] == ""


async def test_release_leaves_a_lease_another_candidate_took_since() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    a = candidate(api, clock, "host_a", name)
    assert await a.acquire(asyncio.Event())
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{name}"
    taken = copy.deepcopy(api.objects[path])
    taken["spec"]["holderIdentity"] = "host_b"
    api._store(path, taken)
    writes = len(api.writes)

    assert await a.release()

    assert api.spec(name)["holderIdentity"] == "host_b" and len(api.writes) == writes


async def test_release_when_not_leading_writes_nothing() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    b = candidate(api, clock, "host_b", unique())
    assert await b.release()
    assert api.writes == []


async def test_acquire_returns_false_when_stopped_as_standby() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    assert await candidate(api, clock, "host_a", name).try_acquire_or_renew()
    stop = asyncio.Event()
    fast = LeaderElectionConfig(lease_duration=1.5, renew_deadline=1.0, retry_period=0.05)
    b = candidate(api, clock, "host_b", name, fast)

    task = asyncio.create_task(b.acquire(stop))
    await asyncio.sleep(0.2)
    stop.set()

    assert await asyncio.wait_for(task, 2) is False


async def test_renew_gives_up_after_the_deadline_when_the_apiserver_is_gone(caplog: pytest.LogCaptureFixture) -> None:
    api, events = FakeLeaseApi(), FakeEvents()
    name = unique()
    fast = LeaderElectionConfig(lease_duration=0.6, renew_deadline=0.4, retry_period=0.1)
    a = LeaderElector(LeaseLock(api, "kube-system", name, "host_a", events), fast)  # type: ignore[arg-type]
    assert await a.acquire(asyncio.Event())
    assert metric("leader_election_master_status", name) == 1

    renewing = asyncio.create_task(a.renew(asyncio.Event()))
    await asyncio.sleep(0.35)  # a few successful renewals first
    assert not renewing.done()
    api.down = True

    with caplog.at_level(logging.INFO, logger="pykcm"):
        assert await asyncio.wait_for(renewing, 2) is False
    assert metric("leader_election_master_status", name) == 0
    assert events.recorded[-1] == ("Lease", "LeaderElection", "host_a stopped leading")
    # client-go's info line; the error line is the manager's "leaderelection lost/stopped", as KCM's.
    [failed] = [r for r in caplog.records if r.getMessage() == "Failed to renew lease"]
    assert failed.levelno == logging.INFO
    assert failed.kv == {"lock": f"kube-system/{name}", "err": "context deadline exceeded"}  # type: ignore[attr-defined]


async def test_renew_returns_true_when_stopped() -> None:
    api = FakeLeaseApi()
    fast = LeaderElectionConfig(lease_duration=0.6, renew_deadline=0.4, retry_period=0.1)
    a = LeaderElector(LeaseLock(api, "kube-system", unique(), "host_a"), fast)  # type: ignore[arg-type]
    assert await a.acquire(asyncio.Event())
    stop = asyncio.Event()
    renewing = asyncio.create_task(a.renew(stop))
    await asyncio.sleep(0.25)
    stop.set()
    assert await asyncio.wait_for(renewing, 2) is True
    assert a.is_leader()


async def test_health_check_fails_only_for_a_leader_past_lease_duration_plus_20s() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    a, b = candidate(api, clock, "host_a", name), candidate(api, clock, "host_b", name)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()

    clock.step(34.9)
    assert a.check() is None
    clock.step(0.2)
    assert a.check() is not None
    assert b.check() is None  # a standby is never unhealthy for election reasons


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, dict[str, Any]]]:
    """The elector's lines: level, message, key/values."""
    return [(r.levelname, r.getMessage(), r.kv) for r in caplog.records  # type: ignore[attr-defined]
            if r.name == "pykcm.leaderelection"]


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_acquiring_and_standing_by_say_client_gos_lines_with_the_lock_key(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    lock = f"kube-system/{name}"
    a, b = candidate(api, clock, "host_a", name), candidate(api, clock, "host_b", name)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        assert await a.acquire(asyncio.Event())
        assert not await b.try_acquire_or_renew()
    assert said(caplog) == [
        ("INFO", "Attempting to acquire leader lease...", {"lock": lock, "identity": "host_a"}),
        ("INFO", "Successfully acquired lease", {"lock": lock, "identity": "host_a"}),
        ("INFO", "Lease is held by and has not yet expired", {"lock": lock, "holder": "host_a"}),
    ]


@pytest.mark.parametrize("verbosity", [2], indirect=True)
async def test_failed_writes_say_client_gos_lines_with_the_lock_key(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    name = unique()
    lock, path = f"kube-system/{name}", f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{name}"
    old, b, c = (candidate(api, clock, f"host_{x}", name) for x in "abc")
    assert await old.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew() and not await c.try_acquire_or_renew()
    clock.step(16)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await asyncio.gather(b.try_acquire_or_renew(), c.try_acquire_or_renew())  # one loses on a Conflict
        winner = b if b.is_leader() else c
        api._store(path, api.objects[path])  # a new resourceVersion: the winner's fast path conflicts
        assert await winner.try_acquire_or_renew()
    assert [(level, msg, list(kv)) for level, msg, kv in said(caplog)] == [
        ("ERROR", "Failed to update lease", ["lock", "err"]),
        ("INFO", "Failed to update lease optimistically, falling back to slow path", ["lock", "err"]),
    ]
    assert all(kv["lock"] == lock for _, _, kv in said(caplog))


async def test_a_failed_create_says_client_gos_line(caplog: pytest.LogCaptureFixture) -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    a = candidate(api, clock, "host_a", name := unique())
    answer = api.request

    async def refusing_creates(method: str, path: str, **kwargs: Any) -> Any:
        if method == "POST":
            raise TransportError("POST: connection refused")
        return await answer(method, path, **kwargs)

    api.request = refusing_creates  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="pykcm"):
        assert not await a.try_acquire_or_renew()
    assert said(caplog) == [("ERROR", "Error initially creating lease lock",
                             {"lock": f"kube-system/{name}", "err": "POST: connection refused"})]


@pytest.mark.parametrize(
    ("spec", "record"),
    [
        (None, LeaderElectionRecord()),
        (
            {"holderIdentity": "x", "leaseDurationSeconds": 15, "leaseTransitions": 3, "renewTime": "t"},
            LeaderElectionRecord("x", 15, None, "t", 3),
        ),
    ],
)
def test_record_from_spec(spec: dict[str, Any] | None, record: LeaderElectionRecord) -> None:
    assert LeaderElectionRecord.from_spec(spec) == record
