"""Simulated nodes: the real kwok binary playing pykcm's Stages against the real control plane.

No scheduler runs here, so every pod is bound with `spec.nodeName`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pykcm.client.errors import NotFound
from pykcm.client.resources import JOBS, LEASES, NODES, PODS
from pykcm.client.rest import RestClient
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.kwok import (
    POD_CIDR,
    STAGES_FILE,
    ControlPlaneError,
    ManagedProcess,
    create_nodes,
    delete_nodes,
    start_kwok,
)
from tests.support import PAUSE_IMAGE, create_namespace, is_gone, wait_for

NODE_COUNT = 3
HEARTBEAT_MS = 1000


def _stages_with_fast_heartbeat(directory: Path) -> Path:
    """The shipped Stages, with node-heartbeat every second instead of every five minutes."""
    stages = list(yaml.safe_load_all(STAGES_FILE.read_text()))
    heartbeat = next(s for s in stages if s["metadata"]["name"] == "node-heartbeat")
    heartbeat["spec"]["delay"] = {"durationMilliseconds": HEARTBEAT_MS}
    path = directory / "stages.yaml"
    path.write_text(yaml.safe_dump_all(stages, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def kwok(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    directory = tmp_path_factory.mktemp("kwok")
    proc = start_kwok(control_plane.kubeconfig, directory, stages=_stages_with_fast_heartbeat(directory))
    try:
        yield proc
    finally:
        proc.stop()
    assert not proc.alive()


@pytest.fixture(scope="module")
def nodes(control_plane: ControlPlane, kwok: ManagedProcess) -> Iterator[list[str]]:
    names = asyncio.run(create_nodes(control_plane.kubeconfig, NODE_COUNT, kwok=kwok))
    try:
        yield names
    finally:
        asyncio.run(delete_nodes(control_plane.kubeconfig, names))


@pytest.fixture
async def namespace(client: RestClient) -> AsyncIterator[str]:
    name = await create_namespace(client, "kwok")
    yield name
    # No kubelet may be left to finish them: remove this test's pods outright.
    await client.delete_collection(PODS, name, body={"gracePeriodSeconds": 0})


def _pod(name: str, node: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "initContainers": [{"name": "init", "image": PAUSE_IMAGE}],
            "containers": [{"name": "a", "image": PAUSE_IMAGE}, {"name": "b", "image": PAUSE_IMAGE}],
        },
    }


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj["status"].get("conditions", []) if c["type"] == kind), {})


async def _pod_in_phase(client: RestClient, namespace: str, name: str, phase: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        pod = await client.get(PODS, name, namespace)
        return pod if pod["status"].get("phase") == phase else None

    return await wait_for(check, timeout=20, message=f"pod {name} {phase}")


async def test_nodes_are_ready_with_their_own_pod_cidr(client: RestClient, nodes: list[str]) -> None:
    found = [await client.get(NODES, name) for name in nodes]

    cidrs = {ipaddress.ip_network(n["spec"]["podCIDR"]) for n in found}
    assert len(cidrs) == NODE_COUNT and all(c.subnet_of(POD_CIDR) for c in cidrs)  # type: ignore[arg-type]
    for node in found:
        status = node["status"]
        assert _condition(node, "Ready")["status"] == "True"
        assert {_condition(node, t)["status"] for t in ("MemoryPressure", "DiskPressure", "PIDPressure")} == {"False"}
        assert status["allocatable"] == status["capacity"]
        assert status["capacity"]["pods"] == "110" and status["capacity"]["cpu"] == "32"
        assert status["nodeInfo"]["kubeletVersion"] == "v1.36.3"
        internal = next(a["address"] for a in status["addresses"] if a["type"] == "InternalIP")
        assert ipaddress.ip_address(internal).is_loopback
    # Idempotent: a second call keeps the nodes it finds.
    uids = [n["metadata"]["uid"] for n in found]
    assert await create_nodes(client, NODE_COUNT) == nodes
    assert [(await client.get(NODES, name))["metadata"]["uid"] for name in nodes] == uids


async def test_heartbeat_refreshes_conditions_and_kwok_renews_node_leases(client: RestClient, nodes: list[str]) -> None:
    node = await client.get(NODES, nodes[0])
    ready, lease = _condition(node, "Ready"), await client.get(LEASES, nodes[0], "kube-node-lease")
    assert lease["spec"]["leaseDurationSeconds"] == 40
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]

    async def heartbeat() -> dict[str, Any] | None:
        now = _condition(await client.get(NODES, nodes[0]), "Ready")
        return now if now["lastHeartbeatTime"] != ready["lastHeartbeatTime"] else None

    fresh = await wait_for(heartbeat, timeout=10, interval=0.5, message="a newer Ready heartbeat")
    assert (fresh["status"], fresh["lastTransitionTime"]) == ("True", ready["lastTransitionTime"])

    async def renewed() -> bool:
        spec = (await client.get(LEASES, nodes[0], "kube-node-lease"))["spec"]
        return spec["renewTime"] != lease["spec"]["renewTime"]

    await wait_for(renewed, timeout=15, interval=0.5, message="a renewed node Lease (every 10 s)")


async def test_bound_pod_runs_and_is_ready(client: RestClient, nodes: list[str], namespace: str) -> None:
    node = await client.get(NODES, nodes[1])
    await client.create(PODS, _pod("web", nodes[1]), namespace)

    pod = await _pod_in_phase(client, namespace, "web", "Running")

    status = pod["status"]
    for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        assert _condition(pod, kind)["status"] == "True", kind
    assert ipaddress.ip_address(status["podIP"]) in ipaddress.ip_network(node["spec"]["podCIDR"])
    assert [ip["ip"] for ip in status["podIPs"]] == [status["podIP"]]
    assert status["hostIP"] == node["status"]["addresses"][0]["address"]
    assert [(c["name"], c["ready"], c["started"], "running" in c["state"]) for c in status["containerStatuses"]] == [
        ("a", True, True, True),
        ("b", True, True, True),
    ]
    (init,) = status["initContainerStatuses"]
    assert init["ready"] and init["state"]["terminated"]["exitCode"] == 0


async def test_pod_of_a_job_succeeds(client: RestClient, nodes: list[str], namespace: str) -> None:
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "work", "image": PAUSE_IMAGE}]}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "once"}, "spec": {"template": template}}
    job = await client.create(JOBS, job, namespace)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "once", "uid": job["metadata"]["uid"], "controller": True}
    pod = _pod("once-x", nodes[2], ownerReferences=[owner])
    pod["spec"]["containers"] = template["spec"]["containers"]
    await client.create(PODS, pod, namespace)

    pod = await _pod_in_phase(client, namespace, "once-x", "Succeeded")

    (work,) = pod["status"]["containerStatuses"]
    assert work["state"]["terminated"]["exitCode"] == 0 and not work["ready"]
    assert _condition(pod, "Ready")["status"] == "False"


async def test_deleted_pod_stays_terminating_for_its_grace_period(
    client: RestClient, nodes: list[str], namespace: str
) -> None:
    await client.create(PODS, _pod("slow", nodes[0]), namespace)
    await _pod_in_phase(client, namespace, "slow", "Running")

    started = time.monotonic()
    await client.delete(PODS, "slow", namespace, body={"gracePeriodSeconds": 2})
    await asyncio.sleep(0.5)
    assert (await client.get(PODS, "slow", namespace))["metadata"]["deletionTimestamp"]

    await wait_for(lambda: is_gone(client, PODS, "slow", namespace), timeout=10, message="pod slow deleted")
    # deletionTimestamp has whole seconds, so "2 s from now" is 1 to 2 s away.
    assert 1.0 <= time.monotonic() - started < 5.0


async def test_finalizers_are_left_to_their_owner(client: RestClient, nodes: list[str], namespace: str) -> None:
    await client.create(PODS, _pod("held", nodes[0], finalizers=["example.com/hold"]), namespace)
    await _pod_in_phase(client, namespace, "held", "Running")
    await client.delete(PODS, "held", namespace, body={"gracePeriodSeconds": 1})
    await asyncio.sleep(2.5)
    assert (await client.get(PODS, "held", namespace))["metadata"]["finalizers"] == ["example.com/hold"]

    await client.patch(PODS, "held", {"metadata": {"finalizers": None}}, namespace)

    await wait_for(lambda: is_gone(client, PODS, "held", namespace), timeout=10, message="pod held deleted")


def test_rejected_stage_fails_fast_in_one_line(control_plane: ControlPlane, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(STAGES_FILE.read_text().replace("durationMilliseconds: 300000", "durationMilliseconds: soon"))
    started = time.monotonic()

    with pytest.raises(ControlPlaneError) as err:
        start_kwok(control_plane.kubeconfig, tmp_path, stages=broken)

    message = str(err.value)
    assert time.monotonic() - started < 10
    assert "\n" not in message
    assert message.startswith("kwok exited during startup: Init config flags: json: cannot unmarshal string")
    assert f"(log: {tmp_path / 'logs' / 'kwok.log'})" in message
    assert not ManagedProcess.from_json("kwok", json.loads((tmp_path / "kwok.json").read_text())).alive()


async def test_deleted_nodes_take_their_leases(client: RestClient, kwok: ManagedProcess) -> None:
    (name,) = await create_nodes(client, 1, prefix="kwok-gone", kwok=kwok)
    await wait_for(lambda: _exists(client, name), timeout=10, message=f"the Lease of {name}")

    await delete_nodes(client, [name])

    assert await is_gone(client, NODES, name)
    assert await is_gone(client, LEASES, name, "kube-node-lease")


async def _exists(client: RestClient, lease: str) -> bool:
    try:
        await client.get(LEASES, lease, "kube-node-lease")
    except NotFound:
        return False
    return True
