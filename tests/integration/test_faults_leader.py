"""Faults of the leader process: SIGSTOP past the lease (fenced writes), SIGKILL and SIGTERM, with
two `pykcm run` candidates on a control plane of its own that writes an audit log.

Each candidate authenticates as its own cluster-admin ServiceAccount, so the audit log says which
process sent each write. Timing as in test_leaderelection.py: lease 8 s, renew 5 s, retry 1 s.
"""

from __future__ import annotations

import datetime
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pykcm.client.resources import LEASES, REPLICASETS
from pykcm.client.rest import RestClient
from pykcm.testenv.cluster import running
from pykcm.testenv.controlplane import ControlPlane
from tests.faults import (
    WRITE_VERBS,
    PodSampler,
    admin_token_kubeconfig,
    audit_args,
    audit_writes,
    report,
    wait_converged,
)
from tests.integration.test_leaderelection import LEASE_DURATION, TIMING_ARGS, unique_lease
from tests.support import PykcmProcess, admin_client, create_namespace, replicaset_manifest, wait_for

pytestmark = pytest.mark.integration

CONTROLLERS = "replicaset,serviceaccount"
SCALED = 60  # pods: about 3 s of creates at pykcm's default 20 QPS


@pytest.fixture(scope="module")
def audited_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    directory = tmp_path_factory.mktemp("faults-leader-plane")
    with running(directory, apiserver_args=audit_args(directory / "audit"), log=lambda _msg: None) as plane:
        yield plane


def audit_log(plane: ControlPlane) -> Path:
    return plane.directory / "audit" / "audit.log"


@pytest.fixture
async def admin(audited_plane: ControlPlane) -> AsyncIterator[RestClient]:
    client = admin_client(audited_plane.kubeconfig)
    yield client
    await client.close()


class Contender:
    """`pykcm run` electing on `lease` as ServiceAccount kube-system/<sa>."""

    def __init__(self, kubeconfig: Path, user: str, lease: str, log_path: Path, *args: str) -> None:
        self.user = user
        self.proc = PykcmProcess(
            "--kubeconfig", str(kubeconfig), "--controllers", CONTROLLERS, "--v", "2",
            "--leader-elect=true", f"--leader-elect-resource-name={lease}", *TIMING_ARGS, *args, log_path=log_path,
        )


async def contenders(
    admin: RestClient, plane: ControlPlane, lease: str, tmp: Path, *args: str
) -> tuple[Contender, Contender]:
    """A leads (caches synced), B stands by (has seen A)."""
    made = []
    for name in ("a", "b"):
        sa = f"{lease}-{name}"
        user = await admin_token_kubeconfig(admin, plane, sa, tmp / f"{name}.kubeconfig")
        made.append(Contender(tmp / f"{name}.kubeconfig", user, lease, tmp / f"pykcm-{name}.log", *args))
        if name == "a":
            await made[0].proc.wait_for_log("Caches are synced", timeout=60)
        else:
            await made[1].proc.wait_for_log("New leader elected", timeout=60)
    return made[0], made[1]


async def lease_holder(client: RestClient, lease: str) -> str:
    return (await client.get(LEASES, lease, namespace="kube-system"))["spec"].get("holderIdentity") or ""


async def test_a_leader_frozen_past_its_lease_sends_no_write_after_it_expired_and_exits(
    audited_plane: ControlPlane, admin: RestClient, tmp_path: Path
) -> None:
    lease = unique_lease()
    namespace = await create_namespace(admin, "fence")
    # A request frozen between its last fence check and its send() (well under a millisecond of
    # Python) still goes out on waking: no fence in the client can close that. A low QPS keeps A's
    # pending creates in the rate limiter, before the check, so the freeze rarely lands there.
    a, b = await contenders(admin, audited_plane, lease, tmp_path, "--kube-api-qps=10", "--kube-api-burst=10")
    try:
        await admin.create(REPLICASETS, replicaset_manifest("web", 2), namespace=namespace)
        await wait_converged(admin, namespace, "web")
        a_identity = await lease_holder(admin, lease)

        async with PodSampler(admin, namespace, "web").running() as sampler:
            # Freeze A in the middle of a scale-up: when it wakes, its workers go on creating at once.
            await admin.patch(REPLICASETS, "web", {"spec": {"replicas": SCALED}}, namespace)
            await wait_for(lambda: _more_than(sampler, 6), 30, 0.05, "A creating pods")
            a.proc.signal(signal.SIGSTOP)
            await wait_for(lambda: _held_by_other(admin, lease, a_identity), LEASE_DURATION + 10, 0.2, "B leading")
            await wait_converged(admin, namespace, "web")  # B finished the scale-up
            a.proc.signal(signal.SIGCONT)
            resumed = time.monotonic()
            code = await a.proc.wait(30)
            exited = time.monotonic() - resumed
            await admin.patch(REPLICASETS, "web", {"spec": {"replicas": SCALED + 5}}, namespace)
            recovery = await wait_converged(admin, namespace, "web")
    finally:
        a.proc.kill()
        b.proc.kill()

    log = a.proc.log()
    assert code == 1, log[-3000:]
    assert '"Refused a write: stepping down"' in log, log[-3000:]
    assert log.strip().splitlines()[-1] == "pykcm: error: leaderelection lost"
    assert sampler.most <= SCALED + 5 and len(sampler.names) == SCALED + 5, (sampler.most, len(sampler.names))

    writes = audit_writes(audit_log(audited_plane))
    renewals = [w for w in writes if w.user == a.user and w.resource == "leases" and w.name == lease and w.code < 300]
    expired = max(w.received for w in renewals) + datetime.timedelta(seconds=LEASE_DURATION)
    late = [w for w in writes if w.user == a.user and w.verb in WRITE_VERBS and w.received >= expired]
    assert late == [], f"the old leader wrote after its lease expired at {expired}: {late}"
    assert [w for w in writes if w.user == b.user and w.resource == "pods" and w.verb == "create"]
    report("leader SIGSTOP past the lease (old leader exits)", exited)
    report("leader SIGSTOP past the lease (next scale-up by the new leader)", recovery)


async def _held_by_other(client: RestClient, lease: str, identity: str) -> bool:
    holder = await lease_holder(client, lease)
    return bool(holder) and holder != identity


async def _more_than(sampler: PodSampler, count: int) -> bool:
    return len(sampler.names) > count




@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
async def test_leader_killed_or_stopped_mid_scale_the_standby_finishes_without_extra_pods(
    audited_plane: ControlPlane, admin: RestClient, tmp_path: Path, signum: signal.Signals
) -> None:
    lease = unique_lease()
    namespace = await create_namespace(admin, "leader")
    a, b = await contenders(admin, audited_plane, lease, tmp_path)
    try:
        await admin.create(REPLICASETS, replicaset_manifest("web", 2), namespace=namespace)
        await wait_converged(admin, namespace, "web")
        async with PodSampler(admin, namespace, "web").running() as sampler:
            await admin.patch(REPLICASETS, "web", {"spec": {"replicas": SCALED}}, namespace)
            await wait_for(lambda: _more_than(sampler, 6), 30, 0.05, "A creating pods")
            a.proc.signal(signum)
            signalled = time.monotonic()
            await wait_converged(admin, namespace, "web", timeout=LEASE_DURATION + 40)
            recovery = time.monotonic() - signalled
    finally:
        a.proc.kill()
        b.proc.kill()
    assert sampler.most <= SCALED and len(sampler.names) == SCALED, (sampler.most, len(sampler.names))
    report(f"leader {signum.name} mid-scale (until the standby converged)", recovery)
