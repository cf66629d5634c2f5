"""Faults of the API side while pykcm scales a ReplicaSet: the apiserver unreachable for 30 s,
429 and 503 storms, an etcd restart, certificates rotated, and the namespace deleted mid-scale. Each asserts that
nothing is lost (the ReplicaSet converges, status written) and nothing is created twice (never
more live pods than spec at any sampled moment, and exactly one pod name per needed create),
and prints the recovery time: from the end of the fault until converged.

pykcm runs in-process, without leader election (a 30 s outage costs a leader its lease, and
it exits, which is test_faults_leader.py's business), against a control plane of its own,
through tests/prefix_proxy.py where the fault is on the network path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

from pykcm.client import rest
from pykcm.client.errors import NotFound
from pykcm.client.resources import CLUSTERROLEBINDINGS, NAMESPACES, REPLICASETS
from pykcm.client.rest import RestClient
from pykcm.testenv.certs import issue_certificate
from pykcm.testenv.controlplane import ETCD, ControlPlane
from tests.faults import PodSampler, report, wait_converged
from tests.prefix_proxy import PrefixProxy, prefix_proxy, proxy_kubeconfig
from tests.support import (
    CONTROLLER_KUBECONFIG_ENV,
    create_namespace,
    is_gone,
    replicaset_manifest,
    running_manager,
    wait_for,
)

pytestmark = pytest.mark.integration

START, SCALED = 3, 12
OUTAGE = 30.0
STORM = 10.0


@pytest.fixture
async def proxied(own_plane: ControlPlane, tmp_path: Path) -> AsyncIterator[tuple[PrefixProxy, Path]]:
    if os.environ.get(CONTROLLER_KUBECONFIG_ENV):
        pytest.skip("the proxy authenticates as the admin; the deploy-credentials mode does not apply")
    async with prefix_proxy(own_plane, prefix="") as proxy:
        yield proxy, proxy_kubeconfig(tmp_path / "kubeconfig", proxy.url)


async def scale_through_fault(
    admin: RestClient, kubeconfig: Path, fault: Callable[[], Awaitable[None]], name: str
) -> tuple[PodSampler, float]:
    """pykcm converges START pods; then the fault starts, the ReplicaSet is scaled to SCALED, the
    fault ends (when `fault` returns); returns the sampler and the recovery time."""
    namespace = await create_namespace(admin, "faults")
    async with running_manager(kubeconfig, "replicaset"):
        await admin.create(REPLICASETS, replicaset_manifest(name, START), namespace=namespace)
        await wait_converged(admin, namespace, name)
        async with PodSampler(admin, namespace, name).running() as sampler:
            await fault()
            recovery = await wait_converged(admin, namespace, name, timeout=120)
    assert sampler.most <= SCALED, f"{sampler.most} live pods for spec {SCALED}"
    assert len(sampler.names) == SCALED, f"{len(sampler.names)} pods created for {SCALED}"
    return sampler, recovery


async def scale(admin: RestClient, name: str) -> None:
    rs = next(r for r in (await admin.list(REPLICASETS))["items"] if r["metadata"]["name"] == name)
    await admin.patch(REPLICASETS, name, {"spec": {"replicas": SCALED}}, rs["metadata"]["namespace"])


async def test_apiserver_unreachable_for_30s(own_client: RestClient, proxied: tuple[PrefixProxy, Path]) -> None:
    proxy, kubeconfig = proxied

    async def outage() -> None:
        proxy.partition()
        await scale(own_client, "unreachable")
        await asyncio.sleep(OUTAGE)
        proxy.heal()

    _, recovery = await scale_through_fault(own_client, kubeconfig, outage, "unreachable")
    report(f"apiserver unreachable for {OUTAGE:g}s", recovery)


@pytest.mark.parametrize("code", [429, 503])
async def test_status_storm(own_client: RestClient, proxied: tuple[PrefixProxy, Path], code: int) -> None:
    proxy, kubeconfig = proxied
    name = f"storm-{code}"

    async def storm() -> None:
        proxy.storm(code)
        await scale(own_client, name)
        await asyncio.sleep(STORM)
        proxy.calm()

    _, recovery = await scale_through_fault(own_client, kubeconfig, storm, name)
    assert proxy.stormed > 0
    report(f"{code} on every request for {STORM:g}s", recovery)


async def test_etcd_restart_mid_scale(own_plane: ControlPlane, own_client: RestClient) -> None:
    async def restart_etcd() -> None:
        await scale(own_client, "etcd")
        await asyncio.sleep(0.3)  # pykcm is creating
        etcd = own_plane.processes[ETCD]
        await asyncio.to_thread(etcd.stop)
        await asyncio.sleep(5)
        assert await asyncio.to_thread(own_plane.revive) == [ETCD]  # same data dir and ports; the apiserver reconnects

    _, recovery = await scale_through_fault(own_client, own_plane.kubeconfig, restart_etcd, "etcd")
    report("etcd restarted mid-scale (down 5s)", recovery)


async def test_namespace_deleted_while_its_replicaset_scales(own_plane: ControlPlane, own_client: RestClient) -> None:
    namespace = await create_namespace(own_client, "faults-ns")
    async with running_manager(own_plane.kubeconfig, "replicaset,namespace,serviceaccount") as manager:
        await own_client.create(REPLICASETS, replicaset_manifest("doomed", 2), namespace=namespace)
        await wait_converged(own_client, namespace, "doomed")
        await own_client.patch(REPLICASETS, "doomed", {"spec": {"replicas": 80}}, namespace)
        await asyncio.sleep(0.3)
        await own_client.delete(NAMESPACES, namespace)
        deleted = time.monotonic()
        await wait_for(lambda: is_gone(own_client, NAMESPACES, namespace), 60, 0.2, f"namespace {namespace} gone")
        gone = time.monotonic() - deleted
        controller = next(c for c in manager.controllers if c.name == "replicaset-controller")
        await asyncio.sleep(2)
        assert len(controller.queue) == 0, "the ReplicaSet is still being retried"
    report("namespace deleted while its ReplicaSet scales (until the namespace is gone)", gone)


async def test_certificates_rotated_while_running(
    own_plane: ControlPlane, own_client: RestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cluster's rotation: pykcm's client certificate files (named by its kubeconfig) replaced
    by a new pair, and the apiserver restarted with a serving certificate re-issued by the same
    CA. The old client identity then loses its rights, so only the new pair can do the scale-up."""
    if os.environ.get(CONTROLLER_KUBECONFIG_ENV):
        pytest.skip("pykcm's own client certificate is what rotates; the deploy-credentials mode does not apply")
    monkeypatch.setattr(rest, "CLIENT_CERT_REFRESH", 1.0)  # client-go re-reads every 5 minutes
    caplog.set_level(logging.INFO, logger="pykcm.cert-rotation")
    users = {name: f"pykcm-rotation-{name}-{uuid.uuid4().hex[:6]}" for name in ("old", "new")}
    for user in users.values():
        await own_client.create(CLUSTERROLEBINDINGS, cluster_admin_binding(user))
    cert, key = tmp_path / "pykcm.crt", tmp_path / "pykcm.key"
    issue_certificate(own_plane.pki, cert, key, users["old"])
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(cert_files_kubeconfig(own_plane, cert, key)))
    namespace = await create_namespace(own_client, "rotation")
    try:
        async with running_manager(kubeconfig, "replicaset"):
            await own_client.create(REPLICASETS, replicaset_manifest("rotated", START), namespace=namespace)
            await wait_converged(own_client, namespace, "rotated")
            async with PodSampler(own_client, namespace, "rotated").running() as sampler:
                issue_certificate(own_plane.pki, cert, key, users["new"])
                pki = own_plane.pki
                issue_certificate(pki, pki.apiserver_cert, pki.apiserver_key, "kube-apiserver", server=True)
                await asyncio.to_thread(own_plane.restart_apiserver)
                rotated = time.monotonic()
                await own_client.delete(CLUSTERROLEBINDINGS, users["old"])
                await own_client.patch(REPLICASETS, "rotated", {"spec": {"replicas": SCALED}}, namespace)
                await wait_converged(own_client, namespace, "rotated", timeout=120)
                recovery = time.monotonic() - rotated
    finally:
        for user in users.values():
            with contextlib.suppress(NotFound):
                await own_client.delete(CLUSTERROLEBINDINGS, user)
    assert "Certificate rotation detected" in caplog.text
    assert sampler.most <= SCALED and len(sampler.names) == SCALED, (sampler.most, len(sampler.names))
    report("certificates rotated (client pair replaced, apiserver restarted with a new serving cert)", recovery)


