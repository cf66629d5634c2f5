"""pykcm against an apiserver served under a path prefix (Rancher-style
https://host/k8s/clusters/c-x): every request, from the health probe to watches, discovery,
leader election, token requests and delegated reviews, keeps the prefix."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from pykcm.client.resources import NAMESPACES, PODS, REPLICASETS, SERVICEACCOUNTS
from pykcm.testenv.controlplane import ControlPlane
from tests.prefix_proxy import prefix_proxy, proxy_kubeconfig
from tests.support import (
    CONTROLLER_KUBECONFIG_ENV,
    admin_client,
    create_namespace,
    free_port,
    https_get,
    replicaset_manifest,
    running_manager,
    wait_for,
)

pytestmark = pytest.mark.integration


async def test_every_request_keeps_the_server_path_prefix(control_plane: ControlPlane, tmp_path: Path) -> None:
    if os.environ.get(CONTROLLER_KUBECONFIG_ENV):
        pytest.skip("the proxy authenticates as the admin; the deploy-credentials mode does not apply")
    client = admin_client(control_plane.kubeconfig)
    port = free_port()
    ns = await create_namespace(client, "prefix")
    try:
        async with prefix_proxy(control_plane) as proxy:
            kubeconfig = proxy_kubeconfig(tmp_path / "kubeconfig", proxy.url)
            options = {
                "leader_elect": True, "leader_elect_resource_name": f"prefix-{uuid.uuid4().hex[:8]}",
                "use_service_account_credentials": True, "secure_port": port, "bind_address": "127.0.0.1",
            }
            async with running_manager(kubeconfig, "replicaset,namespace,serviceaccount", **options):
                await client.create(REPLICASETS, replicaset_manifest("web", 2), namespace=ns)

                async def two_pods() -> bool:
                    return len((await client.list(PODS, namespace=ns))["items"]) == 2

                await wait_for(two_pods, message="2 pods created through the prefixed server")
                # A bearer token at the secure port: TokenReview and SubjectAccessReview go through it too.
                request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
                token = (await client.request("POST", SERVICEACCOUNTS.path(ns, "default", "token"), body=request))
                status, _ = await https_get(f"https://127.0.0.1:{port}/metrics", token=token["status"]["token"])
                assert status == 403  # authenticated (else 401), then denied by the apiserver's RBAC
        assert proxy.outside_prefix() == []
        asked = {p.removeprefix(proxy.prefix) for p in proxy.paths}
        assert "/healthz" in asked
        assert any(p.startswith("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/") for p in asked)
        assert any(p.endswith("/token") for p in asked)  # per-controller service account tokens
        reviews = {"/apis/authentication.k8s.io/v1/tokenreviews", "/apis/authorization.k8s.io/v1/subjectaccessreviews"}
        assert reviews <= asked
        assert "/api" in asked and "/apis" in asked  # discovery (the namespace controller)
    finally:
        await client.delete(NAMESPACES, ns)
        await client.close()
