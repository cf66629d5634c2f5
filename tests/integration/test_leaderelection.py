"""Leader election between real processes on the real apiserver: pykcm with pykcm, and pykcm with
the real kube-controller-manager contending for one Lease.

Candidates use a short lease (8 s / renew 5 s / retry 1 s) so takeovers take seconds, not the
default 15-20 s; the algorithm is the same. Tests that stop the apiserver or run KCM get their
own control plane, so the session's plane stays intact for everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pykcm.client.resources import EVENTS, LEASES, PODS, REPLICASETS
from pykcm.client.rest import RestClient
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.processes import ManagedProcess
from tests.support import (
    PykcmProcess,
    admin_client,
    create_namespace,
    free_port,
    https_get,
    replicaset_manifest,
    sample,
    wait_for,
)

pytestmark = pytest.mark.integration

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 8.0, 5.0, 1.0
TIMING_ARGS = (
    f"--leader-elect-lease-duration={LEASE_DURATION:g}s",
    f"--leader-elect-renew-deadline={RENEW_DEADLINE:g}s",
    f"--leader-elect-retry-period={RETRY_PERIOD:g}s",
)
MAX_ACQUIRE_WAIT = RETRY_PERIOD * 2.2  # one jittered retry period
SLACK = 4.0  # a loaded 2-core CI machine
CONTROLLERS = "replicaset,serviceaccount"
KCM_LEASE = "kube-controller-manager"  # KCM's RBAC role may update only the Lease of this name
IDENTITY = re.compile(r'"Attempting to acquire leader lease\.\.\." .*identity="([^"]+)"')


class Candidate:
    """One `pykcm run` process electing on `lease`, serving /metrics and /healthz on its own port."""

    def __init__(self, plane: ControlPlane, lease: str, log_dir: Path, name: str) -> None:
        self.plane = plane
        self.port = free_port()
        self.proc = PykcmProcess(
            "--kubeconfig", str(plane.kubeconfig), "--controllers", CONTROLLERS, "--v", "2",
            "--leader-elect=true", f"--leader-elect-resource-name={lease}", *TIMING_ARGS,
            f"--secure-port={self.port}", "--bind-address=127.0.0.1",
            log_path=log_dir / f"pykcm-{name}.log",
        )

    async def identity(self) -> str:
        await self.proc.wait_for_log("Attempting to acquire leader lease...", timeout=60)
        match = IDENTITY.search(self.proc.log())
        assert match, self.proc.log()[-2000:]
        return match.group(1)

    async def get(self, path: str) -> tuple[int, str]:
        return await https_get(f"https://127.0.0.1:{self.port}{path}", cert=(self.plane.pki.admin_cert,
                                                                            self.plane.pki.admin_key))

    async def master_status(self, lease: str) -> float | None:
        status, text = await self.get("/metrics")
        return sample(text, "leader_election_master_status", {"name": lease}) if status == 200 else None

    async def writes(self) -> float:
        """API requests other than GET this process has made (the standby must make none)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = (await self.get("/metrics"))[1]
        return sum(
            s.value
            for family in text_string_to_metric_families(text) if family.name == "rest_client_requests"
            for s in family.samples if s.name == "rest_client_requests_total" and s.labels["method"] != "GET"
        )


@contextlib.asynccontextmanager
async def candidates(plane: ControlPlane, lease: str, log_dir: Path, count: int) -> AsyncIterator[list[Candidate]]:
    """Start `count` candidates one after another, so the first one leads; kill all at the end."""
    started: list[Candidate] = []
    try:
        for i in range(count):
            candidate = Candidate(plane, lease, log_dir, chr(ord("a") + i))
            started.append(candidate)
            if i == 0:
                await candidate.proc.wait_for_log("Successfully acquired lease", timeout=60)
            else:
                await candidate.proc.wait_for_log("New leader elected", timeout=60)  # it has seen the holder
        yield started
    finally:
        for candidate in started:
            candidate.proc.kill()