async def test_priority_and_fairness_rejecting_what_finds_no_seat(own_plane: ControlPlane, own_client: RestClient,
                                                                  tmp_path: Path) -> None:
    """The apiserver's own priority and fairness puts pykcm's user at a level of 3 seats that
    rejects the rest (429 with Retry-After, no queue): the rejected requests are sent again after
    their Retry-After, as client-go's are, and the scale-up converges with one create per pod."""
    if os.environ.get(CONTROLLER_KUBECONFIG_ENV):
        pytest.skip("pykcm runs as a user of this test's own; the deploy-credentials mode does not apply")
    user = f"pykcm-apf-{uuid.uuid4().hex[:6]}"
    cert, key = tmp_path / "pykcm.crt", tmp_path / "pykcm.key"
    issue_certificate(own_plane.pki, cert, key, user)  # not system:masters, which the "exempt" schema takes
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(cert_files_kubeconfig(own_plane, cert, key)))
    flowcontrol = "/apis/flowcontrol.apiserver.k8s.io/v1"
    # 1 share of the server's 600 seats against the default levels' 245: 3 seats.
    level = {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
             "metadata": {"name": user}, "spec": {"type": "Limited", "limited": {
                 "nominalConcurrencyShares": 1, "lendablePercent": 0, "borrowingLimitPercent": 0,
                 "limitResponse": {"type": "Reject"}}}}
    schema = {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": f"a-{user}"},
              "spec": {"priorityLevelConfiguration": {"name": user}, "matchingPrecedence": 2,
                       "distinguisherMethod": {"type": "ByUser"},
                       "rules": [{"subjects": [{"kind": "User", "user": {"name": user}}],
                                  "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                                     "namespaces": ["*"], "clusterScope": True}]}]}}
    schema_path, level_path = f"{flowcontrol}/flowschemas/a-{user}", f"{flowcontrol}/prioritylevelconfigurations/{user}"

    async def in_effect() -> bool:  # the apiserver's config controller has digested the schema
        conditions = (await own_client.request("GET", schema_path)).get("status", {}).get("conditions", [])
        return any(c["type"] == "Dangling" and c["status"] == "False" for c in conditions)

    namespace = await create_namespace(own_client, "apf")
    try:
        await own_client.create(CLUSTERROLEBINDINGS, cluster_admin_binding(user))
        await own_client.request("POST", f"{flowcontrol}/prioritylevelconfigurations", body=level)
        await own_client.request("POST", f"{flowcontrol}/flowschemas", body=schema)
        await wait_for(in_effect, 30, 0.2, "the FlowSchema in effect")
        before, retries_before = await rejected(own_client, user), retries_to(own_plane.apiserver_url)
        async with running_manager(kubeconfig, "replicaset"):
            await own_client.create(REPLICASETS, replicaset_manifest("throttled", START), namespace=namespace)
            await wait_converged(own_client, namespace, "throttled")
            # Whether a burst finds the 3 seats taken depends on how fast each side runs: on a busy
            # machine one scale-up once met no rejection at all, and once four in a row. Scale again
            # until one is met.
            for _ in range(8):
                async with PodSampler(own_client, namespace, "throttled").running() as sampler:
                    await own_client.patch(REPLICASETS, "throttled", {"spec": {"replicas": 40}}, namespace)
                    took = await wait_converged(own_client, namespace, "throttled", timeout=120)
                if await rejected(own_client, user) > before:
                    break
                await own_client.patch(REPLICASETS, "throttled", {"spec": {"replicas": START}}, namespace)
                await wait_converged(own_client, namespace, "throttled", timeout=120)
            retried = retries_to(own_plane.apiserver_url) - retries_before
    finally:
        for path in (schema_path, level_path, CLUSTERROLEBINDINGS.path(None, user)):
            with contextlib.suppress(NotFound):
                await own_client.request("DELETE", path)
    assert sampler.most <= 40 and len(sampler.names) == 40, (sampler.most, len(sampler.names))
    refused = await rejected(own_client, user) - before
    assert refused > 0, "the apiserver rejected none of pykcm's requests"
    assert retried > 0, "no request was sent again"
    report(f"priority and fairness rejecting all but 3 requests at a time, scale 3 -> 40 ({refused:g} rejected,"
           f" {retried:g} sent again)", took)


async def rejected(client: RestClient, level: str) -> float:
    """apiserver_flowcontrol_rejected_requests_total of one priority level, from the apiserver's /metrics."""
    text = await client.request("GET", "/metrics", accept="text/plain")
    family, label = "apiserver_flowcontrol_rejected_requests_total{", f'priority_level="{level}"'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(family) and label in line)


def retries_to(url: str) -> float:
    """This process's rest_client_request_retries_total towards one apiserver, every code and verb."""
    host = url.removeprefix("https://")
    return sum(sample.value for metric in REGISTRY.collect() if metric.name == "rest_client_request_retries"
               for sample in metric.samples if sample.name.endswith("_total") and sample.labels.get("host") == host)


def cluster_admin_binding(user: str) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


def cert_files_kubeconfig(plane: ControlPlane, cert: Path, key: Path) -> dict:
    """A kubeconfig that names its client certificate and key files (re-read when they rotate)."""
    cluster = {"server": plane.apiserver_url, "certificate-authority": str(plane.pki.ca_cert)}
    return {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
