"""Namespace controller against the real kube-apiserver: scenarios 26-34 (spec/scenarios.md).

pykcm runs in this event loop with only the namespace controller. There is no kubelet: pods
that are not bound to a node are removed at once by the API server; the tests bind pods by
setting spec.nodeName when they need pods that terminate gracefully, and play the kubelet
(force delete) to let them go.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pykcm.client.discovery import GroupVersionResource, server_preferred_namespaced_resources
from pykcm.client.errors import NotFound
from pykcm.client.resources import APISERVICES, CONFIGMAPS, NAMESPACES, PODS, SECRETS, SERVICES, Resource
from pykcm.client.rest import RestClient
from pykcm.controllers.namespace.controller import DELETION_GRACE_PERIOD
from pykcm.testenv.controlplane import ControlPlane
from tests.support import (
    ControllerSpy,
    controller_of,
    create_namespace,
    ensure_crd,
    is_gone,
    running_manager,
    wait_for,
)

pytestmark = pytest.mark.integration

CRD_GROUP = "pykcm.test"
HOLD = f"{CRD_GROUP}/hold"  # a finalizer no controller removes
OK_CONDITIONS = [
    ("NamespaceDeletionDiscoveryFailure", "False", "ResourcesDiscovered", "All resources successfully discovered"),
    ("NamespaceDeletionGroupVersionParsingFailure", "False", "ParsedGroupVersions",
     "All legacy kube types successfully parsed"),
    ("NamespaceDeletionContentFailure", "False", "ContentDeleted",
     "All content successfully deleted, may be waiting on finalization"),
    ("NamespaceContentRemaining", "False", "ContentRemoved", "All content successfully removed"),
    ("NamespaceFinalizersRemaining", "False", "ContentHasNoFinalizers", "All content-preserving finalizers finished"),
]


# -- fixtures and helpers (the differential test reuses them) -------------------------------------


@pytest.fixture
async def widgets(client: RestClient) -> Resource:
    return await ensure_crd(client, CRD_GROUP, "Widget", "widgets")


def pod_body(name: str, node: str | None = None, grace: int | None = None,
             finalizers: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
    if node:
        spec["nodeName"] = node  # bound: deletion becomes graceful, as with a kubelet
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    meta: dict[str, Any] = {"name": name}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def named(name: str, finalizers: list[str] | None = None, **fields: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"metadata": meta, **fields}


async def get_namespace(client: RestClient, name: str) -> dict[str, Any] | None:
    try:
        return await client.get(NAMESPACES, name)
    except NotFound:
        return None


def conditions(namespace: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    """The deletion conditions as (type, status, reason, message), in the order they were written."""
    found = ((namespace or {}).get("status") or {}).get("conditions") or []
    return [(c["type"], c["status"], c.get("reason", ""), c.get("message", "")) for c in found]


def condition(namespace: dict[str, Any] | None, ctype: str) -> tuple[str, str, str] | None:
    return next(((s, r, m) for t, s, r, m in conditions(namespace) if t == ctype), None)


async def wait_condition_true(client: RestClient, name: str, ctype: str, timeout: float = 20) -> dict[str, Any]:
    """Poll until the namespace reports condition `ctype` with status True; return the namespace."""

    async def reported() -> dict[str, Any] | None:
        current = await get_namespace(client, name)
        found = condition(current, ctype)
        return current if found and found[0] == "True" else None

    return await wait_for(reported, timeout, 0.2, f"{ctype}=True")


async def poke(client: RestClient, name: str) -> None:
    """Touch a namespace so its controllers hear an update (and re-check it soon)."""
    with contextlib.suppress(NotFound):
        await client.patch(NAMESPACES, name, {"metadata": {"labels": {"pykcm.test/poked": str(time.time_ns())}}})


async def set_spec_finalizers(client: RestClient, name: str, finalizers: list[str]) -> None:
    """What another owner of a namespace finalizer does: PUT the finalize subresource."""
    namespace = await client.get(NAMESPACES, name)
    namespace["spec"]["finalizers"] = finalizers
    await client.update(NAMESPACES, namespace, subresource="finalize")


async def wait_namespace_gone(client: RestClient, name: str, timeout: float = 40.0) -> None:
    await wait_for(lambda: is_gone(client, NAMESPACES, name), timeout, 0.2, f"namespace {name} removed")


async def item_names(client: RestClient, res: Resource, namespace: str) -> list[str]:
    return sorted(item["metadata"]["name"] for item in (await client.list(res, namespace=namespace))["items"])


@contextlib.asynccontextmanager
async def namespace_controller(
    control_plane: ControlPlane, **options: Any
) -> AsyncIterator[tuple[Any, ControllerSpy]]:
    async with running_manager(control_plane.kubeconfig, controllers="namespace", **options) as manager:
        controller = controller_of(manager, "namespace-controller")
        yield controller, ControllerSpy(controller)


# -- scenarios ------------------------------------------------------------------------------------


async def test_scenario_26_deleted_namespace_is_emptied_and_finalized(
    control_plane: ControlPlane, client: RestClient, widgets: Resource, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = await create_namespace(client, "ns26")
    for i in range(3):
        await client.create(CONFIGMAPS, named(f"cm-{i}", data={"k": "v"}), namespace=ns)
        await client.create(SECRETS, named(f"secret-{i}", stringData={"k": "v"}), namespace=ns)
        await client.create(widgets, {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Widget", **named(f"w-{i}")}, ns)
        await client.create(PODS, pod_body(f"pod-{i}"), namespace=ns)
    finalizes: list[tuple[str, str, list[str]]] = []
    original_update = RestClient.update

    async def recording_update(self: RestClient, res: Resource, body: dict, subresource: str | None = None) -> dict:
        if res == NAMESPACES and subresource == "finalize":
            finalizes.append((self.name, body["metadata"]["name"], list(body["spec"]["finalizers"])))
        return await original_update(self, res, body, subresource)

    monkeypatch.setattr(RestClient, "update", recording_update)
    # As KCM runs it in a cluster: with its own ServiceAccount, so its RBAC role must suffice.
    async with namespace_controller(control_plane, use_service_account_credentials=True):
        await client.delete(NAMESPACES, ns)
        terminating = await get_namespace(client, ns)
        assert terminating and terminating["status"]["phase"] == "Terminating"
        await wait_namespace_gone(client, ns)
    # The namespace went through PUT /finalize by the controller, which removed `kubernetes`.
    assert ("namespace-controller", ns, []) in finalizes
    # Had anything survived, it would still be listed here (etcd keeps objects of a removed namespace).
    for res in (CONFIGMAPS, SECRETS, widgets, PODS):
        assert await item_names(client, res, ns) == [], res.name


async def test_scenario_27_acts_only_on_deleted_namespaces_after_five_seconds(
    control_plane: ControlPlane, client: RestClient
) -> None:
    async with namespace_controller(control_plane) as (_, spy):
        alive = await create_namespace(client, "ns27-alive")
        doomed = await create_namespace(client, "ns27")
        await poke(client, alive)
        deleted_at = time.monotonic()
        await client.delete(NAMESPACES, doomed)
        await wait_namespace_gone(client, doomed)
        await poke(client, alive)
    assert (doomed, DELETION_GRACE_PERIOD) in spy.delayed
    first_sync = spy.sync_times(doomed)[0]
    assert first_sync - deleted_at >= DELETION_GRACE_PERIOD - 0.2, "acted before the grace period"
    assert alive not in {key for key, _ in spy.delayed} and spy.outcomes(alive) == []
    live = await client.get(NAMESPACES, alive)
    assert live["status"]["phase"] == "Active" and "conditions" not in live["status"]
    await client.delete(NAMESPACES, alive)


async def test_scenario_28_pods_are_deleted_before_other_content(
    control_plane: ControlPlane, client: RestClient
) -> None:
    ns = await create_namespace(client, "ns28")
    await client.create(PODS, pod_body("held", grace=0, finalizers=[HOLD]), namespace=ns)
    await client.create(CONFIGMAPS, named("cm", data={"k": "v"}), namespace=ns)
    async with namespace_controller(control_plane) as (_, spy):
        await client.delete(NAMESPACES, ns)
        # The pass that found the held pod ends with "come back in 15/2+1 s" ...
        await wait_for(lambda: _has_outcome(spy, ns, "requeue 8"), 20, message="pass with the pod remaining")
        pod = await client.get(PODS, "held", ns)
        assert pod["metadata"].get("deletionTimestamp"), "the pod was not deleted"
        # ... and did not touch the configmap.
        configmap = await client.get(CONFIGMAPS, "cm", ns)
        assert "deletionTimestamp" not in configmap["metadata"]
        assert not any(verb.startswith("error") for verb in spy.outcomes(ns))
        # Release the pod (its finalizer's owner is done); only now does the configmap go.
        await client.patch(PODS, "held", {"metadata": {"finalizers": None}}, ns)
        await poke(client, ns)
        await wait_namespace_gone(client, ns)
    assert await item_names(client, CONFIGMAPS, ns) == []


async def _has_outcome(spy: ControllerSpy, key: str, outcome: str) -> bool:
    return outcome in spy.outcomes(key)


async def test_scenario_29_stuck_finalizer_keeps_namespace_terminating(
    control_plane: ControlPlane, client: RestClient, widgets: Resource
) -> None:
    ns = await create_namespace(client, "ns29")
    widget = {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Widget", **named("stuck", finalizers=[HOLD])}
    await client.create(widgets, widget, ns)
    await client.create(CONFIGMAPS, named("cm"), namespace=ns)
    async with namespace_controller(control_plane) as (_, spy):
        await client.delete(NAMESPACES, ns)
        stuck = await wait_condition_true(client, ns, "NamespaceFinalizersRemaining")
        assert condition(stuck, "NamespaceFinalizersRemaining") == (
            "True", "SomeFinalizersRemain",
            f"Some content in the namespace has finalizers remaining: {HOLD} in 1 resource instances",
        )
        assert condition(stuck, "NamespaceContentRemaining") == (
            "True", "SomeResourcesRemain", "Some resources are remaining: widgets.pykcm.test has 1 resource instances",
        )
        assert stuck["status"]["phase"] == "Terminating" and stuck["spec"]["finalizers"] == ["kubernetes"]
        # Re-checked every 15/2+1 = 8 s, without error backoff. (The first pass's condition write
        # is itself a namespace update, which brings the second pass after the 5 s grace, as in KCM;
        # that pass writes nothing, so the third comes from the 8 s requeue alone.)
        await wait_for(lambda: _synced_times(spy, ns, 3), 25, 0.2, "third pass")
        _, second, third = spy.sync_times(ns)[:3]
        assert 7.5 <= third - second <= 10, third - second
        assert spy.outcomes(ns)[:3] == ["requeue 8"] * 3 and ns not in spy.rate_limited
        # The finalizer's owner lets go: the namespace finishes.
        await client.patch(widgets, "stuck", {"metadata": {"finalizers": None}}, ns,
                           content_type="application/merge-patch+json")
        await poke(client, ns)
        await wait_namespace_gone(client, ns)


async def _synced_times(spy: ControllerSpy, key: str, count: int) -> bool:
    return len(spy.sync_times(key)) >= count


UNAVAILABLE_GROUP = "unavailable.pykcm.test"


@contextlib.asynccontextmanager
async def unavailable_apiservice(client: RestClient) -> AsyncIterator[str]:
    """An APIService backed by a Service without endpoints: discovery marks its group stale."""
    name = f"v1.{UNAVAILABLE_GROUP}"
    home = await create_namespace(client, "ns30-svc", service_account=False)
    await client.create(SERVICES, named("nothing", spec={"ports": [{"port": 443}]}), namespace=home)
    body = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": name},
        "spec": {
            "group": UNAVAILABLE_GROUP, "version": "v1", "groupPriorityMinimum": 100, "versionPriority": 100,
            "service": {"namespace": home, "name": "nothing", "port": 443}, "insecureSkipTLSVerify": True,
        },
    }
    await client.create(APISERVICES, body)
    try:
        async def failing() -> bool:
            return bool((await server_preferred_namespaced_resources(client)).failed)

        await wait_for(failing, 20, 0.2, f"{UNAVAILABLE_GROUP} failing discovery")
        yield name
    finally:
        with contextlib.suppress(NotFound):
            await client.delete(APISERVICES, name)
        await client.delete(NAMESPACES, home)


async def test_scenario_30_unavailable_apiservice_blocks_only_finalization(
    control_plane: ControlPlane, client: RestClient
) -> None:
    ns = await create_namespace(client, "ns30")
    await client.create(CONFIGMAPS, named("cm"), namespace=ns)
    async with unavailable_apiservice(client) as apiservice, namespace_controller(control_plane) as (_, spy):
        await client.delete(NAMESPACES, ns)
        stuck = await wait_condition_true(client, ns, "NamespaceDeletionDiscoveryFailure")
        gv = f"{UNAVAILABLE_GROUP}/v1"
        assert condition(stuck, "NamespaceDeletionDiscoveryFailure") == (
            "True", "DiscoveryFailed",
            "Discovery failed for some groups, 1 failing: unable to retrieve the complete list of server APIs: "
            f"{gv}: stale GroupVersion discovery: {gv}",
        )
        # Everything that could be deleted was; the finalizer stays while discovery fails.
        assert await item_names(client, CONFIGMAPS, ns) == []
        assert stuck["spec"]["finalizers"] == ["kubernetes"]
        assert ns in spy.rate_limited  # an error: retried with backoff
        # Discovery recovers: the next pass finishes the namespace.
        await client.delete(APISERVICES, apiservice)
        await poke(client, ns)
        await wait_namespace_gone(client, ns)


async def test_scenario_31_graceful_pods_requeue_after_half_their_grace_period(
    control_plane: ControlPlane, client: RestClient
) -> None:
    ns = await create_namespace(client, "ns31")
    for name in ("web-0", "web-1"):
        pod = await client.create(PODS, pod_body(name, node="node-a", grace=30), namespace=ns)
        pod["status"] = {"phase": "Running"}
        await client.update(PODS, pod, subresource="status")  # the kubelet reports it running
    async with namespace_controller(control_plane) as (controller, spy):
        await client.delete(NAMESPACES, ns)
        await wait_for(lambda: _has_outcome(spy, ns, "requeue 16"), 20, 0.1, "requeue after 16 s")
        assert (ns, 16) in spy.delayed  # 30 / 2 + 1
        assert ns not in spy.rate_limited and controller.queue.num_requeues(ns) == 0
        for name in ("web-0", "web-1"):
            pod = await client.get(PODS, name, ns)
            assert pod["metadata"]["deletionTimestamp"] and pod["metadata"]["deletionGracePeriodSeconds"] == 30
        # Play the kubelet: the containers stopped, the pods go.
        for name in ("web-0", "web-1"):
            await client.delete(PODS, name, ns, body={"gracePeriodSeconds": 0})
        await poke(client, ns)
        await wait_namespace_gone(client, ns)


async def test_scenario_32_only_the_kubernetes_finalizer_is_removed(
    control_plane: ControlPlane, client: RestClient
) -> None:
    ns = await create_namespace(client, "ns32")
    other = "example.com/x"
    await set_spec_finalizers(client, ns, ["kubernetes", other])
    await client.create(CONFIGMAPS, named("cm"), namespace=ns)
    async with namespace_controller(control_plane):
        await client.delete(NAMESPACES, ns)

        async def released() -> dict[str, Any] | None:
            current = await get_namespace(client, ns)
            return current if current and current["spec"].get("finalizers") == [other] else None

        remaining = await wait_for(released, 20, 0.2, "kubernetes finalizer removed")
        assert remaining["status"]["phase"] == "Terminating"
        assert await item_names(client, CONFIGMAPS, ns) == []
        # The other owner finishes: the API server removes the namespace.
        await set_spec_finalizers(client, ns, [])
        await wait_namespace_gone(client, ns, 10)


async def test_scenario_33_type_without_deletecollection_is_deleted_item_by_item(
    control_plane: ControlPlane, client: RestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In 1.36 every built-in namespaced type that can be deleted also has deletecollection (the
    # create-only bindings and localsubjectaccessreviews are skipped earlier), so the fallback is
    # driven by marking configmaps unsupported in the deleter's cache, exactly what a discovery
    # entry without the verb does; the LIST and DELETEs then go to the real API server.
    found = await server_preferred_namespaced_resources(client)
    lacking = [(rl.group_version, r.name) for rl in found.resources for r in rl.resources
               if r.supports("delete") and not r.supports("deletecollection")]
    assert lacking == [], f"a real type lacks deletecollection now, use it instead: {lacking}"

    ns = await create_namespace(client, "ns33")
    for i in range(3):
        await client.create(CONFIGMAPS, named(f"cm-{i}"), namespace=ns)
        await client.create(SECRETS, named(f"secret-{i}"), namespace=ns)
    requests: list[tuple[str, str]] = []
    original_request = RestClient.request

    async def recording_request(self: RestClient, method: str, path: str, **kw: Any) -> Any:
        if self.name == "namespace-controller" and f"/namespaces/{ns}/" in path:
            requests.append((method, path))
        return await original_request(self, method, path, **kw)

    monkeypatch.setattr(RestClient, "request", recording_request)
    async with namespace_controller(control_plane) as (controller, _):
        controller.deleter.op_cache.set_not_supported("deletecollection", _gvr(CONFIGMAPS))
        await client.delete(NAMESPACES, ns)
        await wait_namespace_gone(client, ns)
    configmaps = f"/api/v1/namespaces/{ns}/configmaps"
    deletes = [path for method, path in requests if method == "DELETE"]
    assert configmaps not in deletes
    assert sorted(p for p in deletes if p.startswith(configmaps)) == [f"{configmaps}/cm-{i}" for i in range(3)]
    assert f"/api/v1/namespaces/{ns}/secrets" in deletes  # the others still go as one collection


def _gvr(res: Resource) -> GroupVersionResource:
    return GroupVersionResource(res.group, res.version, res.plural)


async def test_scenario_34_clean_pass_reports_all_conditions_ok(
    control_plane: ControlPlane, client: RestClient
) -> None:
    ns = await create_namespace(client, "ns34")
    await set_spec_finalizers(client, ns, ["kubernetes", "example.com/keep"])  # keeps it readable afterwards
    await client.create(CONFIGMAPS, named("cm"), namespace=ns)
    async with namespace_controller(control_plane):
        await client.delete(NAMESPACES, ns)

        async def finalized() -> dict[str, Any] | None:
            current = await get_namespace(client, ns)
            return current if current and current["spec"].get("finalizers") == ["example.com/keep"] else None

        done = await wait_for(finalized, 20, 0.2, "kubernetes finalizer removed")
        assert conditions(done) == OK_CONDITIONS
        await set_spec_finalizers(client, ns, [])
        await wait_namespace_gone(client, ns, 10)
