"""The pods watch read as protobuf (--kube-api-content-type), against the real apiserver: every
field a projection keeps comes out as the JSON watch gives it, errors decode, and an informer
reads protobuf only where its projection allows, down to the ReplicaSet controller."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from pykcm.client.errors import ApiError
from pykcm.client.protobuf import PROTOBUF, Projected, WatchDecoder
from pykcm.client.resources import PODS, REPLICASETS
from pykcm.client.rest import MERGE_PATCH, RestClient
from pykcm.controllers.replicaset.controller import CONTROLLER_POD_FIELDS
from pykcm.informers.factory import SharedInformerFactory
from pykcm.informers.projection import project
from pykcm.util.apitime import format_time
from tests.support import admin_client, create_namespace, ensure_crd, replicaset_manifest, running_manager, wait_for

pytestmark = pytest.mark.integration

WIDE = {  # more than a controller keeps: every field client/protobuf.py knows
    **CONTROLLER_POD_FIELDS,
    "metadata": {**CONTROLLER_POD_FIELDS["metadata"], "annotations": True, "generateName": True,  # type: ignore[dict-item]
                 "generation": True, "finalizers": True, "deletionGracePeriodSeconds": True},
    "status": {**CONTROLLER_POD_FIELDS["status"], "conditions": True,  # type: ignore[dict-item]
               "containerStatuses": {"name": True, "restartCount": True}},
}


NARROW = {"metadata": {"name": True, "resourceVersion": True}}  # not even kind and apiVersion


def rich_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"app": "x", "empty": ""},
            "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-7", "note": "a longer value " * 8},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True,
                                 "uid": "6563873f-eae4-4bb6-92c0-6c37271f1cc8"}],
            "finalizers": ["example.com/hold"],
        },
        "spec": {
            "nodeName": "node-a",
            "initContainers": [{"name": "sidecar", "image": "registry.k8s.io/pause:3.10", "restartPolicy": "Always"},
                               {"name": "init", "image": "registry.k8s.io/pause:3.10"}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


def status(pod: dict[str, Any]) -> dict[str, Any]:
    now = format_time(1_790_000_000)
    pod["status"] = {
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now, "reason": "R", "message": "m"},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now, "lastProbeTime": now},
        ],
        "containerStatuses": [{"name": "c", "restartCount": 3, "ready": True, "image": "i", "imageID": "",
                               "state": {"running": {"startedAt": now}}}],
        "initContainerStatuses": [{"name": "sidecar", "restartCount": 0, "ready": True, "image": "i",
                                   "imageID": ""}],
    }
    return pod


async def collect(client: RestClient, ns: str, rv: str, decoder: WatchDecoder | None) -> list[dict]:
    """Every event since `rv`, until the server ends the watch a few seconds on."""
    params = {"resourceVersion": rv, "timeoutSeconds": 3}
    return [event async for event in client.watch(PODS.path(ns), params, decoder=decoder)]


async def force_delete(client: RestClient, ns: str, name: str) -> None:
    """Without a kubelet a bound pod would wait for one: drop the finalizer, then delete at once."""
    await client.patch(PODS, name, {"metadata": {"finalizers": None}}, namespace=ns)
    await client.delete(PODS, name, namespace=ns, body={"gracePeriodSeconds": 0})


async def test_protobuf_watch_gives_the_projection_of_the_json_watch(control_plane):
    client = admin_client(control_plane.kubeconfig)
    ns = await create_namespace(client, "pb")
    try:
        rv = (await client.list(PODS, ns))["metadata"]["resourceVersion"]
        await client.create(PODS, rich_pod("rich"), namespace=ns)
        plain = {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        await client.create(PODS, plain, namespace=ns)
        await client.update(PODS, status(await client.get(PODS, "rich", ns)), subresource="status")
        await client.delete(PODS, "rich", namespace=ns)  # the finalizer holds it: deletionTimestamp
        await client.delete(PODS, "plain", namespace=ns)  # unscheduled: gone at once
        for projection in (CONTROLLER_POD_FIELDS, WIDE, NARROW):
            as_json, as_protobuf = await asyncio.gather(
                collect(client, ns, rv, None), collect(client, ns, rv, WatchDecoder(projection))
            )
            assert [e["type"] for e in as_protobuf] == [e["type"] for e in as_json]
            assert [e["type"] for e in as_json] == ["ADDED", "ADDED", *["MODIFIED"] * 3, "DELETED"]
            assert all(type(e["object"]) is Projected for e in as_protobuf)  # read as protobuf indeed
            for j, p in zip(as_json, as_protobuf, strict=True):
                assert p["object"] == project(j["object"], projection)
        deleting = project(as_json[3]["object"], WIDE)
        assert deleting["metadata"]["deletionTimestamp"] and deleting["metadata"]["finalizers"]
        assert deleting["status"]["conditions"][0]["reason"] == "R"
    finally:
        await force_delete(client, ns, "rich")
        await client.close()


async def test_protobuf_watch_errors_decode(control_plane):
    client = admin_client(control_plane.kubeconfig)
    try:
        decoder = WatchDecoder(CONTROLLER_POD_FIELDS)
        with pytest.raises(ApiError) as raised:  # refused before the stream: a protobuf Status
            async for _ in client.watch(PODS.path(), {"resourceVersionMatch": "Bogus"}, decoder=decoder):
                pass
        assert raised.value.code == 422 and 'Unsupported value: "Bogus"' in raised.value.message
    finally:
        await client.close()


async def test_an_error_inside_the_protobuf_stream_decodes_as_the_json_one(control_plane):
    """A watch from a version the watch cache does not hold is answered 200, then an ERROR event
    with a 410 Status inside the stream: from protobuf it reads as from JSON. A restarted
    apiserver's cache starts at the current version, so version 1 is too old for it."""
    client = admin_client(control_plane.kubeconfig)
    ns = await create_namespace(client, "pberr")
    await asyncio.to_thread(control_plane.stop_apiserver)
    await asyncio.to_thread(control_plane.start_apiserver)
    try:
        as_json, as_protobuf = await asyncio.gather(
            collect(client, ns, "1", None), collect(client, ns, "1", WatchDecoder(CONTROLLER_POD_FIELDS))
        )
        assert [e["type"] for e in as_protobuf] == [e["type"] for e in as_json] == ["ERROR"]
        status = as_json[0]["object"]
        assert status["code"] == 410 and status["reason"] == "Expired", status
        assert as_protobuf[0]["object"] == status
    finally:
        await client.close()


