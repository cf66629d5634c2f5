"""Faults of the leader process: SIGSTOP past the lease (fenced writes), SIGKILL and SIGTERM, with
two `pykcm run` candidates on a control plane of its own that writes an audit log.

Each candidate authenticates as its own cluster-admin ServiceAccount, so the audit log says which
process sent each write. Timing as in test_leaderelection.py: lease 8 s, renew 5 s, retry 1 s.
"""

from __future__ import annotations

import asyncio
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
    AuditWrite,
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
FROZEN_SCALE = 20  # pods the new leader creates while the old one is frozen
QUIET = 1.0  # seconds without a write but renewals: the leader has nothing in flight
FREEZE_AFTER_RENEWAL = 0.3  # of the 1 s retry period: mid-sleep, neither renewing nor about to


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

    def __init__(self, kubeconfig: Path, user: str, lease: str, log_path: Path, controllers: str) -> None:
        self.user = user
        self.proc = PykcmProcess(
            "--kubeconfig", str(kubeconfig), "--controllers", controllers, "--v", "2",
            "--leader-elect=true", f"--leader-elect-resource-name={lease}", *TIMING_ARGS, log_path=log_path,
        )


async def contenders(
    admin: RestClient, plane: ControlPlane, lease: str, tmp: Path, b_controllers: str = CONTROLLERS
) -> tuple[Contender, Contender]:
    """A leads (caches synced), B stands by (has seen A)."""
    made = []
    for name, controllers in (("a", CONTROLLERS), ("b", b_controllers)):
        sa = f"{lease}-{name}"
        user = await admin_token_kubeconfig(admin, plane, sa, tmp / f"{name}.kubeconfig")
        made.append(Contender(tmp / f"{name}.kubeconfig", user, lease, tmp / f"pykcm-{name}.log", controllers))
        if name == "a":
            await made[0].proc.wait_for_log("Caches are synced", timeout=60)
        else:
            await made[1].proc.wait_for_log("New leader elected", timeout=60)
    return made[0], made[1]


async def lease_holder(client: RestClient, lease: str) -> str:
    return (await client.get(LEASES, lease, namespace="kube-system"))["spec"].get("holderIdentity") or ""


def is_renewal(write: AuditWrite, user: str, lease: str) -> bool:
    return write.user == user and write.resource == "leases" and write.name == lease


async def freeze_when_idle(contender: Contender, log: Path, lease: str) -> None:
    """SIGSTOP the leader with nothing in flight: it has sent no write but renewals for a second,
    and its lease thread renewed just now, so it sleeps for most of a retry period.

    Nothing then sits between a fence check and the socket when it freezes (that window is
    microseconds wide but not empty, see the README), and its lease thread wakes up between
    renewals, so the first thing that notices the lost lease is deterministic: the fence.
    """
    seen = -1

    async def just_renewed_and_idle() -> bool:
        nonlocal seen
        writes = audit_writes(log)
        renewals = [w for w in writes if is_renewal(w, contender.user, lease) and w.code < 300]
        fresh, seen = seen >= 0 and len(renewals) > seen, len(renewals)
        others = [w.received for w in writes if w.user == contender.user and not is_renewal(w, contender.user, lease)]
        quiet_since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=QUIET)
        return fresh and (not others or max(others) < quiet_since)

    await wait_for(just_renewed_and_idle, 60, 0.05, "the leader idle, just after a renewal")
    await asyncio.sleep(FREEZE_AFTER_RENEWAL)
    contender.proc.signal(signal.SIGSTOP)


async def test_a_leader_frozen_past_its_lease_sends_no_write_after_it_expired_and_exits(
    audited_plane: ControlPlane, admin: RestClient, tmp_path: Path
) -> None:
    lease = unique_lease()
    namespace = await create_namespace(admin, "fence")
    # B runs no ServiceAccount controller: the ServiceAccount that a namespace created during the
    # freeze needs is a write only A will attempt when it wakes, whatever B has done by then.
    a, b = await contenders(admin, audited_plane, lease, tmp_path, b_controllers="replicaset")
    try:
        await admin.create(REPLICASETS, replicaset_manifest("web", 2), namespace=namespace)
        await wait_converged(admin, namespace, "web")
        a_identity = await lease_holder(admin, lease)
        async with PodSampler(admin, namespace, "web").running() as sampler:
            await freeze_when_idle(a, audit_log(audited_plane), lease)
            await wait_for(lambda: _held_by_other(admin, lease, a_identity), LEASE_DURATION + 10, 0.2, "B leading")
            # Work for A's watches to deliver when it wakes: a namespace owed a ServiceAccount, a scale-up.
            await create_namespace(admin, "fence-owed", service_account=False)
            await admin.patch(REPLICASETS, "web", {"spec": {"replicas": FROZEN_SCALE}}, namespace)
            await wait_converged(admin, namespace, "web")  # B scaled up
            a.proc.signal(signal.SIGCONT)
            resumed = time.monotonic()
            code = await a.proc.wait(30)
            exited = time.monotonic() - resumed
            await admin.patch(REPLICASETS, "web", {"spec": {"replicas": FROZEN_SCALE + 5}}, namespace)
            recovery = await wait_converged(admin, namespace, "web")
    finally:
        a.proc.kill()
        b.proc.kill()

    log = a.proc.log()
    assert code == 1, log[-3000:]
    # The fence, not the renew loop (which gives up only after the renew deadline), noticed first.
    assert '"Refused a write: stepping down"' in log, log[-3000:]
    assert log.strip().splitlines()[-1] == "pykcm: error: leaderelection lost"
    wanted = FROZEN_SCALE + 5
    assert sampler.most <= wanted and len(sampler.names) == wanted, (sampler.most, len(sampler.names))

    writes = audit_writes(audit_log(audited_plane))
    renewals = [w for w in writes if is_renewal(w, a.user, lease) and w.code < 300]
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
