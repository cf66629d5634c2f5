"""The ReplicaSet controller against the real kube-apiserver, scenario by scenario (1-25).

pykcm runs in-process (`running_manager`, only the replicaset controller). There is no
kubelet: the tests bind pods to (nonexistent) nodes and write pod status themselves.
Scenarios 8 and 17 drive `sync` directly over a hand-made cache while the API is real.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pykcm.app.manager import Manager
from pykcm.app.options import Options
from pykcm.client.errors import NAMESPACE_TERMINATING_CAUSE, ApiError, NotFound
from pykcm.client.events import EventRecorder
from pykcm.client.resources import CONFIGMAPS, EVENTS, NAMESPACES, PODS, REPLICASETS, RESOURCEQUOTAS
from pykcm.client.rest import MERGE_PATCH, RestClient
from pykcm.controller import ControllerContext
from pykcm.controller.expectations import EXPECTATIONS_TIMEOUT, ControllerExpectations
from pykcm.controllers.replicaset import ReplicaSetController
from pykcm.informers.factory import SharedInformerFactory
from pykcm.informers.store import object_key
from pykcm.util.apitime import format_time
from tests.support import (
    PAUSE_IMAGE,
    ControllerSpy,
    admin_client,
    controller_of,
    create_namespace,
    replicaset_manifest,
    running_manager,
    wait_for,
)

pytestmark = pytest.mark.integration

RS_CONTROLLER = "replicaset-controller"


# -- fixtures and helpers ---------------------------------------------------------------------------


@pytest.fixture
async def api(control_plane) -> AsyncIterator[RestClient]:
    client = admin_client(control_plane.kubeconfig)
    yield client
    await client.close()


@pytest.fixture
async def ns(api: RestClient) -> AsyncIterator[str]:
    name = await create_namespace(api, "rs")
    yield name
    await clean_namespace(api, name)


@pytest.fixture
async def pykcm(control_plane) -> AsyncIterator[Manager]:
    async with running_manager(control_plane.kubeconfig, controllers="replicaset", kube_api_qps=1000,
                               kube_api_burst=1000) as manager:
        yield manager


def rs_controller(manager: Manager) -> ReplicaSetController:
    ctrl = controller_of(manager, RS_CONTROLLER)
    assert isinstance(ctrl, ReplicaSetController)
    return ctrl


async def clean_namespace(api: RestClient, ns: str) -> None:
    """Leave nothing for later managers to sync: RSs gone, pods gone (finalizers dropped first)."""
    with contextlib.suppress(NotFound):
        await api.delete_collection(REPLICASETS, ns)
        for pod in (await api.list(PODS, ns))["items"]:
            if pod["metadata"].get("finalizers"):
                with contextlib.suppress(NotFound):
                    await api.patch(PODS, pod["metadata"]["name"], {"metadata": {"finalizers": None}}, ns,
                                    content_type=MERGE_PATCH)
        await api.delete_collection(PODS, ns, body={"gracePeriodSeconds": 0})
        await api.delete(NAMESPACES, ns)


async def create_rs(api: RestClient, ns: str, name: str, replicas: int, **kw: Any) -> dict:
    return await api.create(REPLICASETS, replicaset_manifest(name, replicas, **kw), namespace=ns)


async def create_pod(api: RestClient, ns: str, name: str, labels: dict[str, str], **meta: Any) -> dict:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels, **meta},
            "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE}]}}
    return await api.create(PODS, body, namespace=ns)


async def scale(api: RestClient, ns: str, name: str, replicas: int) -> None:
    await api.patch(REPLICASETS, name, {"spec": {"replicas": replicas}}, ns, content_type=MERGE_PATCH)


async def pods(api: RestClient, ns: str) -> list[dict]:
    return (await api.list(PODS, ns))["items"]


def owner_uid(pod: dict) -> str | None:
    refs = [r for r in pod["metadata"].get("ownerReferences") or () if r.get("controller")]
    return refs[0]["uid"] if refs else None


async def owned(api: RestClient, ns: str, rs: dict, *, active: bool = True) -> list[dict]:
    uid = rs["metadata"]["uid"]
    return [p for p in await pods(api, ns)
            if owner_uid(p) == uid and (not active or p["metadata"].get("deletionTimestamp") is None)]


async def rs_status(api: RestClient, ns: str, name: str) -> dict:
    return (await api.get(REPLICASETS, name, ns)).get("status") or {}


async def wait_status(api: RestClient, ns: str, name: str, timeout: float = 30, **expected: Any) -> dict:
    async def check() -> dict | None:
        status = await rs_status(api, ns, name)
        return status if all(status.get(k, 0) == v for k, v in expected.items()) else None

    return await wait_for(check, timeout, 0.1, f"{ns}/{name} status {expected}")


async def wait_owned(api: RestClient, ns: str, rs: dict, count: int, timeout: float = 30) -> list[dict]:
    async def check() -> list[dict] | None:
        found = await owned(api, ns, rs)
        return found if len(found) == count else None

    return await wait_for(check, timeout, 0.1, f"{count} pods owned by {rs['metadata']['name']}")


async def bind(api: RestClient, ns: str, pod: str, node: str) -> None:
    """Play the scheduler: pods/binding sets spec.nodeName (the node need not exist)."""
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    await api.request("POST", PODS.path(ns, pod, "binding"), body=body)


async def set_pod_status(api: RestClient, ns: str, pod: str, phase: str, ready: bool | None = None,
                         ready_since: float | None = None) -> None:
    """Play the kubelet: phase and the Ready condition (with its lastTransitionTime)."""
    status: dict[str, Any] = {"phase": phase}
    if ready is not None:
        since = format_time(ready_since if ready_since is not None else time.time())
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False",
                                 "lastTransitionTime": since}]
    await api.patch(PODS, pod, {"status": status}, ns, content_type=MERGE_PATCH, subresource="status")


async def make_ready(api: RestClient, ns: str, pod: dict, node: str = "node-a", since: float | None = None) -> None:
    name = pod["metadata"]["name"]
    if not pod["spec"].get("nodeName"):
        await bind(api, ns, name, node)
    await set_pod_status(api, ns, name, "Running", ready=True, ready_since=since)


async def events_for(api: RestClient, ns: str, name: str) -> list[dict]:
    items = (await api.list(EVENTS, ns))["items"]
    return [e for e in items if e["involvedObject"].get("name") == name and e["involvedObject"]["kind"] == "ReplicaSet"]


def condition(status: dict, cond_type: str = "ReplicaFailure") -> dict | None:
    return next((c for c in status.get("conditions") or () if c["type"] == cond_type), None)


async def cached(ctrl: ReplicaSetController, ns: str, name: str) -> None:
    """Wait until the controller's pod cache has the pod, so its RS sees it on the first sync."""

    async def seen() -> bool:
        return ctrl.pods.indexer.get_by(ns, name) is not None

    await wait_for(seen, 15, 0.05, f"pod {ns}/{name} in pykcm's cache")