async def test_a_watch_the_server_cannot_encode_as_protobuf_is_read_as_json(control_plane):
    """Protobuf is asked for with JSON as the fallback, as client-go's Accept has it: a type the
    apiserver cannot encode as protobuf (a custom resource) comes back as JSON and is read so."""
    client = admin_client(control_plane.kubeconfig)
    ns = await create_namespace(client, "pbcr")
    try:
        widgets = await ensure_crd(client, "pb.pykcm.test", "Widget", "widgets")
        rv = (await client.list(widgets, ns))["metadata"]["resourceVersion"]
        await client.create(widgets, {"apiVersion": "pb.pykcm.test/v1", "kind": "Widget",
                                      "metadata": {"name": "w"}, "size": 3}, namespace=ns)
        params = {"resourceVersion": rv, "timeoutSeconds": 2}
        events = [e async for e in client.watch(widgets.path(ns), params, decoder=WatchDecoder(NARROW))]
        seen = [(e["type"], e["object"]["metadata"]["name"], e["object"]["size"]) for e in events]
        assert seen == [("ADDED", "w", 3)]
        assert type(events[0]["object"]) is dict  # JSON, whole: the informer projects it as usual
    finally:
        await client.close()


async def test_pods_informer_reads_protobuf_where_its_projection_allows(control_plane):
    base = admin_client(control_plane.kubeconfig)
    client = RestClient(dataclasses.replace(base.config, content_type=PROTOBUF), "pb-informer")
    ns = await create_namespace(base, "pbinf")
    factory = SharedInformerFactory(client, min_resync_period=0)
    pods = factory.informer(PODS, fields=CONTROLLER_POD_FIELDS)
    try:
        factory.start()
        assert await factory.wait_for_cache_sync(timeout=30)
        assert pods.reflector.watch_decoder is not None
        await base.create(PODS, rich_pod("p"), namespace=ns)
        await base.update(PODS, status(await base.get(PODS, "p", ns)), subresource="status")

        async def cached_status() -> bool:
            return bool((pods.indexer.get_by(ns, "p") or {}).get("status", {}).get("conditions"))

        await wait_for(cached_status, message="the status reaches the cache")
        assert pods.indexer.get_by(ns, "p") == project(await base.get(PODS, "p", ns), CONTROLLER_POD_FIELDS)
        whole = SharedInformerFactory(client, min_resync_period=0).informer(PODS)  # FULL: JSON
        assert whole._watch_decoder() is None
    finally:
        await factory.shutdown()
        await force_delete(base, ns, "p")
        await client.close()
        await base.close()


