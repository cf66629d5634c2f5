"""The local cluster's real node: containerd, runc, CNI, kubelet and kube-proxy built from the
control plane's module. Pods run real containers, reach the apiserver through the `kubernetes`
Service and mount projected service-account tokens; `stop` leaves nothing on the host.

Only one real node runs on a machine at a time: the stop test starts and stops its own, and its
marker `own_real_node` runs it first in the session (tests/conftest.py), before any test starts
the session's `cluster_with_real_node`.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pykcm.client.resources import NODES, PODS, REPLICASETS
from pykcm.client.rest import RestClient
from pykcm.testenv import realnode
from pykcm.testenv.cluster import remove_abandoned_real_node, running, start
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.errors import ControlPlaneError
from pykcm.testenv.images import BUSYBOX_IMAGE
from pykcm.testenv.processes import process_trees
from tests.support import admin_client, create_namespace, is_ready, replicaset_manifest, running_manager, wait_for

pytestmark = [pytest.mark.realnode, pytest.mark.kcm]
# The own-node tests run first in a session, so on a cold machine the first of them builds the control
# plane, kubelet, kube-proxy and runc: 15-25 minutes on 2 busy cores (a cold CI run hit the default 10).
FIRST_IN_SESSION_TIMEOUT = 45 * 60

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Lists the projected volume, prints the token, then connects to the `kubernetes` Service.
PROBE = (
    f"ls {TOKEN_DIR}; echo TOKEN=$(cat {TOKEN_DIR}/token); "
    "nc -w 5 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT </dev/null "
    "&& echo SERVICE-REACHED $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; exec sleep 3600"
)


COUNTERS = re.compile(r" \[\d+:\d+\]$")


def busybox_pod(name: str, command: str = "exec sleep 3600") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": realnode.NODE_NAME},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", command],
                "readinessProbe": {"exec": {"command": ["/bin/true"]}, "periodSeconds": 1},
            }],
        },
    }


async def ready_pod(client: RestClient, namespace: str, name: str) -> dict[str, Any]:
    async def ready() -> dict[str, Any] | None:
        pod = await client.get(PODS, name, namespace)
        return pod if is_ready(pod) else None

    return await wait_for(ready, timeout=60, interval=0.5, message=f"pod {namespace}/{name} Ready")


# ----- what the node leaves on the host


def host_snapshot(directory: Path) -> dict[str, set[str]]:
    """The host's network interfaces and addresses, iptables rules and non-built-in chains, mounts
    under the cluster's dirs, and processes serving it."""
    roots = (str(directory), str(realnode.RUNTIME_DIR))
    links = {f"{link['ifname']} {[a.get('local') for a in link.get('addr_info', [])]}"
             for link in json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True).stdout)}
    rules = set()
    for tool in ("iptables-save", "ip6tables-save"):
        for line in subprocess.run([tool], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("-A") or (line.startswith(":") and not re.match(r":[A-Z]+ (ACCEPT|DROP) ", line)):
                rules.add(f"{tool} {COUNTERS.sub('', line)}")
    mounts = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if line.split()[4].startswith(roots)}
    processes = set()
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and any(root in cmdline for root in roots):
            processes.add(f"{proc.name} {cmdline[:200]}")
    forward = {f"ip_forward={Path('/proc/sys/net/ipv4/ip_forward').read_text().strip()}"}
    return {"links": links, "iptables": rules, "mounts": mounts, "processes": processes, "sysctl": forward}


def require_prerequisites() -> None:
    """Skip without the prerequisites; otherwise remove a real node an earlier killed job left, so the
    snapshot taken next is of the host as it is without any node (that node's ip_forward included)."""
    try:
        realnode.check_prerequisites()
    except ControlPlaneError as err:
        pytest.skip(str(err))
    remove_abandoned_real_node(print)


async def run_a_pod(plane: ControlPlane, name: str) -> None:
    client = admin_client(plane.kubeconfig)
    try:
        namespace = await create_namespace(client, name)
        await client.create(PODS, busybox_pod(name), namespace=namespace)
        await ready_pod(client, namespace, name)
    finally:
        await client.close()


def assert_nothing_left(before: dict[str, set[str]], directory: Path) -> None:
    after = host_snapshot(directory)
    for kind in before:
        assert after[kind] - before[kind] == set(), f"{kind} left behind"


@pytest.mark.own_real_node
@pytest.mark.timeout(FIRST_IN_SESSION_TIMEOUT)
async def test_stop_leaves_no_process_mount_interface_or_iptables_rule(tmp_path: Path) -> None:
    require_prerequisites()
    before = host_snapshot(tmp_path)
    with running(tmp_path / "cluster", real_node=True) as plane:
        await run_a_pod(plane, "sleeper")
        during = host_snapshot(tmp_path)
        # The snapshot sees what the node adds: its interfaces, chains, mounts and processes.
        assert during["links"] - before["links"] and during["iptables"] - before["iptables"]
        assert during["mounts"] and during["processes"]
    assert_nothing_left(before, tmp_path)


