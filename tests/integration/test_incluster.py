"""pykcm deployed from deploy/ onto the real node, end to end, as a user would: the image built
here and imported into the node's containerd, deploy/ applied with `kubectl apply -k` through an
overlay that only names that image (kustomize `images:`), with and without the
service-account-credentials component. KCM's DaemonSet controller makes the pods, the kubelet runs
them hardened, pykcm talks to the apiserver with its projected token, leads, and gives a user's
Deployment its pods; deleting the leader pod hands leadership over; `kubectl delete -k` removes it.
The overlay also adds the standby DaemonSet tests/incluster.py describes (one control-plane node).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pykcm.client.resources import PODS
from pykcm.client.rest import RestClient
from pykcm.testenv import image as pykcm_image
from pykcm.testenv import realnode
from pykcm.testenv.build import ensure_binaries
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.progress import format_duration
from tests.deploy_credentials import DEPLOY, kustomize, write_overlay
from tests.incluster import (
    CONTROL_PLANE_LABEL,
    NAME_LABEL,
    STANDBY,
    STANDBY_PORT,
    Kubectl,
    Node,
    assert_hardened_as_deploy_says,
    assert_in_cluster_config,
    host_command,
    leader_pod_deletion_hands_over,
    one_ready_pod,
    pod_log,
    standby_daemonset,
    the_one_leader,
    user_deployment_gets_ready_pods,
)
from tests.integration.test_image import ENGINE_WAIT
from tests.integration.test_realnode import busybox_pod
from tests.support import CHECKOUT, admin_client, wait_for

pytestmark = [pytest.mark.realnode, pytest.mark.image, pytest.mark.kcm]

CONTROLLER_ACCOUNTS = ("replicaset-controller", "namespace-controller", "service-account-controller")
MODES = {"deploy": (), "service-account-credentials": ("service-account-credentials",)}
NODE = Node(realnode.NODE_NAME, host_command, str(realnode.RUNTIME_DIR / "containerd.sock"))


@dataclass(frozen=True)
class NodeImage:
    repository: str
    tag: str
    archive: Path

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


@pytest.fixture(scope="module")
def kubectl_binary() -> Path:
    path = ensure_binaries(need_kubectl=True, log=lambda _: None).kubectl
    assert path is not None
    return path


@pytest.fixture(scope="module")
def built_image(testenv_log: Callable[[str], None], tmp_path_factory: pytest.TempPathFactory) -> NodeImage:
    """pykcm's image built from this checkout and saved under a tag of its image ID (the pods then
    run this build, never a stale `pykcm:dev`); the engine stops again for other sessions."""
    missing = pykcm_image.missing_prerequisites()
    if missing:
        pytest.skip("; ".join(missing))
    started = time.monotonic()
    with pykcm_image.built(CHECKOUT, log=testenv_log, wait=ENGINE_WAIT) as (engine, image):
        build = time.monotonic() - started
        tag = image.id.removeprefix("sha256:")[:12]
        node_image = NodeImage("pykcm.local/pykcm", tag, tmp_path_factory.mktemp("image") / "pykcm.tar")
        engine.docker("tag", image.name, node_image.ref)
        pykcm_image.save(engine, node_image.ref, node_image.archive, log=testenv_log)
        engine.docker("rmi", node_image.ref)  # the engine keeps pykcm:dev only
    testenv_log(f"DURATION image: engine + build {format_duration(build)}, with save "
                f"{format_duration(time.monotonic() - started)} ({image.size / 1e6:.0f} MB)")
    return node_image


@pytest.fixture(scope="module")
def control_plane_node(
    built_image: NodeImage, cluster_with_real_node: ControlPlane, kubectl_binary: Path,
    testenv_log: Callable[[str], None],
) -> Iterator[ControlPlane]:
    """The real node as a control-plane node (deploy/'s nodeSelector), holding the image."""
    started = time.monotonic()
    realnode.import_image(built_image.archive)
    testenv_log(f"DURATION image import into the node's containerd: {format_duration(time.monotonic() - started)}")
    kubectl = Kubectl(kubectl_binary, cluster_with_real_node.kubeconfig)
    node = f"node/{realnode.NODE_NAME}"
    kubectl("label", node, f"{CONTROL_PLANE_LABEL}=")
    try:
        yield cluster_with_real_node
    finally:
        kubectl("label", node, f"{CONTROL_PLANE_LABEL}-")


def write_user_overlay(directory: Path, kubectl: Path, components: tuple[str, ...], image: NodeImage) -> list[dict]:
    """deploy/ + components, `images:` naming the imported image, + the standby; returns the rendering."""
    images = ({"name": "pykcm", "newName": image.repository, "newTag": image.tag},)
    daemonset = next(o for o in kustomize(kubectl, write_overlay(directory, DEPLOY, components, images=images))
                     if o["kind"] == "DaemonSet")
    (directory / "standby.yaml").write_text(yaml.safe_dump(standby_daemonset(daemonset)))
    write_overlay(directory, DEPLOY, components, resources=("standby.yaml",), images=images)
    return kustomize(kubectl, directory)


@pytest.fixture
async def node_client(control_plane_node: ControlPlane) -> Any:
    api = admin_client(control_plane_node.kubeconfig)
    yield api
    await api.close()


@pytest.mark.parametrize("mode", list(MODES))
async def test_deploy_runs_pykcm_on_the_real_node_and_deletes_cleanly(
    mode: str, control_plane_node: ControlPlane, node_client: RestClient, kubectl_binary: Path,
    built_image: NodeImage, tmp_path: Path, testenv_log: Callable[[str], None],
) -> None:
    client, kubectl = node_client, Kubectl(kubectl_binary, control_plane_node.kubeconfig)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rendered = write_user_overlay(overlay, kubectl_binary, MODES[mode], built_image)
    daemonset = next(o for o in rendered if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "pykcm")
    started = time.monotonic()
    kubectl("apply", "-k", overlay)
    try:
        pod = await one_ready_pod(client, "pykcm")
        standby_pod = await one_ready_pod(client, STANDBY)
        testenv_log(f"DURATION [{mode}] apply -k -> both pods Ready: {format_duration(time.monotonic() - started)}")
        assert_hardened_as_deploy_says(NODE, pod, daemonset, built_image.ref)
        assert_in_cluster_config(pod, pod_log(kubectl, pod))
        leader, standby = await the_one_leader(client, kubectl, [pod, standby_pod])
        if mode == "service-account-credentials":
            await controllers_run_as_their_accounts(kubectl, leader)
        await user_deployment_gets_ready_pods(client, busybox_pod("unused")["spec"], realnode.NODE_NAME,
                                              testenv_log, mode)
        await leader_pod_deletion_hands_over(client, kubectl, NODE, daemonset, leader, standby, testenv_log, mode)
    finally:
        await uninstall(client, kubectl, overlay, testenv_log, mode)


async def controllers_run_as_their_accounts(kubectl: Kubectl, leader: dict[str, Any]) -> None:
    """Only the leader starts controllers, and with the component each runs as its own account.
    (Either replica may win the Lease: the DaemonSet's pod or the standby.)"""
    async def named_every_account() -> bool:
        log = await asyncio.to_thread(pod_log, kubectl, leader)
        return all(f'serviceAccount="kube-system/{account}"' in log for account in CONTROLLER_ACCOUNTS)

    await wait_for(named_every_account, timeout=60, interval=0.5, message="the leader's per-controller accounts")


async def uninstall(client: RestClient, kubectl: Kubectl, overlay: Path, log: Callable[[str], None], mode: str) -> None:
    """`kubectl delete -k` removes every object of the overlay, and the pods and containers go.
    What pykcm made while running (the Lease; with the component, the controllers' accounts,
    as KCM's are) is not the overlay's: removed afterwards so the next case starts afresh."""
    started = time.monotonic()
    containers = {c["containerID"] for p in (await client.list(PODS, "kube-system"))["items"]
                  if p["metadata"].get("labels", {}).get(NAME_LABEL) in ("pykcm", STANDBY)
                  for c in p["status"].get("containerStatuses", []) if c.get("containerID")}
    kubectl("delete", "-k", overlay, "--wait=true")
    assert kubectl("get", "-k", overlay, "--ignore-not-found", "-o", "name").strip() == ""

    async def pods_gone() -> bool:
        pods = (await client.list(PODS, "kube-system", labelSelector=f"{NAME_LABEL} in (pykcm,{STANDBY})"))["items"]
        return not pods

    await wait_for(pods_gone, timeout=120, interval=0.5, message="pykcm's pods gone")

    async def containers_gone() -> bool:
        listed = NODE.ctr("containers", "ls", "-q").split()
        return not {f"containerd://{c}" for c in listed} & containers

    await wait_for(containers_gone, timeout=120, interval=0.5, message="pykcm's containers removed by the kubelet")
    took = format_duration(time.monotonic() - started)
    log(f"DURATION [{mode}] delete -k -> objects, pods and containers gone: {took}")
    kubectl("delete", "-n", "kube-system", "lease/pykcm", "--ignore-not-found")
    accounts = [f"serviceaccount/{a}" for a in CONTROLLER_ACCOUNTS]
    kubectl("delete", "-n", "kube-system", *accounts, "--ignore-not-found")


def test_the_overlay_only_names_the_image_and_adds_the_standby(kubectl_binary: Path, tmp_path: Path) -> None:
    """No cluster needed: the user's overlay changes nothing of deploy/ but the image, and the
    standby differs from deploy/'s DaemonSet only in name, labels and port."""
    image = NodeImage("pykcm.local/pykcm", "0123456789ab", tmp_path / "unused.tar")
    for components in MODES.values():
        plain = {(o["kind"], o["metadata"]["name"]): o for o in kustomize(
            kubectl_binary, write_overlay(tmp_path / f"plain{len(components)}", DEPLOY, components))}
        ours = {(o["kind"], o["metadata"]["name"]): o for o in write_user_overlay(
            tmp_path / f"user{len(components)}", kubectl_binary, components, image)}
        standby = ours.pop(("DaemonSet", STANDBY))
        ds = ours[("DaemonSet", "pykcm")]["spec"]["template"]["spec"]
        assert ds["containers"][0].pop("image") == image.ref
        assert plain[("DaemonSet", "pykcm")]["spec"]["template"]["spec"]["containers"][0].pop("image") == "pykcm:dev"
        assert ours == plain
        standby_spec = standby["spec"]["template"]["spec"]
        assert standby_spec["containers"][0].pop("image") == image.ref
        assert standby_spec["containers"][0]["ports"][0].pop("containerPort") == STANDBY_PORT
        assert ds["containers"][0]["ports"][0].pop("containerPort") == 10357
        args = [a.replace(f"={STANDBY_PORT}", "=10357") for a in standby_spec["containers"][0].pop("args")]
        assert args == ds["containers"][0].pop("args")
        assert standby_spec == ds

