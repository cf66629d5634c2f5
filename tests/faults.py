"""Helpers of the fault tests (tests/integration/test_faults*.py): an apiserver audit log to
count who wrote what, per-process credentials so writes can be told apart, and a watcher that
samples a ReplicaSet's pods to prove nothing was lost or created twice."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pykcm.client.errors import AlreadyExists
from pykcm.client.resources import CLUSTERROLEBINDINGS, PODS, REPLICASETS, SERVICEACCOUNTS
from pykcm.client.rest import RestClient
from pykcm.testenv.controlplane import ControlPlane
from tests.support import wait_for

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
# Metadata of every write, nothing for reads; RequestReceived is skipped, so one line per write.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "verbs": sorted(WRITE_VERBS)}, {"level": "None"}],
}


def audit_args(directory: Path) -> list[str]:
    """kube-apiserver flags that write the audit log to `directory`/audit.log (synchronously)."""
    directory.mkdir(parents=True, exist_ok=True)
    policy = directory / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    return [f"--audit-policy-file={policy}", f"--audit-log-path={directory / 'audit.log'}", "--audit-log-mode=blocking"]


@dataclass(frozen=True)
class AuditWrite:
    user: str
    verb: str
    resource: str
    namespace: str
    name: str
    received: datetime.datetime
    code: int


def audit_writes(log: Path) -> list[AuditWrite]:
    writes = []
    for line in log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        writes.append(AuditWrite(
            event["user"]["username"], event["verb"], ref.get("resource", ""), ref.get("namespace", ""),
            ref.get("name", ""), datetime.datetime.fromisoformat(event["requestReceivedTimestamp"]),
            int((event.get("responseStatus") or {}).get("code") or 0),
        ))
    return writes


async def admin_token_kubeconfig(client: RestClient, plane: ControlPlane, name: str, path: Path) -> str:
    """A kubeconfig for a cluster-admin ServiceAccount `kube-system/name` (so the audit log names
    the process using it); returns the username the apiserver sees."""
    with contextlib.suppress(AlreadyExists):
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        await client.create(SERVICEACCOUNTS, body, namespace="kube-system")
    with contextlib.suppress(AlreadyExists):
        await client.create(CLUSTERROLEBINDINGS, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}],
        })
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}}
    answer = await client.request("POST", SERVICEACCOUNTS.path("kube-system", name, "token"), body=request)
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": plane.apiserver_url,
            "certificate-authority-data": base64.b64encode(plane.pki.ca_cert.read_bytes()).decode(),
        }}],
        "users": [{"name": name, "user": {"token": answer["status"]["token"]}}],
        "contexts": [{"name": name, "context": {"cluster": "local", "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config))
    return f"system:serviceaccount:kube-system:{name}"


@dataclass
class PodSampler:
    """Samples the live pods of one ReplicaSet (label app=<name>) every `interval` seconds and once
    more when the block ends: the most ever seen at once, and every pod name ever seen (each name
    is one create)."""

    client: RestClient
    namespace: str
    name: str
    interval: float = 0.1
    most: int = 0
    names: set[str] = field(default_factory=set)
    errors: int = 0
    _task: asyncio.Task[None] | None = None

    async def sample(self) -> None:
        try:
            pods = await self.client.list(PODS, self.namespace, labelSelector=f"app={self.name}")
        except Exception:  # the apiserver is down in some faults: sampling resumes with it
            self.errors += 1
        else:
            live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
            self.most = max(self.most, len(live))
            self.names.update(p["metadata"]["name"] for p in pods["items"])

    async def _run(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.interval)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[PodSampler]:
        self._task = asyncio.create_task(self._run())
        try:
            yield self
        finally:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.sample()  # the state the block ended in, which the last interval may have missed


async def converged(client: RestClient, namespace: str, name: str) -> bool:
    """spec.replicas live pods and a status that says so, for the ReplicaSet's current generation."""
    rs = await client.get(REPLICASETS, name, namespace)
    pods = await client.list(PODS, namespace, labelSelector=f"app={name}")
    live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    status = rs.get("status") or {}
    want = rs["spec"]["replicas"]
    return (
        len(live) == want and status.get("replicas") == want
        and status.get("observedGeneration") == rs["metadata"]["generation"]
    )


async def wait_converged(client: RestClient, namespace: str, name: str, timeout: float = 60.0) -> float:
    """Seconds until the ReplicaSet has converged (see converged())."""
    start = time.monotonic()
    await wait_for(lambda: converged(client, namespace, name), timeout, 0.1, f"{namespace}/{name} converged")
    return time.monotonic() - start


def report(fault: str, recovery: float) -> None:
    """One line per fault with its measured recovery time (shown with pytest -s; the README's table)."""
    print(f"\n[faults] {fault}: recovered in {recovery:.1f}s")
