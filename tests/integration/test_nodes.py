"""The local cluster with nodes: what a user of `pykcm run --local` does, on the session's cluster
(kube-controller-manager without pykcm's three controllers, kube-scheduler, kwok nodes) with
pykcm running its controllers."""

from __future__ import annotations

import pytest

from pykcm.client.resources import DEPLOYMENTS, NAMESPACES, NODES, PODS, REPLICASETS, SERVICEACCOUNTS
from pykcm.client.rest import RestClient
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.nodes import KCM_CONTROLLERS
from tests.support import create_namespace, is_gone, running_manager, wait_for

pytestmark = pytest.mark.nodes


def deployment(name: str, replicas: int, image: str = "nginx") -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "web", "image": image}]}},
        },
    }


async def ready_pods(client: RestClient, namespace: str, app: str) -> list[dict]:
    pods = (await client.list(PODS, namespace=namespace, labelSelector=f"app={app}"))["items"]
    return [
        p for p in pods
        if p["status"].get("phase") == "Running"
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        and not p["metadata"].get("deletionTimestamp")
    ]


async def available(client: RestClient, namespace: str, name: str, replicas: int) -> bool:
    status = (await client.get(DEPLOYMENTS, name, namespace=namespace)).get("status", {})
    return status.get("availableReplicas") == replicas and status.get("updatedReplicas") == replicas


async def test_nodes_are_ready_and_untainted(nodes_client: RestClient) -> None:
    # kwok lifts each node's not-ready taint on its own: wait for all three, not the first.
    async def all_schedulable() -> list[dict] | None:
        nodes = (await nodes_client.list(NODES, labelSelector="kwok.x-k8s.io/node=fake"))["items"]
        untainted = [n for n in nodes if not n["spec"].get("taints")]
        return untainted if len(untainted) == 3 else None

    assert len(await wait_for(all_schedulable, timeout=180, message="three untainted kwok nodes")) == 3


async def test_a_deployment_gets_ready_pods_scales_and_is_garbage_collected(
    cluster_with_nodes: ControlPlane, nodes_client: RestClient
) -> None:
    namespace = await create_namespace(nodes_client, "web")
    async with running_manager(cluster_with_nodes.kubeconfig):
        await nodes_client.create(DEPLOYMENTS, deployment("web", 3), namespace=namespace)
        await wait_for(lambda: available(nodes_client, namespace, "web", 3), timeout=90, message="3 available replicas")
        pods = await ready_pods(nodes_client, namespace, "web")
        assert len(pods) == 3 and all(p["spec"].get("nodeName") and p["status"].get("podIP") for p in pods)

        await nodes_client.patch(DEPLOYMENTS, "web", {"spec": {"replicas": 5}}, namespace=namespace)
        await wait_for(lambda: available(nodes_client, namespace, "web", 5), timeout=90, message="5 available replicas")

        await nodes_client.delete(DEPLOYMENTS, "web", namespace=namespace)

        async def no_pods_or_replicasets() -> bool:
            left = await nodes_client.list(PODS, namespace=namespace)
            sets = await nodes_client.list(REPLICASETS, namespace=namespace)
            return not left["items"] and not sets["items"]

        await wait_for(no_pods_or_replicasets, timeout=120, message="the garbage collector removing pods")


async def test_a_namespace_with_workloads_is_drained_and_a_new_one_gets_its_service_account(
    cluster_with_nodes: ControlPlane, nodes_client: RestClient
) -> None:
    async with running_manager(cluster_with_nodes.kubeconfig):
        namespace = await create_namespace(nodes_client, "drain", service_account=False)
        await wait_for(lambda: _has_default_sa(nodes_client, namespace), timeout=30, message="default ServiceAccount")
        await nodes_client.create(DEPLOYMENTS, deployment("app", 4), namespace=namespace)
        await wait_for(lambda: available(nodes_client, namespace, "app", 4), timeout=90, message="4 available replicas")
        await nodes_client.delete(NAMESPACES, namespace)
        await wait_for(lambda: is_gone(nodes_client, NAMESPACES, namespace), timeout=120, message="the namespace gone")


async def _has_default_sa(client: RestClient, namespace: str) -> bool:
    accounts = await client.list(SERVICEACCOUNTS, namespace=namespace)
    return any(a["metadata"]["name"] == "default" for a in accounts["items"])


def test_kcm_runs_every_controller_but_pykcms(cluster_with_nodes: ControlPlane) -> None:
    [kcm] = cluster_with_nodes.kcm_processes()
    log = kcm.log_path.read_text(errors="replace")
    assert f"--controllers={KCM_CONTROLLERS}" in log
    for name in ("replicaset-controller", "namespace-controller", "serviceaccount-controller"):
        assert f'"Warning: controller is disabled" controller="{name}"' in log