async def holder(client: RestClient, lease: str) -> dict:
    return (await client.get(LEASES, lease, namespace="kube-system"))["spec"]


async def wait_for_holder(client: RestClient, lease: str, identity: str, timeout: float) -> float:
    """Seconds until `identity` holds the lease."""
    start = time.monotonic()

    async def holds() -> bool:
        return (await holder(client, lease)).get("holderIdentity") == identity

    await wait_for(holds, timeout=timeout, interval=0.2, message=f"{identity} holding {lease}")
    return time.monotonic() - start


async def pods_of(client: RestClient, namespace: str, name: str) -> int:
    pods = await client.list(PODS, namespace, labelSelector=f"app={name}")
    return len(pods["items"])


async def wait_for_pods(client: RestClient, namespace: str, name: str, count: int, timeout: float = 30) -> None:
    async def created() -> bool:
        return await pods_of(client, namespace, name) >= count

    await wait_for(created, timeout=timeout, interval=0.3, message=f"{count} pods of {namespace}/{name}")


def unique_lease() -> str:
    return f"pykcm-le-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def client(control_plane: ControlPlane) -> AsyncIterator[RestClient]:
    client = admin_client(control_plane.kubeconfig)
    yield client
    await client.close()


# ---------------------------------------------------------------------------------------------
# pykcm and pykcm, on the session's control plane
# ---------------------------------------------------------------------------------------------


async def test_scenario_40_only_the_lease_holder_runs_controllers(
    control_plane: ControlPlane, client: RestClient, tmp_path: Path
) -> None:
    lease = unique_lease()
    async with candidates(control_plane, lease, tmp_path, 2) as (a, b):
        spec = await holder(client, lease)
        assert spec["holderIdentity"] == await a.identity()
        host, _, suffix = spec["holderIdentity"].rpartition("_")
        assert host and uuid.UUID(suffix)
        assert spec["leaseDurationSeconds"] == int(LEASE_DURATION)
        assert await a.master_status(lease) == 1
        assert await b.master_status(lease) == 0

        async def became_leader_event() -> list[dict]:
            events = await client.list(EVENTS, "kube-system", fieldSelector=f"involvedObject.name={lease}")
            return [e for e in events["items"] if e["reason"] == "LeaderElection"]

        (event,) = await wait_for(became_leader_event, timeout=10, message="LeaderElection event")
        assert event["message"] == f"{await a.identity()} became leader"
        assert event["involvedObject"]["kind"] == "Lease" and event["source"]["component"] == "pykcm"

        assert (await b.get("/healthz?verbose"))[1] == "[+]leaderElection ok\nhealthz check passed\n"
        status, body = await a.get("/healthz?verbose")
        assert status == 200 and "[+]replicaset-controller ok" in body

        namespace = await create_namespace(client, "le")
        await client.create(REPLICASETS, replicaset_manifest("web", 2), namespace=namespace)
        await wait_for_pods(client, namespace, "web", 2)

        assert await b.writes() == 0, "the standby wrote to the API"
        status, text = await b.get("/metrics")
        assert sample(text, "running_managed_controllers", {"name": "replicaset-controller"}) is None
        assert sample(text, "workqueue_adds_total", {"name": "replicaset"}) is None
        assert (await holder(client, lease))["holderIdentity"] == await a.identity()


async def test_scenario_41_killed_leader_is_replaced_after_expiry_and_work_converges(
    control_plane: ControlPlane, client: RestClient, tmp_path: Path
) -> None:
    lease = unique_lease()
    async with candidates(control_plane, lease, tmp_path, 2) as (a, b):
        transitions = (await holder(client, lease))["leaseTransitions"]
        namespace = await create_namespace(client, "le")

        a.proc.kill()
        await client.create(REPLICASETS, replicaset_manifest("pending", 2), namespace=namespace)  # nobody leads now
        waited = await wait_for_holder(client, lease, await b.identity(), LEASE_DURATION + MAX_ACQUIRE_WAIT + SLACK)

        # The standby waits for the lease to expire by its own clock (it last saw a renewal at
        # most one retry period before the kill), then takes over within one retry period.
        assert waited > LEASE_DURATION - MAX_ACQUIRE_WAIT - 1.0, waited
        assert (await holder(client, lease))["leaseTransitions"] == transitions + 1
        await wait_for_pods(client, namespace, "pending", 2)
        assert await b.master_status(lease) == 1