async def test_replicaset_controller_runs_on_a_protobuf_pods_watch(control_plane):
    """`--kube-api-content-type` end to end: the manager's pods informer reads protobuf, and the
    ReplicaSet controller scales up and down on what it reads."""
    api = admin_client(control_plane.kubeconfig)
    ns = await create_namespace(api, "pbrs")
    try:
        async with running_manager(control_plane.kubeconfig, controllers="replicaset",
                                   kube_api_content_type=PROTOBUF, kube_api_qps=1000, kube_api_burst=1000) as manager:
            assert manager.factory.informers[PODS].reflector.watch_decoder is not None
            await api.create(REPLICASETS, replicaset_manifest("web", 3), namespace=ns)

            async def replicas(count: int) -> bool:
                rs = await api.get(REPLICASETS, "web", ns)
                pods = (await api.list(PODS, ns))["items"]
                return (rs.get("status") or {}).get("replicas") == count and len(pods) == count

            await wait_for(lambda: replicas(3), message="3 replicas")
            await api.patch(REPLICASETS, "web", {"spec": {"replicas": 1}}, namespace=ns, content_type=MERGE_PATCH)
            await wait_for(lambda: replicas(1), message="1 replica")
    finally:
        await api.close()


async def test_times_before_1970_read_as_json_has_them_and_keep_the_controller_going(control_plane):
    """A pod condition set to 1960 (the apiserver accepts it) is a negative Timestamp.seconds in
    protobuf: it once froze the pods informer for every namespace, relist after relist."""
    api = admin_client(control_plane.kubeconfig)
    ns = await create_namespace(api, "pbold")
    old = [{"type": "Ready", "status": "False", "lastTransitionTime": "1960-01-01T00:00:00Z",
            "lastProbeTime": "0001-01-01T00:00:01Z"}]
    try:
        async with running_manager(control_plane.kubeconfig, controllers="replicaset",
                                   kube_api_content_type=PROTOBUF, kube_api_qps=1000, kube_api_burst=1000) as manager:
            rv = (await api.list(PODS, ns))["metadata"]["resourceVersion"]
            await api.create(REPLICASETS, replicaset_manifest("web", 1), namespace=ns)
            [pod] = await wait_for(lambda: pods_of(api, ns, 1), message="1 pod")
            pod["status"] = {"conditions": old}
            await api.update(PODS, pod, subresource="status")
            as_json, as_protobuf = await asyncio.gather(
                collect(api, ns, rv, None), collect(api, ns, rv, WatchDecoder(WIDE))
            )
            assert as_protobuf[-1]["object"]["status"]["conditions"] == old
            assert [e["object"] for e in as_protobuf] == [project(e["object"], WIDE) for e in as_json]
            await api.patch(REPLICASETS, "web", {"spec": {"replicas": 3}}, namespace=ns, content_type=MERGE_PATCH)
            await wait_for(lambda: pods_of(api, ns, 3), message="3 pods after the scale up")
            assert manager.factory.informers[PODS].reflector.watch_decoder is not None  # still protobuf
    finally:
        await api.close()


async def pods_of(api: RestClient, ns: str, count: int) -> list[dict] | None:
    items = (await api.list(PODS, ns))["items"]
    return items if len(items) == count else None
