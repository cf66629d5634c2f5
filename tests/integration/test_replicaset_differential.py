"""Differential: the same ReplicaSet workload under the real kube-controller-manager and under
pykcm, compared by normalised end states (pods, ownerReferences, labels, every status field,
conditions, event reasons, and the Events themselves where a workload makes them deterministic).

Each test runs its workload twice on the session control plane, in two namespaces: first with
KCM (only its replicaset controller) which is then stopped, then with pykcm. The two never run
at the same time, so neither ever acts on the other's objects.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pykcm.client.resources import EVENTS, PODS, REPLICASETS, RESOURCEQUOTAS
from pykcm.client.rest import MERGE_PATCH, RestClient
from tests.integration.replicaset_support import (
    clean_namespace,
    create_pod,
    create_rs,
    make_ready,
    owner_uid,
    pods,
    rs_status,
    scale,
    wait_status,
)
from tests.support import admin_client, create_namespace, running_manager, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kcm]

# KCM's own identity (system:kube-controller-manager) may not create pods: like a real cluster,
# give each controller its service account (system:controller:replicaset-controller).
KCM_ARGS = ("--use-service-account-credentials=true",)
DEBUG = bool(os.environ.get("PYKCM_DIFF_DEBUG"))  # print KCM's snapshots
POD_NAME = re.compile(r"\bweb-[a-z0-9]{5}\b")
EVENT_NAME = re.compile(r"^web\.[0-9a-f]{16}$")  # client-go's <object>.<nanoseconds in hex>

Snapshot = dict[str, Any]
Workload = Callable[[RestClient, str], Awaitable[list[Snapshot]]]


# -- normalisation ----------------------------------------------------------------------------------


def normal_status(status: dict) -> dict:
    """Every status field; conditions without their timestamp and with pod names masked."""
    out = dict(status)
    if "conditions" in out:
        out["conditions"] = [
            {k: POD_NAME.sub("web-*", v) if isinstance(v, str) else v for k, v in cond.items()
             if k != "lastTransitionTime"}
            for cond in out["conditions"]
        ]
    return out


def normal_pod(pod: dict, rs_uids: dict[str, str]) -> dict:
    meta = pod["metadata"]
    refs = [{**r, "uid": rs_uids.get(r["uid"], "<other>")} for r in meta.get("ownerReferences") or ()]
    return {
        "name": POD_NAME.sub("web-*", meta["name"]),
        "generateName": meta.get("generateName"),
        "labels": meta.get("labels"),
        "annotations": meta.get("annotations"),
        "finalizers": meta.get("finalizers"),
        "ownerReferences": refs,
        "terminating": meta.get("deletionTimestamp") is not None,
    }


async def snapshot(api: RestClient, ns: str, label: str) -> Snapshot:
    """Pods and ReplicaSet statuses of the namespace, once nothing has changed for a second."""
    await settle(api, ns)
    replica_sets = (await api.list(REPLICASETS, ns))["items"]
    rs_uids = {rs["metadata"]["uid"]: f"<rs {rs['metadata']['name']}>" for rs in replica_sets}
    return {
        "step": label,
        "statuses": {rs["metadata"]["name"]: normal_status(rs.get("status") or {}) for rs in replica_sets},
        "pods": sorted((normal_pod(p, rs_uids) for p in await pods(api, ns)), key=repr),
    }


async def settle(api: RestClient, ns: str, quiet: float = 1.0, timeout: float = 30.0) -> None:
    """Wait until no ReplicaSet or pod in `ns` changed for `quiet` seconds."""

    async def versions() -> tuple:
        objs = (await api.list(REPLICASETS, ns))["items"] + await pods(api, ns)
        return tuple(sorted((o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in objs))

    deadline = time.monotonic() + timeout
    last, since = await versions(), time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, f"{ns} never settled"
        await asyncio.sleep(0.2)
        current = await versions()
        if current != last:
            last, since = current, time.monotonic()


async def event_summary(api: RestClient, ns: str, exact: tuple[str, ...]) -> Snapshot:
    """(type, reason) -> count for reasons whose count is deterministic; presence for the rest
    (a failing create is retried on a timer, so how many FailedCreate events exist is not)."""
    await asyncio.sleep(1.0)  # both recorders send asynchronously
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for event in (await api.list(EVENTS, ns))["items"]:
        if event["involvedObject"].get("kind") != "ReplicaSet":
            continue
        assert event["source"]["component"] == "replicaset-controller"
        counts[(event["type"], event["reason"])] += event.get("count", 1)
    summary = {f"{t}/{r}": (n if r in exact else "some") for (t, r), n in sorted(counts.items())}
    return {"step": "events", "events": summary}


def normal_event(event: dict) -> dict:
    """An Event as written, with what differs from run to run (time, pod names, uids) masked."""
    return {
        "name": "web.<hex>" if EVENT_NAME.match(event["metadata"]["name"]) else event["metadata"]["name"],
        **{k: event.get(k) for k in ("type", "reason", "count", "source", "reportingComponent", "reportingInstance")},
        "message": POD_NAME.sub("web-*", event["message"]),
        "involvedObject": sorted(event["involvedObject"]),
        "lastTimestamp not before firstTimestamp": event["lastTimestamp"] >= event["firstTimestamp"],
    }


async def event_list(api: RestClient, ns: str) -> Snapshot:
    await asyncio.sleep(1.0)  # both recorders send asynchronously
    items = (await api.list(EVENTS, ns))["items"]
    return {"step": "event list", "events": sorted((normal_event(e) for e in items), key=repr)}


# -- workloads --------------------------------------------------------------------------------------


async def scale_0_10_3_0(api: RestClient, ns: str) -> list[Snapshot]:
    await create_rs(api, ns, "web", 0)
    shots = [await snapshot_when(api, ns, "created", replicas=0, observedGeneration=1)]
    for generation, replicas in enumerate((10, 3, 0), start=2):
        await scale(api, ns, "web", replicas)
        shots.append(await snapshot_when(api, ns, f"scaled to {replicas}", replicas=replicas,
                                         observedGeneration=generation))
    shots.append(await event_summary(api, ns, exact=("SuccessfulCreate", "SuccessfulDelete")))
    return shots


async def scale_0_30_0(api: RestClient, ns: str) -> list[Snapshot]:
    """Past ten similar events, KCM's recorder combines them into one Event it counts up, and past
    25 its spam filter drops the rest (client-go's EventCorrelator): the Events must match."""
    await create_rs(api, ns, "web", 30)
    shots = [await snapshot_when(api, ns, "scaled to 30", replicas=30)]
    await scale(api, ns, "web", 0)
    shots.append(await snapshot_when(api, ns, "scaled to 0", replicas=0))
    shots.append(await event_list(api, ns))
    return shots


async def adoption_and_release(api: RestClient, ns: str) -> list[Snapshot]:
    await create_pod(api, ns, "orphan", {"app": "web"})
    await asyncio.sleep(1.0)  # let the controller's pod cache have it before the RS appears
    rs = await create_rs(api, ns, "web", 1)
    shots = [await snapshot_when(api, ns, "adopted", replicas=1)]
    await api.patch(PODS, "orphan", {"metadata": {"labels": {"app": "other"}}}, ns, content_type=MERGE_PATCH)

    async def released_and_replaced() -> bool:
        all_pods = await pods(api, ns)
        orphan = next(p for p in all_pods if p["metadata"]["name"] == "orphan")
        mine = [p for p in all_pods if owner_uid(p) == rs["metadata"]["uid"]]
        return owner_uid(orphan) is None and len(mine) == 1

    await wait_for(released_and_replaced, 30, message="released and replaced")
    shots.append(await snapshot_when(api, ns, "released", replicas=1))
    shots.append(await event_summary(api, ns, exact=("SuccessfulCreate",)))
    return shots


async def deleted_owned_pod(api: RestClient, ns: str) -> list[Snapshot]:
    await create_rs(api, ns, "web", 2)
    shots = [await snapshot_when(api, ns, "running", replicas=2)]
    victim = (await pods(api, ns))[0]["metadata"]["name"]
    await api.delete(PODS, victim, ns)

    async def replaced() -> bool:
        names = [p["metadata"]["name"] for p in await pods(api, ns)]
        return victim not in names and len(names) == 2

    await wait_for(replaced, 30, message="replacement")
    shots.append(await snapshot_when(api, ns, "replaced", replicas=2))
    shots.append(await event_summary(api, ns, exact=("SuccessfulCreate",)))
    return shots


async def quota_rejection_then_recovery(api: RestClient, ns: str) -> list[Snapshot]:
    await set_pod_quota(api, ns, 0)
    await create_rs(api, ns, "web", 3)

    async def failing() -> bool:
        return any(c["type"] == "ReplicaFailure" for c in (await rs_status(api, ns, "web")).get("conditions") or ())

    await wait_for(failing, 30, message="ReplicaFailure")
    shots = [await snapshot_when(api, ns, "rejected", replicas=0)]
    await set_pod_quota(api, ns, 3)

    async def recovered() -> bool:
        status = await rs_status(api, ns, "web")
        return status.get("replicas") == 3 and not status.get("conditions")

    await wait_for(recovered, 60, message="recovery")
    shots.append(await snapshot_when(api, ns, "recovered", replicas=3))
    shots.append(await event_summary(api, ns, exact=("SuccessfulCreate",)))
    return shots


async def min_ready_seconds(api: RestClient, ns: str) -> list[Snapshot]:
    await create_rs(api, ns, "web", 1, minReadySeconds=3)
    shots = [await snapshot_when(api, ns, "created", replicas=1)]
    pod = (await pods(api, ns))[0]
    ready_at = time.time()
    await make_ready(api, ns, pod, since=ready_at)
    status = await wait_status(api, ns, "web", 10, readyReplicas=1)
    shots.append({"step": "ready", "availableReplicas": status.get("availableReplicas", 0)})
    await wait_status(api, ns, "web", 15, availableReplicas=1)
    became_available = time.time() - int(ready_at)
    shots.append({"step": "available", "within 3..6 s": 3 - 0.5 <= became_available <= 6})
    shots.append(await snapshot_when(api, ns, "available", availableReplicas=1))
    return shots


async def snapshot_when(api: RestClient, ns: str, label: str, **status: Any) -> Snapshot:
    await wait_status(api, ns, "web", 60, **status)
    return await snapshot(api, ns, label)


async def set_pod_quota(api: RestClient, ns: str, pods_allowed: int) -> None:
    """A pods quota, with the status the (absent) quota controller would publish."""
    hard = {"pods": str(pods_allowed)}
    try:
        quota = await api.get(RESOURCEQUOTAS, "pods", ns)
        quota["spec"]["hard"] = hard
        quota = await api.update(RESOURCEQUOTAS, quota)
    except Exception:
        body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods"}, "spec": {"hard": hard}}
        quota = await api.create(RESOURCEQUOTAS, body, namespace=ns)
    used = len([p for p in await pods(api, ns) if p["status"].get("phase") not in ("Succeeded", "Failed")])
    quota["status"] = {"hard": hard, "used": {"pods": str(used)}}
    await api.update(RESOURCEQUOTAS, quota, subresource="status")


# -- the comparison ---------------------------------------------------------------------------------


async def run_under_kcm(control_plane, api: RestClient, workload: Workload) -> list[Snapshot]:
    ns = await create_namespace(api, "kcm")
    await asyncio.to_thread(control_plane.start_kcm, "replicaset", KCM_ARGS)
    try:
        return await workload(api, ns)
    finally:
        await asyncio.to_thread(control_plane.stop_kcm)
        await clean_namespace(api, ns)


async def run_under_pykcm(control_plane, api: RestClient, workload: Workload) -> list[Snapshot]:
    ns = await create_namespace(api, "pykcm")
    try:
        # KCM's defaults for the client (20 qps, burst 30) and workers (5).
        async with running_manager(control_plane.kubeconfig, controllers="replicaset"):
            return await workload(api, ns)
    finally:
        with contextlib.suppress(Exception):
            await clean_namespace(api, ns)


@pytest.mark.parametrize(
    "workload",
    [scale_0_10_3_0, scale_0_30_0, adoption_and_release, deleted_owned_pod, quota_rejection_then_recovery,
     min_ready_seconds],
    ids=lambda w: w.__name__,
)
async def test_differential_kcm_vs_pykcm(control_plane, workload: Workload) -> None:
    api = admin_client(control_plane.kubeconfig)
    try:
        kcm = await run_under_kcm(control_plane, api, workload)
        ours = await run_under_pykcm(control_plane, api, workload)
    finally:
        await api.close()
    if DEBUG:
        print(json.dumps(kcm, indent=1))
    for theirs, mine in zip(kcm, ours, strict=True):
        assert mine == theirs, f"step {theirs.get('step')!r} differs"
