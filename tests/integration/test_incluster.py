"""pykcm deployed from deploy/ onto the real node, end to end, as a user would: the image built
here and imported into the node's containerd, deploy/ applied with `kubectl apply -k` through an
overlay that only names that image (kustomize `images:`), with and without the
service-account-credentials component. KCM's DaemonSet controller makes the pods, the kubelet runs
them hardened, pykcm talks to the apiserver with its projected token, leads, and gives a user's
Deployment its pods; deleting the leader pod hands leadership over; `kubectl delete -k` removes it.

The standby: one real node means one pod of deploy/'s DaemonSet, and a second pod of it could
not share the node (host network, host port 10357). So the overlay adds the same DaemonSet
renamed `pykcm-standby`, serving on 10358: the same image, ServiceAccount, flags (components
included), security context and probes, made by the same DaemonSet controller, which is what a
second control-plane node would run. Deleting the leader pod, whichever of the two it is, then
shows the other take the Lease, timed against deploy/'s lease duration + retry period (the
deleted pod releases the Lease on SIGTERM). A crash releases nothing, so the test then SIGKILLs
the new leader's process on the host: the Lease must expire first, and a standby notices a
renewal up to one jittered retry (retry x 2.2) late and retries as late again, so that bound is
lease duration + 2 x 2.2 x retry period.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pykcm.app.options import LEADER_ELECTION_JITTER, Options
from pykcm.client.resources import DEPLOYMENTS, LEASES, NAMESPACES, PODS, SERVICEACCOUNTS
from pykcm.client.rest import RestClient
from pykcm.testenv import image as pykcm_image
from pykcm.testenv import realnode
from pykcm.testenv.build import ensure_binaries
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.progress import format_duration
from tests.deploy_credentials import DEPLOY, kustomize, write_overlay
from tests.integration.test_image import ENGINE_WAIT
from tests.integration.test_realnode import busybox_pod, is_ready
from tests.support import CHECKOUT, admin_client, create_namespace, is_gone, wait_for

pytestmark = [pytest.mark.realnode, pytest.mark.image, pytest.mark.kcm]

CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
NAME_LABEL = "app.kubernetes.io/name"
STANDBY, STANDBY_PORT = "pykcm-standby", 10358
NONROOT = 65532
CONTROLLER_ACCOUNTS = ("replicaset-controller", "namespace-controller", "service-account-controller")
MODES = {"deploy": (), "service-account-credentials": ("service-account-credentials",)}
IDENTITY = re.compile(r'"Attempting to acquire leader lease".* identity="([^"]+)"')
ACQUIRED = '"Successfully acquired lease"'
READY_TIMEOUT = 180.0


@dataclass(frozen=True)
class NodeImage:
    repository: str
    tag: str
    archive: Path

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


@pytest.fixture(scope="module")
def kubectl() -> Path:
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
    built_image: NodeImage, cluster_with_real_node: ControlPlane, kubectl: Path, testenv_log: Callable[[str], None]
) -> Iterator[ControlPlane]:
    """The real node as a control-plane node (deploy/'s nodeSelector), holding the image."""
    started = time.monotonic()
    realnode.import_image(built_image.archive)
    testenv_log(f"DURATION image import into the node's containerd: {format_duration(time.monotonic() - started)}")
    node = f"node/{realnode.NODE_NAME}"
    run_kubectl(kubectl, cluster_with_real_node, "label", node, f"{CONTROL_PLANE_LABEL}=")
    try:
        yield cluster_with_real_node
    finally:
        run_kubectl(kubectl, cluster_with_real_node, "label", node, f"{CONTROL_PLANE_LABEL}-")


# ----- the user's overlay


def standby_daemonset(daemonset: dict[str, Any]) -> dict[str, Any]:
    """deploy/'s DaemonSet as rendered, renamed and moved to another host port (see the docstring)."""
    standby = json.loads(json.dumps(daemonset))
    standby["metadata"] = {"name": STANDBY, "namespace": daemonset["metadata"]["namespace"]}
    standby["spec"]["selector"] = {"matchLabels": {NAME_LABEL: STANDBY}}
    standby["spec"]["template"]["metadata"]["labels"] = {NAME_LABEL: STANDBY}
    container = standby["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [re.sub(r"^--secure-port=\d+$", f"--secure-port={STANDBY_PORT}", a) for a in container["args"]]
    assert f"--secure-port={STANDBY_PORT}" in container["args"]
    container["ports"][0]["containerPort"] = STANDBY_PORT
    return standby


def write_user_overlay(directory: Path, kubectl: Path, components: tuple[str, ...], image: NodeImage) -> list[dict]:
    """deploy/ + components, `images:` naming the imported image, + the standby; returns the rendering."""
    images = ({"name": "pykcm", "newName": image.repository, "newTag": image.tag},)
    daemonset = next(o for o in kustomize(kubectl, write_overlay(directory, DEPLOY, components, images=images))
                     if o["kind"] == "DaemonSet")
    (directory / "standby.yaml").write_text(yaml.safe_dump(standby_daemonset(daemonset)))
    write_overlay(directory, DEPLOY, components, resources=("standby.yaml",), images=images)
    return kustomize(kubectl, directory)


def run_kubectl(kubectl: Path, plane: ControlPlane, *args: str | Path, check: bool = True) -> str:
    result = subprocess.run([kubectl, f"--kubeconfig={plane.kubeconfig}", *args],
                            capture_output=True, text=True, timeout=300)
    assert not check or result.returncode == 0, f"kubectl {' '.join(map(str, args))}: {result.stderr.strip()}"
    return result.stdout


# ----- the pods, seen through the API and from the host


async def ready_pods(client: RestClient, name: str) -> list[dict[str, Any]]:
    pods = (await client.list(PODS, "kube-system", labelSelector=f"{NAME_LABEL}={name}"))["items"]
    return [p for p in pods if is_ready(p) and not p["metadata"].get("deletionTimestamp")]


async def one_ready_pod(client: RestClient, name: str) -> dict[str, Any]:
    async def one() -> dict[str, Any] | None:
        pods = await ready_pods(client, name)
        return pods[0] if len(pods) == 1 else None

    return await wait_for(one, timeout=READY_TIMEOUT, interval=0.5, message=f"the {name} pod Ready")


def pod_log(kubectl: Path, plane: ControlPlane, pod: dict[str, Any]) -> str:
    return run_kubectl(kubectl, plane, "logs", "-n", "kube-system", pod["metadata"]["name"])


def identity_of(log: str) -> str | None:
    match = IDENTITY.search(log)
    return match[1] if match else None


def node_ctr(*args: str) -> str:
    """`ctr` against the real node's containerd, in the kubelet's namespace."""
    socket = realnode.RUNTIME_DIR / "containerd.sock"
    return subprocess.run(["ctr", f"--address={socket}", "-n", "k8s.io", *args],
                          capture_output=True, text=True, check=True).stdout


def container_pid(pod: dict[str, Any]) -> int:
    """The host PID of the pod's container, from the node's containerd."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    tasks = node_ctr("tasks", "ls").splitlines()[1:]
    pids = [int(line.split()[1]) for line in tasks if line.split()[0] == container_id]
    assert pids, f"no task for container {container_id}"
    return pids[0]


def process_view(pid: int) -> dict[str, str]:
    """What the kernel says about a process: ids, capabilities, seccomp, and its root mount's options."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    root = next(line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                if line.split()[4] == "/")
    view = {key: " ".join(status[key].split()) for key in ("Uid", "Gid", "CapEff", "CapPrm", "CapBnd", "Seccomp",
                                                           "NoNewPrivs")}
    view["root"] = root[5].split(",")[0]
    view["cmdline"] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return view


# ----- the test


@pytest.fixture
async def node_client(control_plane_node: ControlPlane) -> Any:
    api = admin_client(control_plane_node.kubeconfig)
    yield api
    await api.close()


@pytest.mark.parametrize("mode", list(MODES))
async def test_deploy_runs_pykcm_on_the_real_node_and_deletes_cleanly(
    mode: str, control_plane_node: ControlPlane, node_client: RestClient, kubectl: Path, built_image: NodeImage,
    tmp_path: Path, testenv_log: Callable[[str], None],
) -> None:
    plane, client = control_plane_node, node_client
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rendered = write_user_overlay(overlay, kubectl, MODES[mode], built_image)
    daemonset = next(o for o in rendered if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "pykcm")
    started = time.monotonic()
    run_kubectl(kubectl, plane, "apply", "-k", overlay)
    try:
        pod = await one_ready_pod(client, "pykcm")
        standby_pod = await one_ready_pod(client, STANDBY)
        testenv_log(f"DURATION [{mode}] apply -k -> both pods Ready: {format_duration(time.monotonic() - started)}")
        assert_hardened_as_deploy_says(pod, daemonset, built_image)
        logs = {p["metadata"]["name"]: pod_log(kubectl, plane, p) for p in (pod, standby_pod)}
        assert_in_cluster_config(pod, logs[pod["metadata"]["name"]])
        leader, standby = await the_one_leader(client, kubectl, plane, [pod, standby_pod])
        if mode == "service-account-credentials":
            await controllers_run_as_their_accounts(kubectl, plane, leader)
        await user_deployment_gets_ready_pods(client, testenv_log, mode)
        await leader_pod_deletion_hands_over(client, kubectl, plane, daemonset, leader, standby, testenv_log, mode)
    finally:
        await uninstall(client, kubectl, plane, overlay, testenv_log, mode)


def assert_hardened_as_deploy_says(pod: dict[str, Any], daemonset: dict[str, Any], image: NodeImage) -> None:
    template = daemonset["spec"]["template"]["spec"]
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME
    assert pod["spec"]["securityContext"] == template["securityContext"]
    container = pod["spec"]["containers"][0]
    assert container["securityContext"] == template["containers"][0]["securityContext"]
    assert container["image"] == image.ref and container["imagePullPolicy"] == "IfNotPresent"
    view = process_view(container_pid(pod))
    ids = " ".join([str(NONROOT)] * 4)
    assert (view["Uid"], view["Gid"]) == (ids, ids), view
    assert view["CapEff"] == view["CapPrm"] == view["CapBnd"] == "0000000000000000", view
    assert (view["Seccomp"], view["NoNewPrivs"], view["root"]) == ("2", "1", "ro"), view  # 2: a filter
    assert " run " in view["cmdline"] and "--kubeconfig" not in view["cmdline"], view


def assert_in_cluster_config(pod: dict[str, Any], log: str) -> None:
    """No kubeconfig anywhere: pykcm took the projected token the kubelet mounted."""
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
    assert "Using the in-cluster configuration" in log, log[-2000:]
    assert "Traceback" not in log, log[-4000:]


async def controllers_run_as_their_accounts(kubectl: Path, plane: ControlPlane, leader: dict[str, Any]) -> None:
    """Only the leader starts controllers, and with the component each runs as its own account.
    (Either replica may win the Lease: the DaemonSet's pod or the standby.)"""
    async def named_every_account() -> bool:
        log = await asyncio.to_thread(pod_log, kubectl, plane, leader)
        return all(f'serviceAccount="kube-system/{account}"' in log for account in CONTROLLER_ACCOUNTS)

    await wait_for(named_every_account, timeout=60, interval=0.5, message="the leader's per-controller accounts")


async def the_one_leader(
    client: RestClient, kubectl: Path, plane: ControlPlane, pods: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Exactly one pod holds the `pykcm` Lease and says so; the other stands by. Returns (leader, standby)."""
    async def held() -> str | None:
        return (await client.get(LEASES, "pykcm", "kube-system"))["spec"].get("holderIdentity") or None

    holder = await wait_for(held, timeout=60, interval=0.5, message="a holder of kube-system/pykcm")
    logs = [pod_log(kubectl, plane, p) for p in pods]
    identities = [identity_of(log) for log in logs]
    assert holder in identities, (holder, identities)
    leader = identities.index(holder)
    assert [ACQUIRED in log for log in logs] == [i == leader for i in range(len(pods))], logs
    return pods[leader], pods[1 - leader]


async def user_deployment_gets_ready_pods(client: RestClient, log: Callable[[str], None], mode: str) -> None:
    """KCM's Deployment controller makes the ReplicaSet; its pods can only come from pykcm."""
    started = time.monotonic()
    namespace = await create_namespace(client, "user", service_account=False)
    try:
        async def default_account() -> bool:  # pykcm's ServiceAccount controller; pods wait for it
            return not await is_gone(client, SERVICEACCOUNTS, "default", namespace)

        await wait_for(default_account, timeout=60, interval=0.5, message="the default ServiceAccount")
        spec = busybox_pod("unused")["spec"]
        deployment = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec}},
        }
        await client.create(DEPLOYMENTS, deployment, namespace=namespace)

        async def ready() -> bool:
            status = (await client.get(DEPLOYMENTS, "web", namespace)).get("status", {})
            return status.get("readyReplicas") == 2

        await wait_for(ready, timeout=120, interval=0.5, message="the Deployment's 2 pods Ready")
        pods = (await client.list(PODS, namespace, labelSelector="app=web"))["items"]
        for pod in pods:
            assert pod["spec"]["nodeName"] == realnode.NODE_NAME and is_ready(pod)
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
            assert {f["manager"] for f in pod["metadata"]["managedFields"] if f["operation"] == "Update"
                    and not f.get("subresource")} == {"pykcm"}, pod["metadata"]["managedFields"]
        log(f"DURATION [{mode}] namespace + Deployment -> 2 pods Ready: {format_duration(time.monotonic() - started)}")
    finally:
        # pykcm's namespace controller empties and removes it: delete it while pykcm still runs.
        await client.delete(NAMESPACES, namespace)
        await wait_for(lambda: is_gone(client, NAMESPACES, namespace), timeout=120, interval=0.5,
                       message=f"namespace {namespace} removed by pykcm")