@pytest.mark.own_real_node
@pytest.mark.timeout(FIRST_IN_SESSION_TIMEOUT)
async def test_the_next_start_removes_a_real_node_whose_cluster_was_killed(tmp_path: Path) -> None:
    """A job killed with its cluster (SIGKILL, a restarted container) leaves the real node's claim,
    mounts, interfaces, rules, shims and pods behind; the next start must not refuse for ever."""
    require_prerequisites()
    before = host_snapshot(tmp_path)
    killed = start(tmp_path / "killed", real_node=True)
    await run_a_pod(killed, "orphan")
    for proc in killed.processes.values():
        proc.kill()
        proc.wait(5.0)
    orphans = process_trees(realnode.is_shim)
    assert len(orphans) >= 2, "the shims and the pod's processes outlive their cluster"
    logs: list[str] = []
    with running(tmp_path / "next", real_node=True, log=logs.append):
        assert any(f"removing the real node left by the cluster in {tmp_path / 'killed'}" in line for line in logs)
        assert not orphans & process_trees(realnode.is_shim)
    assert_nothing_left(before, tmp_path)


# ----- on the session's cluster with a real node


@pytest.fixture
async def node_client(cluster_with_real_node: ControlPlane) -> AsyncIterator[RestClient]:
    api = admin_client(cluster_with_real_node.kubeconfig)
    yield api
    await api.close()


async def test_the_node_registers_and_is_ready(node_client: RestClient) -> None:
    node = await node_client.get(NODES, realnode.NODE_NAME)
    assert is_ready(node)
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == realnode.NODE_IP
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.3"


async def test_a_pod_reaches_the_apiserver_through_the_kubernetes_service(
    node_client: RestClient, cluster_with_real_node: ControlPlane
) -> None:
    namespace = await create_namespace(node_client, "probe")
    await node_client.create(PODS, busybox_pod("probe", PROBE), namespace=namespace)
    pod = await ready_pod(node_client, namespace, "probe")
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME
    assert pod["status"]["podIP"].startswith(realnode.POD_CIDR.rsplit(".", 2)[0])
    log_path = f"/api/v1/namespaces/{namespace}/pods/probe/log"

    async def probe_done() -> str | None:
        text = await node_client.request("GET", log_path, accept="*/*")
        return text if "SERVICE-REACHED" in text or "nc:" in text else None

    log = await wait_for(probe_done, timeout=30, interval=0.5, message="the probe's output")
    assert "SERVICE-REACHED 10.0.0.1:443" in log  # the ClusterIP, through kube-proxy's rules
    assert {"ca.crt", "namespace", "token"} <= set(log.split())  # the projected volume
    # The mounted token is the pod's own identity for the apiserver.
    token = re.search(r"TOKEN=(\S+)", log)[1]  # type: ignore[index]
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    request = urllib.request.Request(
        f"{cluster_with_real_node.apiserver_url}/apis/authentication.k8s.io/v1/selfsubjectreviews",
        data=json.dumps(review).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    # Verified against the ca.crt the pod mounted: the cluster's own CA, published by KCM.
    context = ssl.create_default_context(cafile=str(cluster_with_real_node.pki.ca_cert))
    with urllib.request.urlopen(request, context=context, timeout=30) as resp:
        user = json.loads(resp.read())["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{namespace}:default"


async def test_pykcm_replicaset_pods_become_ready_on_the_real_node(
    node_client: RestClient, cluster_with_real_node: ControlPlane
) -> None:
    namespace = await create_namespace(node_client, "rs")
    manifest = replicaset_manifest("web", 2)
    template = manifest["spec"]["template"]
    template["spec"] = busybox_pod("unused")["spec"]
    async with running_manager(cluster_with_real_node.kubeconfig, controllers="replicaset-controller"):
        await node_client.create(REPLICASETS, manifest, namespace=namespace)

        async def all_ready() -> dict[str, Any] | None:
            rs = await node_client.get(REPLICASETS, "web", namespace)
            return rs if rs.get("status", {}).get("readyReplicas") == 2 else None

        await wait_for(all_ready, timeout=90, interval=0.5, message="2 ready replicas on the real node")
    pods = (await node_client.list(PODS, namespace))["items"]
    assert {p["spec"]["nodeName"] for p in pods} == {realnode.NODE_NAME}
    assert all(is_ready(p) for p in pods)