async def test_sigterm_releases_the_lease_and_the_standby_leads_within_seconds(
    control_plane: ControlPlane, client: RestClient, tmp_path: Path
) -> None:
    lease = unique_lease()
    async with candidates(control_plane, lease, tmp_path, 2) as (a, b):
        transitions = (await holder(client, lease))["leaseTransitions"]

        a.proc.signal(signal.SIGTERM)
        waited = await wait_for_holder(client, lease, await b.identity(), LEASE_DURATION)

        assert waited < MAX_ACQUIRE_WAIT + 2.0, f"standby took {waited:.1f}s after a release"
        assert await a.proc.wait(30) == 0, a.proc.log()[-2000:]
        assert '"Released leader lease"' in a.proc.log()
        assert (await holder(client, lease))["leaseTransitions"] == transitions + 1
        namespace = await create_namespace(client, "le")
        await client.create(REPLICASETS, replicaset_manifest("after", 1), namespace=namespace)
        await wait_for_pods(client, namespace, "after", 1)


# ---------------------------------------------------------------------------------------------
# destructive tests, on a control plane of their own
# ---------------------------------------------------------------------------------------------


class LeaderSampler:
    """Polls both contenders' leader_election_master_status; records any moment both claim to lead."""

    def __init__(self, plane: ControlPlane, lease: str) -> None:
        self.plane = plane
        self.lease = lease
        self.pykcm: Candidate | None = None
        self.kcm: ManagedProcess | None = None
        self.samples: list[tuple[float, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def _kcm_status(self) -> float:
        if self.kcm is None or not self.kcm.alive():
            return 0.0
        url = f"https://127.0.0.1:{self.kcm.port}/metrics"
        with contextlib.suppress(Exception):
            status, text = await https_get(url, cert=(self.plane.pki.admin_cert, self.plane.pki.admin_key))
            if status == 200:
                return sample(text, "leader_election_master_status", {"name": self.lease}) or 0.0
        return 0.0

    async def _pykcm_status(self) -> float:
        if self.pykcm is None or self.pykcm.proc.proc.poll() is not None:
            return 0.0
        with contextlib.suppress(Exception):
            return await self.pykcm.master_status(self.lease) or 0.0
        return 0.0

    async def _run(self) -> None:
        while True:
            self.samples.append((await self._pykcm_status(), await self._kcm_status()))
            await asyncio.sleep(0.25)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def both_led(self) -> list[tuple[float, float]]:
        return [s for s in self.samples if s == (1.0, 1.0)]


@pytest.mark.kcm
async def test_scenario_42_pykcm_and_kube_controller_manager_never_lead_together(
    own_plane: ControlPlane, own_client: RestClient, tmp_path: Path
) -> None:
    kcm_args = [
        "--leader-elect=true", f"--leader-elect-resource-name={KCM_LEASE}",
        "--leader-elect-resource-namespace=kube-system", *TIMING_ARGS,
        # As in a real cluster: the replicaset controller acts as its own ServiceAccount, which
        # RBAC lets manage pods (system:kube-controller-manager itself may not).
        "--use-service-account-credentials=true",
    ]
    sampler = LeaderSampler(own_plane, KCM_LEASE)
    first = Candidate(own_plane, KCM_LEASE, tmp_path, "first")
    second: Candidate | None = None
    kcm: ManagedProcess | None = None
    try:
        await first.proc.wait_for_log("Successfully acquired lease", timeout=60)
        sampler.pykcm = first
        kcm = await asyncio.to_thread(own_plane.start_kcm, CONTROLLERS, kcm_args)
        sampler.kcm = kcm
        sampler.start()
        namespace = await create_namespace(own_client, "le-kcm")

        # pykcm leads, KCM stands by.
        await wait_for(lambda: sampler_has(sampler, (1.0, 0.0)), timeout=20, message="pykcm leading, KCM standby")
        assert (await holder(own_client, KCM_LEASE))["holderIdentity"] == await first.identity()

        # Kill pykcm: KCM takes over once the lease expires and does the work.
        first.proc.kill()
        kcm_identity = await wait_for(
            lambda: new_holder(own_client, {await_identity(first)}),
            timeout=LEASE_DURATION + MAX_ACQUIRE_WAIT + SLACK + 5, interval=0.2, message="KCM taking over",
        )
        await own_client.create(REPLICASETS, replicaset_manifest("by-kcm", 1), namespace=namespace)
        await wait_for_pods(own_client, namespace, "by-kcm", 1)
        await wait_for(lambda: sampler_has(sampler, (0.0, 1.0)), timeout=10, message="KCM leading")

        # A new pykcm stands by; stop KCM (it does not release): pykcm takes over after expiry.
        second = Candidate(own_plane, KCM_LEASE, tmp_path, "second")
        await second.proc.wait_for_log("New leader elected", timeout=60)
        sampler.pykcm = second
        assert await second.master_status(KCM_LEASE) == 0
        assert await second.writes() == 0
        await asyncio.to_thread(own_plane.stop_kcm, kcm)
        takeover = LEASE_DURATION + MAX_ACQUIRE_WAIT + SLACK
        await wait_for_holder(own_client, KCM_LEASE, await second.identity(), takeover)
        assert kcm_identity != await second.identity()
        await own_client.create(REPLICASETS, replicaset_manifest("by-pykcm", 1), namespace=namespace)
        await wait_for_pods(own_client, namespace, "by-pykcm", 1)
    finally:
        await sampler.stop()
        first.proc.kill()
        if second is not None:
            second.proc.kill()
        if kcm is not None and kcm.alive():
            await asyncio.to_thread(own_plane.stop_kcm, kcm)

    assert sampler.both_led() == [], "pykcm and KCM both reported leading at the same time"
    assert len(sampler.samples) > 20


def await_identity(candidate: Candidate) -> str:
    """The identity a candidate logged (read synchronously: the process may be dead by now)."""
    match = IDENTITY.search(candidate.proc.log())
    assert match
    return match.group(1)


async def new_holder(client: RestClient, previous: set[str]) -> str | None:
    identity = (await holder(client, KCM_LEASE)).get("holderIdentity")
    return identity if identity and identity not in previous else None


async def sampler_has(sampler: LeaderSampler, wanted: tuple[float, float]) -> bool:
    return bool(sampler.samples) and sampler.samples[-1] == wanted


async def test_scenario_41_leader_that_cannot_renew_exits_non_zero(
    own_plane: ControlPlane, own_client: RestClient, tmp_path: Path
) -> None:
    lease = unique_lease()
    leader = Candidate(own_plane, lease, tmp_path, "leader")
    try:
        await leader.proc.wait_for_log("Caches are synced", timeout=60)
        await asyncio.to_thread(own_plane.stop_apiserver)
        stopped = time.monotonic()
        code = await leader.proc.wait(RENEW_DEADLINE + RETRY_PERIOD + 20)
        elapsed = time.monotonic() - stopped
    finally:
        leader.proc.kill()
        await asyncio.to_thread(own_plane.start_apiserver)

    log = leader.proc.log()
    assert code == 1, log[-2000:]
    assert elapsed < RENEW_DEADLINE + RETRY_PERIOD + SLACK + 2, elapsed
    assert '"Failed to renew lease"' in log and '"leaderelection lost/stopped"' in log
    assert log.strip().splitlines()[-1] == "pykcm: error: leaderelection lost"
    # It did not release: a successor must wait for the lease to expire.
    assert (await holder(own_client, lease))["holderIdentity"] == await_identity(leader)