def lease_timing(daemonset: dict[str, Any]) -> tuple[float, float]:
    """deploy/'s lease duration and retry period (pykcm's defaults unless its args set them)."""
    args = dict(a.split("=", 1) for a in daemonset["spec"]["template"]["spec"]["containers"][0]["args"] if "=" in a)
    defaults = Options()
    for flag in ("--leader-elect-lease-duration", "--leader-elect-retry-period"):
        assert flag not in args, f"{flag} set in deploy/: parse it here"
    return defaults.leader_elect_lease_duration, defaults.leader_elect_retry_period


async def leader_pod_deletion_hands_over(
    client: RestClient, kubectl: Path, plane: ControlPlane, daemonset: dict[str, Any],
    leader: dict[str, Any], standby: dict[str, Any], log: Callable[[str], None], mode: str,
) -> None:
    lease_duration, retry_period = lease_timing(daemonset)
    deposed = identity_of(pod_log(kubectl, plane, leader))
    started = time.monotonic()
    run_kubectl(kubectl, plane, "delete", "pod", "-n", "kube-system", leader["metadata"]["name"], "--wait=false")

    # The leader releases the Lease on SIGTERM; the standby and the DaemonSet's replacement pod race
    # for it, and either winning is a hand-over.
    async def taken_over() -> str | None:
        holder = (await client.get(LEASES, "pykcm", "kube-system"))["spec"].get("holderIdentity")
        return holder if holder not in (None, "", deposed) else None

    successor = await wait_for(taken_over, timeout=lease_duration + 4 * retry_period, interval=0.1,
                               message="another replica to take the Lease")
    takeover = time.monotonic() - started
    name = leader["metadata"]["labels"][NAME_LABEL]
    recreated = await one_ready_pod(client, name)  # the DaemonSet controller's new pod
    replicas = {identity_of(pod_log(kubectl, plane, p)): p for p in (standby, recreated)}
    assert successor in replicas, (successor, list(replicas))
    log(f"DURATION [{mode}] leader pod deleted -> the other replica leads: {format_duration(takeover)} "
        f"(bound: lease duration {lease_duration:g}s + retry period {retry_period:g}s); new holder "
        f"{'the standby' if replicas[successor] is standby else 'the recreated pod'}")
    assert takeover <= lease_duration + retry_period
    # A crash releases nothing: kill the new leader's process on the host; the Lease must expire first.
    # The other replica notices a renewal up to one jittered retry late and tries again a jittered retry later.
    other = next(identity for identity in replicas if identity != successor)
    new_leader = await client.get(PODS, replicas[successor]["metadata"]["name"], "kube-system")
    started = time.monotonic()
    subprocess.run(["kill", "-KILL", str(container_pid(new_leader))], check=True)

    async def expired_and_taken() -> bool:
        return (await client.get(LEASES, "pykcm", "kube-system"))["spec"].get("holderIdentity") not in (successor, "")

    bound = lease_duration + 2 * retry_period * (1 + LEADER_ELECTION_JITTER)
    await wait_for(expired_and_taken, timeout=bound + 30, interval=0.1, message="a new holder after the crash")
    crash = time.monotonic() - started
    holder = (await client.get(LEASES, "pykcm", "kube-system"))["spec"]["holderIdentity"]
    log(f"DURATION [{mode}] leader process killed -> a standby leads: {format_duration(crash)} "
        f"(lease duration {lease_duration:g}s; bound with jittered retries {bound:g}s); new holder "
        f"{'the other replica' if holder == other else 'the restarted container'}")
    assert lease_duration - retry_period * (1 + LEADER_ELECTION_JITTER) <= crash <= bound


