"""The ReplicaSet controller against the real kube-apiserver, scenarios 14-25: failure conditions
and their events, expectations across lagging watches and recreated ReplicaSets, the status it
writes (and does not), and the pods' metadata and ownership.

As in test_replicaset.py there is no kubelet; scenario 17 drives `sync` directly over hand-made
caches while the API is real.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid

import pytest

from pykcm.client.errors import NAMESPACE_TERMINATING_CAUSE, ApiError, NotFound
from pykcm.client.resources import CONFIGMAPS, NAMESPACES, PODS, REPLICASETS, RESOURCEQUOTAS
from pykcm.client.rest import MERGE_PATCH, RestClient
from pykcm.controller.expectations import EXPECTATIONS_TIMEOUT
from pykcm.controllers.replicaset import ReplicaSetController
from tests.integration.replicaset_support import (
    CreateSpy,
    cached,
    condition,
    create_pod,
    create_rs,
    events_for,
    hand_fed_controller,
    make_ready,
    owned,
    owner_uid,
    pods,
    rs_controller,
    rs_status,
    scale,
    wait_owned,
    wait_status,
)
from tests.support import ControllerSpy, create_namespace, wait_for

pytestmark = pytest.mark.integration


# -- scenarios --------------------------------------------------------------------------------------


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
