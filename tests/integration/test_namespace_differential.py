"""pykcm's namespace controller next to the real kube-controller-manager v1.36.3.

The same two cases run twice on the session's control plane, first under the real KCM
(`--controllers=namespace,serviceaccount`), then, after KCM has stopped, under pykcm; the two
never act at the same time. Compared: what is left in each namespace, its phase, finalizers and
the deletion conditions (type, status, reason, message).

- clean: pods, configmaps, secrets, a ReplicaSet and custom resources; the namespace carries a
  second spec finalizer so it can still be read after `kubernetes` is released.
- stuck: a custom resource with a finalizer nobody removes.
- held: a pod with a finalizer and a configmap; ordered deletion keeps the configmap while the
  pod remains (and KCM reports no remaining content in that state, which pykcm must copy).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pykcm.client.resources import CONFIGMAPS, NAMESPACES, PODS, REPLICASETS, SECRETS, Resource
from pykcm.client.rest import RestClient
from pykcm.testenv.controlplane import ControlPlane
from tests.integration.test_namespace import (
    CRD_GROUP,
    HOLD,
    conditions,
    get_namespace,
    named,
    pod_body,
    set_spec_finalizers,
    wait_namespace_gone,
)
from tests.support import admin_client, create_namespace, ensure_crd, running_manager, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kcm]

KEEP = "example.com/keep"


@pytest.fixture
async def client(control_plane: ControlPlane) -> AsyncIterator[RestClient]:
    api = admin_client(control_plane.kubeconfig)
    yield api
    await api.close()


def widget(name: str, finalizers: list[str] | None = None) -> dict[str, Any]:
    return {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Widget", **named(name, finalizers)}


def replicaset(name: str) -> dict[str, Any]:
    labels = {"app": name}
    template = {"metadata": {"labels": labels}, "spec": pod_body(name)["spec"]}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
            "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": template}}


async def make_clean_case(client: RestClient, widgets: Resource, who: str) -> str:
    ns = await create_namespace(client, f"diff-clean-{who}")
    await set_spec_finalizers(client, ns, ["kubernetes", KEEP])
    for i in range(3):
        await client.create(PODS, pod_body(f"pod-{i}"), namespace=ns)
        await client.create(CONFIGMAPS, named(f"cm-{i}", data={"k": "v"}), namespace=ns)
        await client.create(SECRETS, named(f"secret-{i}", stringData={"k": "v"}), namespace=ns)
        await client.create(widgets, widget(f"w-{i}"), ns)
    await client.create(REPLICASETS, replicaset("web"), namespace=ns)
    return ns


async def make_stuck_case(client: RestClient, widgets: Resource, who: str) -> str:
    ns = await create_namespace(client, f"diff-stuck-{who}")
    await client.create(widgets, widget("stuck", [HOLD]), ns)
    await client.create(widgets, widget("free"), ns)
    await client.create(CONFIGMAPS, named("cm"), namespace=ns)
    return ns


async def make_held_case(client: RestClient, who: str) -> str:
    ns = await create_namespace(client, f"diff-held-{who}")
    await client.create(PODS, pod_body("held", grace=0, finalizers=[HOLD]), namespace=ns)
    await client.create(CONFIGMAPS, named("cm"), namespace=ns)
    return ns


async def observe(client: RestClient, widgets: Resource, ns: str) -> dict[str, Any]:
    namespace = await get_namespace(client, ns)
    assert namespace is not None
    content = {}
    for res in (PODS, CONFIGMAPS, SECRETS, REPLICASETS, widgets):
        items = (await client.list(res, namespace=ns))["items"]
        content[res.name] = sorted(i["metadata"]["name"] for i in items)
    return {
        "phase": namespace["status"]["phase"],
        "finalizers": namespace["spec"].get("finalizers"),
        "conditions": conditions(namespace),
        "content": content,
    }


async def run_cases(client: RestClient, widgets: Resource, who: str) -> tuple[dict[str, Any], list[str]]:
    """Build both cases, delete them, wait until the controller has settled each; observe."""
    clean = await make_clean_case(client, widgets, who)
    stuck = await make_stuck_case(client, widgets, who)
    held = await make_held_case(client, who)
    for ns in (clean, stuck, held):
        await client.delete(NAMESPACES, ns)

    async def clean_released() -> bool:
        current = await get_namespace(client, clean)
        return bool(current) and current["spec"].get("finalizers") == [KEEP]

    async def stuck_reported() -> bool:
        found = {t: s for t, s, _, _ in conditions(await get_namespace(client, stuck))}
        return found.get("NamespaceFinalizersRemaining") == "True"

    async def held_reported() -> bool:
        return len(conditions(await get_namespace(client, held))) == 5

    await wait_for(clean_released, 40, 0.2, f"{who}: kubernetes finalizer released from {clean}")
    await wait_for(stuck_reported, 40, 0.2, f"{who}: finalizers reported on {stuck}")
    await wait_for(held_reported, 40, 0.2, f"{who}: conditions written on {held}")
    return {
        "clean": await observe(client, widgets, clean),
        "stuck": await observe(client, widgets, stuck),
        "held": await observe(client, widgets, held),
    }, [clean, stuck, held]


async def test_namespace_deletion_matches_real_kcm(control_plane: ControlPlane, client: RestClient) -> None:
    widgets = await ensure_crd(client, CRD_GROUP, "Widget", "widgets")
    kcm = await asyncio.to_thread(control_plane.start_kcm, "namespace,serviceaccount")
    try:
        by_kcm, kcm_namespaces = await run_cases(client, widgets, "kcm")
    finally:
        await asyncio.to_thread(control_plane.stop_kcm, kcm)
    kcm_stuck_before = await get_namespace(client, kcm_namespaces[1])

    async with running_manager(control_plane.kubeconfig, controllers="namespace,serviceaccount"):
        by_pykcm, pykcm_namespaces = await run_cases(client, widgets, "pykcm")
        # pykcm, now looking after KCM's stuck namespace as well, finds nothing to change there:
        # same conditions, down to their transition times.
        assert (await get_namespace(client, kcm_namespaces[1]))["status"] == kcm_stuck_before["status"]
        # Let every namespace finish: the finalizer owners are done.
        for clean, stuck, held in (kcm_namespaces, pykcm_namespaces):
            await client.patch(widgets, "stuck", {"metadata": {"finalizers": None}}, stuck,
                               content_type="application/merge-patch+json")
            await client.patch(PODS, "held", {"metadata": {"finalizers": None}}, held)
            await set_spec_finalizers(client, clean, [])
        for ns in (*kcm_namespaces, *pykcm_namespaces):
            await wait_namespace_gone(client, ns)

    assert by_pykcm == by_kcm
    # What KCM produced, spelled out (so a change on either side is visible in the diff).
    assert by_kcm["clean"]["content"] == {name: [] for name in by_kcm["clean"]["content"]}
    assert [c[:3] for c in by_kcm["stuck"]["conditions"]] == [
        ("NamespaceDeletionDiscoveryFailure", "False", "ResourcesDiscovered"),
        ("NamespaceDeletionGroupVersionParsingFailure", "False", "ParsedGroupVersions"),
        ("NamespaceDeletionContentFailure", "False", "ContentDeleted"),
        ("NamespaceContentRemaining", "True", "SomeResourcesRemain"),
        ("NamespaceFinalizersRemaining", "True", "SomeFinalizersRemain"),
    ]
    assert by_kcm["stuck"]["content"]["widgets.pykcm.test"] == ["stuck"]
    assert by_kcm["held"]["content"]["pods"] == ["held"] and by_kcm["held"]["content"]["configmaps"] == ["cm"]
