"""Faults of the leader process: SIGSTOP past the lease (fenced writes), SIGKILL and SIGTERM, with
two `pykcm run` candidates on a control plane of its own that writes an audit log.

Each candidate authenticates as its own cluster-admin ServiceAccount, so the audit log says which
process sent each write. Timing as in test_leaderelection.py: lease 8 s, renew 5 s, retry 1 s.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pykcm.client.resources import CONFIGMAPS, LEASES, REPLICASETS
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
    converged,
    report,
    wait_converged,
)
from tests.integration.test_leaderelection import LEASE_DURATION, TIMING_ARGS, unique_lease
from tests.loop_stall import BUSY_SLICE, install_loop_stall, stall_configmap
from tests.support import PykcmProcess, admin_client, create_namespace, replicaset_manifest, wait_for

pytestmark = pytest.mark.integration

CONTROLLERS = "replicaset,serviceaccount"
SCALED = 60  # pods: about 3 s of creates at pykcm's default 20 QPS
FROZEN_SCALE = 20  # pods the new leader creates while the old one is frozen
QUIET = 1.0  # seconds without a write but renewals: the leader has nothing in flight
FREEZE_AFTER_RENEWAL = 0.3  # of the 1 s retry period: mid-sleep, neither renewing nor about to
WEDGE = 20.0  # seconds the loop is blocked: past the heartbeat bound, the renew deadline and the lease
BUSY = 16.0  # seconds of BUSY_SLICE blocks: two lease durations
STALLING = f"{CONTROLLERS},loop-stall"  # A's controllers in the event-loop tests


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

    def __init__(
        self, kubeconfig: Path, user: str, lease: str, log_path: Path, controllers: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.user = user
        self.proc = PykcmProcess(
            "--kubeconfig", str(kubeconfig), "--controllers", controllers, "--v", "2",
            "--leader-elect=true", f"--leader-elect-resource-name={lease}", *TIMING_ARGS, log_path=log_path, env=env,
        )


async def contenders(
    admin: RestClient, plane: ControlPlane, lease: str, tmp: Path, b_controllers: str = CONTROLLERS,
    a_controllers: str = CONTROLLERS, env: dict[str, str] | None = None,
) -> tuple[Contender, Contender]:
    """A leads (caches synced), B stands by (has seen A)."""
    made = []
    for name, controllers in (("a", a_controllers), ("b", b_controllers)):
        sa = f"{lease}-{name}"
        user = await admin_token_kubeconfig(admin, plane, sa, tmp / f"{name}.kubeconfig")
        log_path = tmp / f"pykcm-{name}.log"
        made.append(Contender(tmp / f"{name}.kubeconfig", user, lease, log_path, controllers, env))
        if name == "a":
            await made[0].proc.wait_for_log("Caches are synced", timeout=60)
        else:
            await made[1].proc.wait_for_log("New leader elected", timeout=60)
    return made[0], made[1]


async def lease_holder(client: RestClient, lease: str) -> str:
    return (await client.get(LEASES, lease, namespace="kube-system"))["spec"].get("holderIdentity") or ""


def is_renewal(write: AuditWrite, user: str, lease: str) -> bool:
    return write.user == user and write.resource == "leases" and write.name == lease


def assert_no_write_after_expiry(plane: ControlPlane, leader: Contender, lease: str) -> None:
    """No write of `leader` reached the apiserver once its last successful renewal plus the lease
    duration had passed (by the apiserver's receive times in the audit log)."""
    writes = audit_writes(audit_log(plane))
    renewals = [w for w in writes if is_renewal(w, leader.user, lease) and w.code < 300]
    expired = max(w.received for w in renewals) + datetime.timedelta(seconds=LEASE_DURATION)
    late = [w for w in writes if w.user == leader.user and w.verb in WRITE_VERBS and w.received >= expired]
    assert late == [], f"the old leader wrote after its lease expired at {expired}: {late}"


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

    assert_no_write_after_expiry(audited_plane, a, lease)
    writes = audit_writes(audit_log(audited_plane))
    assert [w for w in writes if w.user == b.user and w.resource == "pods" and w.verb == "create"]
    report("leader SIGSTOP past the lease (old leader exits)", exited)
    report("leader SIGSTOP past the lease (next scale-up by the new leader)", recovery)


@pytest.fixture(scope="module")
def loop_stall_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a pykcm that has the loop-stall test plugin (tests/loop_stall.py)."""
    plugin = install_loop_stall(tmp_path_factory.mktemp("loop-stall-plugin"))
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(plugin), os.environ.get("PYTHONPATH")]))}


async def test_a_leader_whose_event_loop_is_wedged_loses_the_lease_and_exits(
    audited_plane: ControlPlane, admin: RestClient, tmp_path: Path, loop_stall_env: dict[str, str]
) -> None:
    """The lease thread alone would keep renewing for a process that does nothing; the heartbeat
    makes it stop, so the standby leads while A is still wedged, and A exits when it wakes."""
    lease, namespace = unique_lease(), await create_namespace(admin, "wedged")
    a, b = await contenders(admin, audited_plane, lease, tmp_path, a_controllers=STALLING, env=loop_stall_env)
    try:
        a_identity = await lease_holder(admin, lease)
        await admin.create(CONFIGMAPS, stall_configmap(lease, "wedge", WEDGE), namespace=namespace)
        await a.proc.wait_for_log('"Loop stall starts"', 30)
        wedged = time.monotonic()
        await wait_for(lambda: _held_by_other(admin, lease, a_identity), WEDGE, 0.2, "B leading while A is wedged")
        took_over = time.monotonic() - wedged
        assert '"Loop stall done"' not in a.proc.log(), "B led only once A's loop ran again"
        code = await a.proc.wait(WEDGE + 30)
    finally:
        a.proc.kill()
        b.proc.kill()
    log = a.proc.log()
    assert code == 1, log[-3000:]
    assert '"Not renewing lease"' in log and "event loop has not run" in log, log[-3000:]
    # The watch thread names the plugin's sync that blocked the loop (pykcm/app/looplag.py).
    assert '"Event loop blocked"' in log and 'at="loop_stall.py:' in log, log[-3000:]
    assert " in LoopStallController.sync" in log and 'state="waiting"' in log, log[-3000:]
    assert log.strip().splitlines()[-1] == "pykcm: error: leaderelection lost"
    assert_no_write_after_expiry(audited_plane, a, lease)
    report(f"leader's event loop wedged {WEDGE:g}s (until the standby leads)", took_over)


async def test_a_leader_whose_event_loop_is_only_busy_keeps_the_lease(
    audited_plane: ControlPlane, admin: RestClient, tmp_path: Path, loop_stall_env: dict[str, str]
) -> None:
    """Blocked 1.5 s at a time for two lease durations, the loop still ticks within the heartbeat
    bound: A keeps renewing and leading, and scales a ReplicaSet (slowly: each reply waits for a gap)."""
    lease, namespace = unique_lease(), await create_namespace(admin, "busy")
    a, b = await contenders(admin, audited_plane, lease, tmp_path, a_controllers=STALLING, env=loop_stall_env)
    try:
        a_identity = await lease_holder(admin, lease)
        await admin.create(REPLICASETS, replicaset_manifest("web", 2), namespace=namespace)
        await wait_converged(admin, namespace, "web")
        await admin.create(CONFIGMAPS, stall_configmap(lease, "busy", BUSY), namespace=namespace)
        await a.proc.wait_for_log('"Loop stall starts"', 30)
        await admin.patch(REPLICASETS, "web", {"spec": {"replicas": 10}}, namespace)
        scaled = time.monotonic()
        holders, converged_after = set(), None
        while '"Loop stall done"' not in a.proc.log():
            assert time.monotonic() - scaled < BUSY + 30, "the busy stall did not end"
            holders.add(await lease_holder(admin, lease))
            if converged_after is None and await converged(admin, namespace, "web"):
                converged_after = time.monotonic() - scaled
            await asyncio.sleep(0.2)
        holders.add(await lease_holder(admin, lease))
        if converged_after is None:  # each reply waits for the next gap between blocks: allowed to be slow
            await wait_converged(admin, namespace, "web")
            converged_after = time.monotonic() - scaled
        alive = a.proc.proc.poll() is None
    finally:
        a.proc.kill()
        b.proc.kill()
    assert holders == {a_identity}, holders
    assert alive, a.proc.log()[-3000:]
    assert '"Not renewing lease"' not in a.proc.log()
    assert '"Successfully acquired lease"' not in b.proc.log()
    writes = audit_writes(audit_log(audited_plane))
    assert len([w for w in writes if w.user == a.user and w.resource == "pods" and w.namespace == namespace]) == 10
    report(f"leader's event loop busy {BUSY:g}s in {BUSY_SLICE:g}s blocks (scale-up to 10)",
           converged_after)


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