class CreateSpy:
    """Counts pod creates per sync of one ReplicaSet key, and the errors of failed creates."""

    def __init__(self, ctrl: ReplicaSetController, key: str) -> None:
        self.per_sync: list[int] = []
        self.errors: list[str] = []
        self.total = 0
        self._current = 0
        create, sync = ctrl.pod_control.create_pod, ctrl.sync

        async def spy_create(namespace: str, template: dict, owner: dict, ref: dict) -> dict:
            mine = object_key(owner) == key
            if mine:
                self._current += 1
            try:
                created = await create(namespace, template, owner, ref)
            except Exception as err:
                if mine:
                    self.errors.append(str(err))
                raise
            if mine:
                self.total += 1
            return created

        async def spy_sync(k: str) -> None:
            if k != key:
                return await sync(k)
            self._current = 0
            try:
                await sync(k)
            finally:
                self.per_sync.append(self._current)

        ctrl.pod_control.create_pod = spy_create  # type: ignore[method-assign]
        ctrl.sync = spy_sync  # type: ignore[method-assign]

    def creating_syncs(self) -> list[int]:
        return [n for n in self.per_sync if n]


async def stays(check, seconds: float, interval: float = 0.2) -> None:
    """Assert `check()` holds for the whole period (for "nothing happens" claims)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert await check()
        await asyncio.sleep(interval)


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


async def test_scenario_14_15_quota_rejection_then_recovery(api, ns, pykcm):
    quota = await api.create(RESOURCEQUOTAS, {"apiVersion": "v1", "kind": "ResourceQuota",
                                              "metadata": {"name": "pods"}, "spec": {"hard": {"pods": "0"}}},
                             namespace=ns)
    # No quota controller runs here: publish the quota's status ourselves so admission enforces it.
    quota["status"] = {"hard": {"pods": "0"}, "used": {"pods": "0"}}
    quota = await api.update(RESOURCEQUOTAS, quota, subresource="status")
    ctrl = rs_controller(pykcm)
    creates = CreateSpy(ctrl, f"{ns}/web")
    spy = ControllerSpy(ctrl)
    await create_rs(api, ns, "web", 10)
    status = await wait_for(lambda: _with_condition(api, ns), 15, message="ReplicaFailure condition")
    cond = condition(status)
    assert (cond["status"], cond["reason"]) == ("True", "FailedCreate")
    assert "exceeded quota" in cond["message"]

    async def failed_event() -> list[dict]:
        return [e for e in await events_for(api, ns, "web") if e["reason"] == "FailedCreate"]

    # Each message names its generated pod, so events don't aggregate: one per failed attempt.
    events = await wait_for(failed_event, 15, message="FailedCreate event")
    assert all(e["type"] == "Warning" and e["message"].startswith("Error creating: ") for e in events)
    await asyncio.sleep(2.0)
    assert creates.creating_syncs() and set(creates.creating_syncs()) == {1}  # one doomed call per sync
    # Exponential backoff (5 ms, 10 ms, 20 ms ...): a few retries in 2 s, not a hot loop.
    assert 2 <= spy.rate_limited.count(f"{ns}/web") <= 14
    # Scenario 15: raise the quota; the next successful sync removes the condition.
    quota = await api.get(RESOURCEQUOTAS, "pods", ns)
    quota["spec"]["hard"]["pods"] = "10"
    quota = await api.update(RESOURCEQUOTAS, quota)
    quota["status"] = {"hard": {"pods": "10"}, "used": {"pods": "0"}}
    await api.update(RESOURCEQUOTAS, quota, subresource="status")
    status = await wait_status(api, ns, "web", 60, replicas=10)
    await wait_for(lambda: _without_condition(api, ns), 15, message="condition removed")


async def _with_condition(api: RestClient, ns: str) -> dict | None:
    status = await rs_status(api, ns, "web")
    return status if condition(status) else None


async def _without_condition(api: RestClient, ns: str) -> bool:
    return condition(await rs_status(api, ns, "web")) is None


async def test_scenario_16_terminating_namespace_no_event_no_condition(api, pykcm):
    ns = await create_namespace(api, "rs-term")
    try:
        await create_rs(api, ns, "web", 0)
        await wait_status(api, ns, "web", replicas=0)
        ctrl = rs_controller(pykcm)
        creates = CreateSpy(ctrl, f"{ns}/web")
        spy = ControllerSpy(ctrl)
        await api.delete(NAMESPACES, ns)  # no namespace controller here: stays Terminating
        # The apiserver's admission learns of the deletion through its own informer: wait until it
        # rejects creates, so every pod create of this scale-up meets NamespaceTerminating.
        await wait_for(lambda: _rejects_creates(api, ns), 15, message="admission sees the namespace terminating")
        await scale(api, ns, "web", 3)
        await wait_for(lambda: _has(creates.errors), 15, message="create attempts")
        assert all("is being terminated" in e for e in creates.errors)
        await wait_for(lambda: _observed(api, ns, 2), 15, message="status written")
        await asyncio.sleep(1.0)
        status = await rs_status(api, ns, "web")
        assert condition(status) is None
        assert [e for e in await events_for(api, ns, "web") if e["reason"] == "FailedCreate"] == []
        # Not an error, so no backoff retries. (A sync skipped because the cache has not yet seen
        # our own status write is a fixed-delay "requeue", not an error.)
        errors = [o for o in spy.outcomes(f"{ns}/web") if o.startswith("error")]
        assert errors == [], spy.outcomes(f"{ns}/web")
    finally:
        with contextlib.suppress(NotFound):
            await api.delete(REPLICASETS, "web", ns)
        # Finalize by hand (there is no namespace controller) so nothing lingers.
        with contextlib.suppress(NotFound):
            live = await api.get(NAMESPACES, ns)
            live["spec"]["finalizers"] = []
            await api.request("PUT", NAMESPACES.path(None, ns, "finalize"), body=live)


async def _rejects_creates(api: RestClient, ns: str) -> bool:
    probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "probe-"}}
    try:
        await api.create(CONFIGMAPS, probe, namespace=ns)
    except ApiError as err:
        return err.has_cause(NAMESPACE_TERMINATING_CAUSE)
    return False


async def _has(items: list) -> bool:
    return bool(items)


async def _observed(api: RestClient, ns: str, generation: int) -> bool:
    return (await rs_status(api, ns, "web")).get("observedGeneration") == generation


async def test_scenario_17_no_creates_while_pod_watch_lags(api, ns, control_plane):
    rs = await create_rs(api, ns, "web", 3)
    clock = [time.monotonic()]
    async with hand_fed_controller(api, clock=lambda: clock[0]) as ctrl, \
            hand_fed_controller(api, clock=lambda: clock[0]) as lagging:
        await _lagging_watch(api, ns, rs, ctrl, lagging, clock)


async def _lagging_watch(api: RestClient, ns: str, rs: dict, ctrl: ReplicaSetController,
                         lagging: ReplicaSetController, clock: list[float]) -> None:
    ctrl.replica_sets.indexer.upsert(rs)
    key = f"{ns}/web"
    await ctrl.sync(key)
    assert len(await pods(api, ns)) == 3
    # The status update comes back (cache refreshed) but the pod watch delivered nothing.
    ctrl.replica_sets.indexer.upsert(await api.get(REPLICASETS, "web", ns))
    await ctrl.sync(key)
    await ctrl.sync(key)
    assert len(await pods(api, ns)) == 3
    # Once the three pod adds are seen, nothing more is needed.
    for pod in await pods(api, ns):
        ctrl.pods.indexer.upsert(pod)
        ctrl.pod_added(pod)
    ctrl.replica_sets.indexer.upsert(await api.get(REPLICASETS, "web", ns))
    await ctrl.sync(key)
    assert len(await pods(api, ns)) == 3
    # The 5-minute safety valve: with adds never seen, a sync acts again after expiry.
    lagging.replica_sets.indexer.upsert(await api.get(REPLICASETS, "web", ns))
    lagging.expectations.expect_creations(key, 3)
    await lagging.sync(key)
    assert len(await pods(api, ns)) == 3
    clock[0] += EXPECTATIONS_TIMEOUT + 1
    await lagging.sync(key)
    assert len(await pods(api, ns)) == 6  # the documented over-creation (#129795), as KCM


async def test_scenario_18_graceful_deletes_counted_once(api, ns, pykcm):
    ctrl = rs_controller(pykcm)
    rs = await create_rs(api, ns, "web", 3)
    three = await wait_owned(api, ns, rs, 3)
    for pod in three:
        await make_ready(api, ns, pod)
    await wait_status(api, ns, "web", readyReplicas=3)
    await scale(api, ns, "web", 1)
    await wait_owned(api, ns, rs, 1)  # two have deletionTimestamp now (bound pods: graceful)
    key = f"{ns}/web"

    async def settled() -> bool:
        exp = ctrl.expectations.get(key)
        return exp is not None and (exp.add, exp.delete) == (0, 0)

    await wait_for(settled, 15, message="deletions observed")
    for pod in await owned(api, ns, rs, active=False):
        if pod["metadata"].get("deletionTimestamp"):
            await api.delete(PODS, pod["metadata"]["name"], ns, body={"gracePeriodSeconds": 0})
    await wait_for(lambda: _count(api, ns, 1), 15, message="terminating pods gone")
    await asyncio.sleep(0.5)
    exp = ctrl.expectations.get(key)
    assert (exp.add, exp.delete) == (0, 0)  # the real deletes did not count again


async def _count(api: RestClient, ns: str, n: int) -> bool:
    return len(await pods(api, ns)) == n


async def test_scenario_19_recreated_rs_not_blocked(api, ns, pykcm):
    ctrl = rs_controller(pykcm)
    await create_rs(api, ns, "web", 0)
    await wait_status(api, ns, "web", observedGeneration=1)
    key = f"{ns}/web"
    ctrl.expectations.expect_creations(key, 100)  # pending: would block the key for 5 minutes
    await api.delete(REPLICASETS, "web", ns)
    new = await create_rs(api, ns, "web", 2)
    await wait_owned(api, ns, new, 2, timeout=15)
    await wait_status(api, ns, "web", replicas=2)


async def test_scenario_20_steady_state_no_status_put(api, ns, pykcm):
    ctrl = rs_controller(pykcm)
    rs = await create_rs(api, ns, "web", 2)
    two = await wait_owned(api, ns, rs, 2)
    for pod in two:
        await make_ready(api, ns, pod)
    steady = await wait_status(api, ns, "web", replicas=2, readyReplicas=2, availableReplicas=2)
    await asyncio.sleep(0.5)
    before = (await api.get(REPLICASETS, "web", ns))["metadata"]["resourceVersion"]
    spy = ControllerSpy(ctrl)
    # Pod status noise and an explicit re-enqueue (what a resync does).
    for i, pod in enumerate(two):
        await api.patch(PODS, pod["metadata"]["name"], {"metadata": {"annotations": {"noise": str(i)}}}, ns,
                        content_type=MERGE_PATCH)
    ctrl.queue.add(f"{ns}/web")
    await wait_for(lambda: _synced_n(spy, f"{ns}/web", 2), 15, message="syncs")
    await asyncio.sleep(0.5)
    after = await api.get(REPLICASETS, "web", ns)
    assert after["metadata"]["resourceVersion"] == before
    assert after["status"] == steady


async def _synced_n(spy: ControllerSpy, key: str, n: int) -> bool:
    return len(spy.outcomes(key)) >= n


async def test_scenario_21_generation_bump_updates_observed_generation(api, ns, pykcm):
    await create_rs(api, ns, "web", 1)
    await wait_status(api, ns, "web", replicas=1, observedGeneration=1)
    await api.patch(REPLICASETS, "web", {"spec": {"template": {"metadata": {"annotations": {"v": "2"}}}}}, ns,
                    content_type=MERGE_PATCH)
    status = await wait_status(api, ns, "web", observedGeneration=2)
    assert status["replicas"] == 1


async def test_scenario_22_available_after_min_ready_seconds(api, ns, pykcm):
    rs = await create_rs(api, ns, "web", 1, minReadySeconds=10)
    (pod,) = await wait_owned(api, ns, rs, 1)
    await wait_status(api, ns, "web", replicas=1)
    ready_at = time.time()
    await make_ready(api, ns, pod, since=ready_at)
    await wait_status(api, ns, "web", 5, readyReplicas=1, availableReplicas=0)
    await wait_status(api, ns, "web", 20, readyReplicas=1, availableReplicas=1)
    # Not before minReadySeconds (second-precision timestamps), and without any further pod event.
    assert time.time() >= int(ready_at) + 10 - 0.5


async def test_scenario_23_pod_names_and_metadata_from_template(api, ns, pykcm):
    rs = await create_rs(api, ns, "web", 2, template_metadata={
        "annotations": {"team": "blue"}, "finalizers": ["example.com/keep"]})
    two = await wait_owned(api, ns, rs, 2)
    for pod in two:
        meta = pod["metadata"]
        assert re.fullmatch(r"web-[a-z0-9]{5}", meta["name"]), meta["name"]
        assert meta["generateName"] == "web-"
        assert meta["labels"] == {"app": "web"}
        assert meta["annotations"] == {"team": "blue"}
        assert meta["finalizers"] == ["example.com/keep"]


async def test_scenario_24_overlapping_selectors_one_owner(api, ns, pykcm):
    await create_pod(api, ns, "orphan", {"app": "shared"})
    await cached(rs_controller(pykcm), ns, "orphan")
    selector = {"matchLabels": {"app": "shared"}}
    a, b = await asyncio.gather(
        create_rs(api, ns, "a", 1, labels={"app": "shared", "rs": "a"}, selector=selector),
        create_rs(api, ns, "b", 1, labels={"app": "shared", "rs": "b"}, selector=selector),
    )
    await wait_status(api, ns, "a", replicas=1)
    await wait_status(api, ns, "b", replicas=1)
    orphan = await api.get(PODS, "orphan", ns)
    refs = [r for r in orphan["metadata"]["ownerReferences"] if r.get("controller")]
    assert len(refs) == 1 and refs[0]["uid"] in (a["metadata"]["uid"], b["metadata"]["uid"])
    await wait_for(lambda: _count(api, ns, 2), 15, message="one pod per ReplicaSet")
    assert {owner_uid(p) for p in await pods(api, ns)} == {a["metadata"]["uid"], b["metadata"]["uid"]}


async def test_scenario_25_same_name_other_uid_ignored(api, ns, pykcm):
    stale_ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": str(uuid.uuid4()),
                 "controller": True}
    impostor = await create_pod(api, ns, "impostor", {"app": "web"}, ownerReferences=[stale_ref])
    await cached(rs_controller(pykcm), ns, "impostor")
    rs = await create_rs(api, ns, "web", 1)
    await wait_owned(api, ns, rs, 1)
    await wait_status(api, ns, "web", replicas=1)
    after = await api.get(PODS, "impostor", ns)
    assert after["metadata"]["resourceVersion"] == impostor["metadata"]["resourceVersion"]


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


# -- drive the controller directly ----------------------------------------------------------------


@contextlib.asynccontextmanager
async def hand_fed_controller(api: RestClient, clock=None) -> AsyncIterator[ReplicaSetController]:
    """A controller on the real API whose caches are never started: the test fills them."""
    events = EventRecorder(api, RS_CONTROLLER)
    ctx = ControllerContext(client=api, informers=SharedInformerFactory(api), options=Options(), events=events)
    ctrl = ReplicaSetController(ctx)
    if clock is not None:
        ctrl.expectations = ControllerExpectations(clock=clock)
    try:
        yield ctrl
    finally:
        ctrl.queue.shutdown()
        await events.close()