async def uninstall(
    client: RestClient, kubectl: Path, plane: ControlPlane, overlay: Path, log: Callable[[str], None], mode: str
) -> None:
    """`kubectl delete -k` removes every object of the overlay, and the pods and containers go.
    What pykcm made while running (the Lease; with the component, the controllers' accounts,
    as KCM's are) is not the overlay's: removed afterwards so the next case starts afresh."""
    started = time.monotonic()
    containers = {c["containerID"] for p in (await client.list(PODS, "kube-system"))["items"]
                  if p["metadata"].get("labels", {}).get(NAME_LABEL) in ("pykcm", STANDBY)
                  for c in p["status"].get("containerStatuses", []) if c.get("containerID")}
    run_kubectl(kubectl, plane, "delete", "-k", overlay, "--wait=true")
    assert run_kubectl(kubectl, plane, "get", "-k", overlay, "--ignore-not-found", "-o", "name").strip() == ""

    async def pods_gone() -> bool:
        pods = (await client.list(PODS, "kube-system", labelSelector=f"{NAME_LABEL} in (pykcm,{STANDBY})"))["items"]
        return not pods

    await wait_for(pods_gone, timeout=120, interval=0.5, message="pykcm's pods gone")

    async def containers_gone() -> bool:
        listed = node_ctr("containers", "ls", "-q").split()
        return not {f"containerd://{c}" for c in listed} & containers

    await wait_for(containers_gone, timeout=120, interval=0.5, message="pykcm's containers removed by the kubelet")
    took = format_duration(time.monotonic() - started)
    log(f"DURATION [{mode}] delete -k -> objects, pods and containers gone: {took}")
    run_kubectl(kubectl, plane, "delete", "-n", "kube-system", "lease/pykcm", "--ignore-not-found")
    accounts = [f"serviceaccount/{a}" for a in CONTROLLER_ACCOUNTS]
    run_kubectl(kubectl, plane, "delete", "-n", "kube-system", *accounts, "--ignore-not-found")


def test_the_overlay_only_names_the_image_and_adds_the_standby(kubectl: Path, tmp_path: Path) -> None:
    """No cluster needed: the user's overlay changes nothing of deploy/ but the image, and the
    standby differs from deploy/'s DaemonSet only in name, labels and port."""
    image = NodeImage("pykcm.local/pykcm", "0123456789ab", tmp_path / "unused.tar")
    for components in MODES.values():
        plain = {(o["kind"], o["metadata"]["name"]): o for o in kustomize(
            kubectl, write_overlay(tmp_path / f"plain{len(components)}", DEPLOY, components))}
        ours = {(o["kind"], o["metadata"]["name"]): o for o in write_user_overlay(
            tmp_path / f"user{len(components)}", kubectl, components, image)}
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

