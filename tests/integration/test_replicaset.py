"""The ReplicaSet controller against the real kube-apiserver, scenarios 1-13: which pods it owns,
replaces and deletes first.

pykcm runs in-process (`running_manager`, only the replicaset controller). There is no
kubelet: the tests bind pods to (nonexistent) nodes and write pod status themselves.
Scenario 8 drives `sync` directly over a hand-made cache while the API is real.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest

from pykcm.client.resources import CONFIGMAPS, PODS, REPLICASETS
from pykcm.client.rest import MERGE_PATCH
from tests.integration.replicaset_support import (
    RS_CONTROLLER,
    CreateSpy,
    bind,
    cached,
    create_pod,
    create_rs,
    events_for,
    hand_fed_controller,
    make_ready,
    owned,
    owner_uid,
    pods,
    rs_controller,
    scale,
    set_pod_status,
    stays,
    wait_owned,
    wait_status,
)
from tests.support import ControllerSpy, wait_for

pytestmark = pytest.mark.integration


# -- scenarios --------------------------------------------------------------------------------------


async def test_scenario_01_foreign_controlled_pod_ignored(api, ns, pykcm):
    foreign_ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "other", "uid": str(uuid.uuid4()),
                   "controller": True}
    foreign = await create_pod(api, ns, "foreign", {"app": "web"}, ownerReferences=[foreign_ref])
    await cached(rs_controller(pykcm), ns, "foreign")
    rs = await create_rs(api, ns, "web", 2)
    await wait_owned(api, ns, rs, 2)
    await wait_status(api, ns, "web", replicas=2)
    after = await api.get(PODS, "foreign", ns)
    assert after["metadata"]["resourceVersion"] == foreign["metadata"]["resourceVersion"]  # never patched
    assert len(await pods(api, ns)) == 3


async def test_scenario_03_deleted_pod_replaced_with_event(api, ns, pykcm):
    rs = await create_rs(api, ns, "web", 3)
    first = await wait_owned(api, ns, rs, 3)
    victim = first[0]["metadata"]["name"]
    await api.delete(PODS, victim, ns)  # unscheduled: gone at once
    now = await wait_owned(api, ns, rs, 3)
    new_names = {p["metadata"]["name"] for p in now} - {p["metadata"]["name"] for p in first}
    assert len(new_names) == 1 and victim not in {p["metadata"]["name"] for p in now}
    (new,) = new_names

    async def event_seen() -> bool:
        return any(e["reason"] == "SuccessfulCreate" and e["message"] == f"Created pod: {new}" and e["type"] == "Normal"
                   and e["source"]["component"] == RS_CONTROLLER for e in await events_for(api, ns, "web"))

    await wait_for(event_seen, 15, message="SuccessfulCreate event")


async def test_scenario_04_relabelled_pod_released_and_replaced(api, ns, pykcm):
    rs = await create_rs(api, ns, "web", 1)
    (pod,) = await wait_owned(api, ns, rs, 1)
    name = pod["metadata"]["name"]
    await api.patch(PODS, name, {"metadata": {"labels": {"app": "detached"}}}, ns, content_type=MERGE_PATCH)

    async def released() -> bool:
        return owner_uid(await api.get(PODS, name, ns)) is None

    await wait_for(released, 15, message="ownerReference removed")
    (replacement,) = await wait_owned(api, ns, rs, 1)
    assert replacement["metadata"]["name"] != name
    assert (await api.get(PODS, name, ns))["metadata"].get("deletionTimestamp") is None  # keeps running


async def test_scenario_05_orphan_adopted_nothing_created(api, ns, pykcm):
    await create_pod(api, ns, "orphan", {"app": "web"})
    await cached(rs_controller(pykcm), ns, "orphan")
    rs = await create_rs(api, ns, "web", 1)
    (pod,) = await wait_owned(api, ns, rs, 1)
    assert pod["metadata"]["name"] == "orphan"
    (ref,) = pod["metadata"]["ownerReferences"]
    assert ref == {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": rs["metadata"]["uid"],
                   "controller": True, "blockOwnerDeletion": True}
    await wait_status(api, ns, "web", replicas=1)
    assert len(await pods(api, ns)) == 1


async def test_scenario_06_terminating_orphan_not_adopted(api, ns, pykcm):
    await create_pod(api, ns, "dying", {"app": "web"}, finalizers=["example.com/hold"])
    await api.delete(PODS, "dying", ns)  # the finalizer keeps it, with deletionTimestamp

    async def terminating_cached() -> bool:
        pod = rs_controller(pykcm).pods.indexer.get_by(ns, "dying")
        return pod is not None and pod["metadata"].get("deletionTimestamp") is not None

    await wait_for(terminating_cached, 15, 0.05, "terminating pod cached")
    rs = await create_rs(api, ns, "web", 1)
    await wait_owned(api, ns, rs, 1)
    await wait_status(api, ns, "web", replicas=1)
    dying = await api.get(PODS, "dying", ns)
    assert owner_uid(dying) is None


async def test_scenario_07_deleting_rs_touches_no_pods_but_writes_status(api, ns, pykcm):
    rs = await create_rs(api, ns, "web", 2, metadata={"finalizers": ["example.com/hold"]})
    two = await wait_owned(api, ns, rs, 2)
    await wait_status(api, ns, "web", replicas=2)
    await api.delete(REPLICASETS, "web", ns)  # deletionTimestamp set, kept by the finalizer
    await create_pod(api, ns, "orphan", {"app": "web"})
    relabelled = two[0]["metadata"]["name"]
    await api.patch(PODS, relabelled, {"metadata": {"labels": {"app": "gone"}}}, ns, content_type=MERGE_PATCH)
    # Status still follows the pods: the relabelled pod no longer counts.
    await wait_status(api, ns, "web", replicas=1)

    async def untouched() -> bool:
        orphan, moved = await api.get(PODS, "orphan", ns), await api.get(PODS, relabelled, ns)
        return owner_uid(orphan) is None and owner_uid(moved) == rs["metadata"]["uid"] and len(await pods(api, ns)) == 3

    await stays(untouched, 2.0)
    await api.patch(REPLICASETS, "web", {"metadata": {"finalizers": None}}, ns, content_type=MERGE_PATCH)


async def test_scenario_08_uid_changed_between_cache_and_adoption(api, ns, control_plane):
    old = await create_rs(api, ns, "web", 1)
    orphan = await create_pod(api, ns, "orphan", {"app": "web"})
    async with hand_fed_controller(api) as ctrl:
        ctrl.replica_sets.indexer.upsert(old)
        ctrl.pods.indexer.upsert(orphan)
        # Deleted and recreated after our cache read.
        await api.delete(REPLICASETS, "web", ns)
        await create_rs(api, ns, "web", 1)
        key = f"{ns}/web"
        spy = ControllerSpy(ctrl)
        await ctrl._process(key)  # the worker's path: an error means a rate-limited requeue
        assert spy.rate_limited == [key] and ctrl.queue.num_requeues(key) == 1
        assert spy.outcomes(key)[0].startswith("error can't adopt Pod")
        with pytest.raises(Exception, match=r"is gone: got uid .+, wanted " + old["metadata"]["uid"]):
            await ctrl.sync(key)
        assert owner_uid(await api.get(PODS, "orphan", ns)) is None
        assert await api.list(PODS, ns) and len(await pods(api, ns)) == 1  # nothing created either


async def test_scenario_09_graceful_delete_replaced_and_counted_terminating(api, ns, pykcm):
    rs = await create_rs(api, ns, "web", 1)
    (pod,) = await wait_owned(api, ns, rs, 1)
    name = pod["metadata"]["name"]
    await make_ready(api, ns, pod)
    await wait_status(api, ns, "web", replicas=1, readyReplicas=1)
    await api.delete(PODS, name, ns)  # bound: graceful, stays with deletionTimestamp (no kubelet)
    (replacement,) = await wait_owned(api, ns, rs, 1)
    assert replacement["metadata"]["name"] != name
    status = await wait_status(api, ns, "web", replicas=1, terminatingReplicas=1, readyReplicas=0)
    assert status["terminatingReplicas"] == 1
    assert (await api.get(PODS, name, ns))["metadata"]["deletionTimestamp"]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
async def test_scenario_10_finished_pod_replaced_not_deleted(api, ns, pykcm, phase):
    rs = await create_rs(api, ns, "web", 1)
    (pod,) = await wait_owned(api, ns, rs, 1)
    name = pod["metadata"]["name"]
    await bind(api, ns, name, "node-a")
    await set_pod_status(api, ns, name, phase)

    async def replaced() -> bool:
        live = [p for p in await owned(api, ns, rs) if p["status"].get("phase") not in ("Succeeded", "Failed")]
        return len(live) == 1 and live[0]["metadata"]["name"] != name

    await wait_for(replaced, 15, message="replacement")
    await wait_status(api, ns, "web", replicas=1)
    finished = await api.get(PODS, name, ns)
    assert finished["metadata"].get("deletionTimestamp") is None


async def test_scenario_11_scale_down_prefers_unscheduled_pending_not_ready(api, ns, pykcm):
    rs = await create_rs(api, ns, "web", 5)
    five = sorted(await wait_owned(api, ns, rs, 5), key=lambda p: p["metadata"]["name"])
    unscheduled, pending, not_ready, ready_1, ready_2 = (p["metadata"]["name"] for p in five)
    await bind(api, ns, pending, "node-a")
    await bind(api, ns, not_ready, "node-a")
    await set_pod_status(api, ns, not_ready, "Running", ready=False)
    for pod in five[3:]:
        await make_ready(api, ns, pod)
    await wait_status(api, ns, "web", replicas=5, readyReplicas=2)
    await scale(api, ns, "web", 2)
    survivors = await wait_owned(api, ns, rs, 2)
    assert {p["metadata"]["name"] for p in survivors} == {ready_1, ready_2}
    del unscheduled


async def test_scenario_12_pod_deletion_cost(api, ns, pykcm):
    rs = await create_rs(api, ns, "web", 2)
    two = await wait_owned(api, ns, rs, 2)
    for pod, cost in zip(two, ("100", "-10"), strict=True):
        await make_ready(api, ns, pod)
        await api.patch(PODS, pod["metadata"]["name"], {"metadata": {"annotations": {
            "controller.kubernetes.io/pod-deletion-cost": cost}}}, ns, content_type=MERGE_PATCH)
    await wait_status(api, ns, "web", readyReplicas=2)
    await scale(api, ns, "web", 1)
    (survivor,) = await wait_owned(api, ns, rs, 1)
    assert survivor["metadata"]["name"] == two[0]["metadata"]["name"]


async def test_scenario_13_colocated_pods_deleted_first(api, ns, pykcm):
    # 1.36 ranks co-location only among ReplicaSets sharing a controller (a Deployment's), so the
    # ReplicaSet gets one; any object will do as there is no garbage collector here.
    owner = await api.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}},
                             namespace=ns)
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"],
           "controller": True}
    rs = await create_rs(api, ns, "web", 3, metadata={"ownerReferences": [ref]})
    three = await wait_owned(api, ns, rs, 3)
    since = time.time() - 3600
    for pod, node in zip(three, ("node-a", "node-a", "node-b"), strict=True):
        await make_ready(api, ns, pod, node, since=since)
    await wait_status(api, ns, "web", readyReplicas=3)
    await scale(api, ns, "web", 2)
    survivors = await wait_owned(api, ns, rs, 2)
    assert sorted(p["spec"]["nodeName"] for p in survivors) == ["node-a", "node-b"]



async def test_scenario_02_burst_of_500_and_no_over_creation_across_apiserver_restart(
    api, ns, pykcm, control_plane
):
    """0 -> 600 with the apiserver restarted mid-way: creates come at most 500 per sync, and the
    number of live owned pods, sampled all along, never exceeds spec.replicas and converges."""
    key = f"{ns}/web"
    creates = CreateSpy(rs_controller(pykcm), key)
    rs = await create_rs(api, ns, "web", 0)
    await wait_status(api, ns, "web", observedGeneration=1)
    samples: list[int] = []
    restarted = asyncio.Event()
    at_restart: list[int] = []

    async def sample_until_converged() -> None:
        while True:
            with contextlib.suppress(Exception):  # the apiserver is down for a while
                count = len(await owned(api, ns, rs))
                samples.append(count)
                if count >= 100 and not restarted.is_set():
                    restarted.set()
                    at_restart.append(count)
                    await asyncio.to_thread(control_plane.restart_apiserver)
                if count == 600 and restarted.is_set():
                    return
            await asyncio.sleep(0.2)

    await scale(api, ns, "web", 600)
    await asyncio.wait_for(sample_until_converged(), 150)
    await wait_status(api, ns, "web", 60, replicas=600)
    print(f"restart at {at_restart}, samples {len(samples)}, per-sync creates {creates.creating_syncs()}, "
          f"failed creates {len(creates.errors)}")
    assert at_restart[0] < 600  # the restart really happened mid-way
    assert max(samples) <= 600, f"over-created: {max(samples)}"
    assert len(await owned(api, ns, rs)) == 600
    assert max(creates.per_sync) <= 500
    assert creates.total <= 600  # no create ever succeeded for a pod that was not needed
