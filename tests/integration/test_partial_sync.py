"""One informer that cannot sync stops only the controllers that need it, as KCM waits for
caches per controller: with an identity allowed everything but `list` and `watch` on
serviceaccounts (a 1.36 apiserver authorizes a streamed list as `watch` alone), the
ReplicaSet controller works, the ServiceAccount controller says why it cannot start (one line,
periodically) and fails its own /healthz check, and /livez stays green."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from pathlib import Path

import pytest
import yaml

from pykcm.app.manager import Manager
from pykcm.app.options import Options
from pykcm.client.config import load_config
from pykcm.client.errors import NotFound
from pykcm.client.resources import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    NAMESPACES,
    PODS,
    REPLICASETS,
    SERVICEACCOUNTS,
    Resource,
)
from pykcm.client.rest import RestClient
from pykcm.controllers.replicaset import ReplicaSetController
from pykcm.controllers.serviceaccount import ServiceAccountController
from pykcm.testenv.controlplane import ControlPlane
from tests.support import admin_client, create_namespace, free_port, https_get, replicaset_manifest, wait_for

pytestmark = pytest.mark.integration

ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")

# What the ReplicaSet and ServiceAccount controllers, events and delegated auth need (deploy/rbac.yaml),
# except `list` and `watch` on serviceaccounts: the informer streams its initial state with a watch,
# which the apiserver authorizes as `watch` alone, and falls back to a LIST when that is refused.
RULES = [
    {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "create"]},
    {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "patch"]},
    {"apiGroups": ["apps"], "resources": ["replicasets/status", "replicasets/finalizers"], "verbs": ["update"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
]


def binding(kind: str, name: str, role_kind: str, role: str, subject: dict, namespace: str | None = None) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [subject],
    }


@contextlib.asynccontextmanager
async def restricted_identity(plane: ControlPlane, client: RestClient, tmp_path: Path):
    """A ServiceAccount with RULES (and delegated-auth rights); yields a kubeconfig holding its token."""
    ns = await create_namespace(client, "rbac")
    name = f"pykcm-no-sa-list-watch-{uuid.uuid4().hex[:6]}"
    subject = {"kind": "ServiceAccount", "name": "pykcm", "namespace": ns}
    await client.create(SERVICEACCOUNTS, {"metadata": {"name": "pykcm"}}, namespace=ns)
    await client.create(CLUSTERROLES, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                       "metadata": {"name": name}, "rules": RULES})
    await client.create(CLUSTERROLEBINDINGS, binding("ClusterRoleBinding", name, "ClusterRole", name, subject))
    await client.create(CLUSTERROLEBINDINGS, binding(
        "ClusterRoleBinding", f"{name}-auth", "ClusterRole", "system:auth-delegator", subject))
    await client.create(ROLEBINDINGS, binding(
        "RoleBinding", name, "Role", "extension-apiserver-authentication-reader", subject, "kube-system"),
        namespace="kube-system")
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    token = (await client.request("POST", SERVICEACCOUNTS.path(ns, "pykcm", "token"), body=request))["status"]["token"]
    kubeconfig = tmp_path / "restricted.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": plane.apiserver_url,
            "certificate-authority-data": base64.b64encode(plane.pki.ca_cert.read_bytes()).decode()}}],
        "users": [{"name": "pykcm", "user": {"token": token}}],
        "contexts": [{"name": "pykcm", "context": {"cluster": "local", "user": "pykcm"}}],
        "current-context": "pykcm",
    }))
    try:
        yield kubeconfig
    finally:
        for res, obj, namespace in ((CLUSTERROLEBINDINGS, name, None), (CLUSTERROLEBINDINGS, f"{name}-auth", None),
                                    (CLUSTERROLES, name, None), (ROLEBINDINGS, name, "kube-system"),
                                    (NAMESPACES, ns, None)):
            with contextlib.suppress(NotFound):
                await client.delete(res, obj, namespace)


async def test_an_informer_that_cannot_sync_stops_only_its_controller(
    control_plane: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pykcm")
    client = admin_client(control_plane.kubeconfig)
    port = free_port()
    admin = (control_plane.pki.admin_cert, control_plane.pki.admin_key)
    try:
        async with restricted_identity(control_plane, client, tmp_path) as kubeconfig:
            options = Options(
                kubeconfig=str(kubeconfig), leader_elect=False, secure_port=port, bind_address="127.0.0.1"
            )
            manager = Manager(options, load_config(str(kubeconfig)), [ReplicaSetController, ServiceAccountController])
            stop = asyncio.Event()
            task = asyncio.create_task(manager.run(stop))
            url = f"https://127.0.0.1:{port}"
            try:
                ns = await create_namespace(client, "partial")
                await client.create(REPLICASETS, replicaset_manifest("web", 2), namespace=ns)

                async def two_pods() -> bool:
                    assert not task.done(), task
                    return len((await client.list(PODS, namespace=ns))["items"]) == 2

                await wait_for(two_pods, timeout=60, message="the ReplicaSet controller creating 2 pods")

                def cannot_start_lines() -> list[logging.LogRecord]:
                    return [r for r in caplog.records if getattr(r, "kv", {}).get("controller")
                            == "serviceaccount-controller" and "reason" in getattr(r, "kv", {})]

                async def reported() -> list[logging.LogRecord]:
                    return cannot_start_lines()

                (line, *_) = await wait_for(reported, timeout=30, message="a line on the blocked controller")
                assert line.kv["resource"] == "serviceaccounts"  # type: ignore[attr-defined]
                assert "forbidden" in line.kv["reason"] and "\n" not in line.kv["reason"]  # type: ignore[attr-defined]
                assert line.exc_info is None

                status, body = await https_get(f"{url}/healthz/serviceaccount-controller", cert=admin)
                assert status == 500 and "serviceaccounts" in body and "forbidden" in body
                assert await https_get(f"{url}/healthz/replicaset-controller", cert=admin) == (200, "ok")
                status, body = await https_get(f"{url}/healthz")
                assert status == 500 and "[-]serviceaccount-controller failed" in body
                assert "[+]replicaset-controller ok" in body
                assert await https_get(f"{url}/livez") == (200, "ok")
                assert not manager.synced.is_set()
            finally:
                stop.set()
                await asyncio.wait_for(task, 60)
    finally:
        await client.close()
