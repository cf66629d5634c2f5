"""The README's kind recipe, for real and offline: `kind create cluster` with deploy/kind/kind-config.yaml
and the node image assembled here makes a control plane and a worker whose KCM leaves the
ReplicaSet, Namespace and ServiceAccount controllers alone. Both shapes do their work on it, one
after the other: pykcm run from outside (on the host, with kind's kubeconfig), then pykcm inside,
with the README's commands: its image built, `kind load docker-image`, `kubectl apply -k deploy/`
(plus the standby tests/incluster.py describes), a user's Deployment created and scaled.
`kind delete cluster` and the engine's stop leave nothing on the host. Every address touched is on
this machine: kind's apiserver on loopback, the nodes on the private engine's bridge (which a host
rule keeps from forwarding anywhere else).

Where the README's commands and the test's differ, it is for this machine: no registry, so
`docker build -t pykcm:dev .` is the same Dockerfile built by the private engine on its local
Debian base (pykcm/testenv/image.py); kubectl and kind get the cluster's kubeconfig and the
engine (its `docker` wrapper, see pykcm/testenv/kind/cluster.py) explicitly."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pykcm.testenv import docker
from pykcm.testenv import image as pykcm_image
from pykcm.testenv.build import KUBECTL, ensure_components
from pykcm.testenv.kind import cluster, nodeimage
from pykcm.testenv.kind.cluster import KindCluster
from pykcm.testenv.kind.preload import PAUSE_IMAGE
from pykcm.testenv.nodes import KCM_CONTROLLERS, PYKCM_CONTROLLERS
from pykcm.testenv.progress import format_duration
from tests.deploy_credentials import DEPLOY, kustomize
from tests.incluster import (
    STANDBY,
    Kubectl,
    Node,
    assert_hardened_as_deploy_says,
    assert_in_cluster_config,
    leader_pod_deletion_hands_over,
    one_ready_pod,
    pod_log,
    standby_daemonset,
    the_one_leader,
    user_deployment_gets_ready_pods,
)
from tests.support import CHECKOUT, PykcmProcess, admin_client, is_ready

# Cold, the node image's assembly comes first (Go builds, debootstrap): 15-20 minutes on 2 cores.
pytestmark = [pytest.mark.integration, pytest.mark.kind, pytest.mark.late("kind-node-image"),
              pytest.mark.timeout(3600)]

ENGINE_WAIT = 900.0  # seconds; another session may hold the kind engine's directory
WAIT = "180s"  # each kubectl wait; pods start in seconds, on a shared 2-core machine in tens


# The README's in-cluster recipe after `kind create cluster` and the image's build, word for word
# (a check below finds each in README.md); `kubectl` and `kind` run as the test's wrappers.
README_LOAD = "kind load docker-image pykcm:dev --name pykcm"
README_APPLY = "kubectl apply -k deploy/"
README_CREATE = f"kubectl create deployment web --image={PAUSE_IMAGE} --replicas=3"
README_SCALE = "kubectl scale deployment web --replicas=5"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"  # in a kind node


def kubectl_for(made: KindCluster, log: Callable[[str], None]) -> Kubectl:
    return Kubectl(ensure_components((KUBECTL,), log)[KUBECTL], made.kubeconfig)


def pause_pod_spec(node: str) -> dict[str, Any]:
    """A pause pod pinned to `node`, from the image the node preloads (nothing is pulled)."""
    return {"nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}]}


def deployment(name: str, namespace: str, node: str) -> str:
    """2 pause pods pinned to `node`."""
    return json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": pause_pod_spec(node)}},
    })


def assert_kcm_runs_without_pykcms_controllers(kubectl: Kubectl) -> None:
    """KCM's flag leaves out exactly pykcm's three, and its log says each is disabled."""
    [pod] = kubectl.json("-n", "kube-system", "get", "pod", "-l", "component=kube-controller-manager")["items"]
    assert f"--controllers={KCM_CONTROLLERS}" in pod["spec"]["containers"][0]["command"]
    kcm_log = kubectl("-n", "kube-system", "logs", pod["metadata"]["name"])
    for name in PYKCM_CONTROLLERS:
        assert f'"Warning: controller is disabled" controller="{name}"' in kcm_log


def wait_for_default_service_account(kubectl: Kubectl, namespace: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while "default" not in kubectl("-n", namespace, "get", "serviceaccounts", "-o", "name"):
        assert time.monotonic() < deadline, f"no default ServiceAccount in {namespace} after {timeout:.0f}s"
        time.sleep(1)


@pytest.fixture(scope="module")
def kind_cluster(testenv_log: Callable[[str], None], tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindCluster]:
    """A kind cluster from deploy/kind on the private engine; at teardown, after `kind delete
    cluster`, the host holds what it held before (the engine running), and after the engine's
    stop none of the cluster's links, host rules or cgroups."""
    if missing := cluster.missing_prerequisites():
        pytest.skip("; ".join(missing))
    engine_dir = nodeimage.default_docker_directory()
    with docker.running(engine_dir, log=testenv_log, wait=ENGINE_WAIT) as engine:
        before = cluster.host_traces(engine_dir)  # the engine's own mounts, and whatever others left
        image = nodeimage.ensure_node_image(testenv_log, engine)
        kind = nodeimage.ensure_kind(testenv_log)
        with cluster.running(engine, image, kind, tmp_path_factory.mktemp("kind"), log=testenv_log) as made:
            ids = made.container_ids()
            during = cluster.host_traces(engine_dir, ids)  # what teardown must see go again
            assert f"link {cluster.BRIDGE}" in during and any(cluster.GUARD_CHAIN in t for t in during), during
            yield made
        assert not set(ids) & set(engine.docker("ps", "--all", "--no-trunc", "--quiet").stdout.split())
        assert cluster.NETWORK not in engine.docker("network", "ls", "--format", "{{.Name}}").stdout.split()
        # dockerd mounts its host network namespace once a container (here pykcm's image build) uses it: the
        # engine's own mount, which goes when the engine stops (checked below), not the cluster's.
        engine_netns = f"mount {(engine_dir / 'run' / 'exec' / 'netns' / 'default').resolve()}"
        assert [t for t in cluster.host_traces(engine_dir, ids) if t != engine_netns] == before
    # After the engine's stop (another run may take its directory at once: its mounts are not ours).
    assert set(cluster.host_traces(None, ids)) == {line for line in before if not line.startswith("mount ")}


def test_a_second_cluster_on_the_engine_is_refused_in_one_line_and_changes_nothing(
    kind_cluster: KindCluster, testenv_log: Callable[[str], None], tmp_path: Path
) -> None:
    """An existing cluster (of the same name or another): create() names it and the fix, before it
    makes anything, and the running cluster and the host are as they were."""
    made = kind_cluster
    ids = made.container_ids()
    traces = cluster.host_traces(made.engine.directory, ids)
    image = nodeimage.ensure_node_image(testenv_log, made.engine)
    with pytest.raises(cluster.KindError) as refused:
        cluster.create(made.engine, image, made.kind, tmp_path / "second", log=testenv_log)
    message = str(refused.value)
    assert "\n" not in message and "already run" in message and "kind delete clusters" in message, message
    assert made.container_ids() == ids
    assert cluster.host_traces(made.engine.directory, ids) == traces
    assert not (tmp_path / "second").exists()


def test_kind_cluster_with_pykcm_from_outside(
    kind_cluster: KindCluster, testenv_log: Callable[[str], None], tmp_path: Path
) -> None:
    made = kind_cluster
    kubectl = kubectl_for(made, testenv_log)
    [worker] = [name for name in made.nodes() if name.endswith("-worker")]
    kubectl("wait", "--for=condition=Ready", "nodes", "--all", f"--timeout={WAIT}")
    assert_kcm_runs_without_pykcms_controllers(kubectl)

    pykcm = PykcmProcess("--kubeconfig", str(made.kubeconfig), log_path=tmp_path / "pykcm.log")
    try:
        # CoreDNS's ReplicaSet gets its pods from pykcm; Running and Ready means they reach
        # the apiserver through the kubernetes Service (kube-proxy, the ptp network).
        kubectl("-n", "kube-system", "rollout", "status", "deployment/coredns", f"--timeout={WAIT}")
        namespace = "kind-pykcm"
        kubectl("create", "namespace", namespace)
        wait_for_default_service_account(kubectl, namespace)
        kubectl("apply", "-f", "-", stdin=deployment("pause", namespace, worker))
        kubectl("-n", namespace, "rollout", "status", "deployment/pause", f"--timeout={WAIT}")
        pods = kubectl.json("-n", namespace, "get", "pods", "-l", "app=pause")["items"]
        assert [p["spec"]["nodeName"] for p in pods] == [worker, worker]
        kubectl("delete", "namespace", namespace, "--wait=false")
        kubectl("wait", "--for=delete", f"namespace/{namespace}", f"--timeout={WAIT}")
    finally:
        pykcm.kill()
    assert "Traceback" not in pykcm.log()


def kind_node(made: KindCluster, name: str) -> Node:
    """A kind node as tests/incluster.py reaches it: commands run in the node container."""
    return Node(name, lambda argv: made.engine.docker("exec", name, *argv, timeout=60).stdout, CONTAINERD_SOCKET)


def readme_step(command: str) -> list[str]:
    """A command of the README's recipe, split into its arguments after the program's name."""
    readme = (CHECKOUT / "README.md").read_text()
    assert command in readme, f"the README's kind recipe no longer says: {command}"
    return command.split()[1:]


async def test_kind_cluster_with_pykcm_inside(
    kind_cluster: KindCluster, testenv_log: Callable[[str], None], tmp_path: Path
) -> None:
    made = kind_cluster
    kubectl = kubectl_for(made, testenv_log)
    [control_plane] = [name for name in made.nodes() if name.endswith("-control-plane")]
    [worker] = [name for name in made.nodes() if name.endswith("-worker")]
    node = kind_node(made, control_plane)
    assert_kcm_runs_without_pykcms_controllers(kubectl)

    # `docker build -t pykcm:dev .`, by the engine kind's nodes run on, then loaded into them.
    started = time.monotonic()
    image = pykcm_image.build(made.engine, CHECKOUT, log=testenv_log)
    subprocess.run([str(made.kind), *readme_step(README_LOAD)], env=made.env(), check=True, capture_output=True,
                   timeout=600)
    testenv_log(f"DURATION [kind] pykcm image built and loaded: {format_duration(time.monotonic() - started)} "
                f"({image.size / 1e6:.0f} MB)")

    started = time.monotonic()
    kubectl(*readme_step(README_APPLY))
    daemonset = next(o for o in kustomize(kubectl.binary, DEPLOY) if o["kind"] == "DaemonSet")
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(standby_daemonset(daemonset)))  # the test's, not the README's
    client = admin_client(made.kubeconfig)
    try:
        pod = await one_ready_pod(client, "pykcm")
        standby_pod = await one_ready_pod(client, STANDBY)
        testenv_log(f"DURATION [kind] apply -k -> both pods Ready: {format_duration(time.monotonic() - started)}")
        assert pod["spec"]["nodeName"] == standby_pod["spec"]["nodeName"] == control_plane
        assert_hardened_as_deploy_says(node, pod, daemonset, "pykcm:dev")
        assert_in_cluster_config(pod, pod_log(kubectl, pod))
        leader, standby = await the_one_leader(client, kubectl, [pod, standby_pod])

        await user_deployment_gets_ready_pods(client, pause_pod_spec(worker), worker, testenv_log, "kind")
        readme_deployment_scales(kubectl)
        # The probes kept passing: both still Ready, and the kubelet restarted neither container.
        for ours in (pod, standby_pod):
            now = kubectl.json("-n", "kube-system", "get", "pod", ours["metadata"]["name"])
            assert is_ready(now) and now["status"]["containerStatuses"][0]["restartCount"] == 0, now["status"]
        await leader_pod_deletion_hands_over(client, kubectl, node, daemonset, leader, standby, testenv_log, "kind")
    finally:
        await client.close()


def readme_deployment_scales(kubectl: Kubectl) -> None:
    """`kubectl create deployment web ... --replicas=3`, then scaled to 5: pykcm makes the pods."""
    kubectl(*readme_step(README_CREATE))
    try:
        for replicas, step in ((3, None), (5, README_SCALE)):
            if step:
                kubectl(*readme_step(step))
            kubectl("rollout", "status", "deployment/web", f"--timeout={WAIT}")
            pods = kubectl.json("get", "pods", "-l", "app=web", "--show-managed-fields")["items"]
            assert len(pods) == replicas, [p["metadata"]["name"] for p in pods]
            managers = {f["manager"] for p in pods for f in p["metadata"]["managedFields"]
                        if f["operation"] == "Update" and not f.get("subresource")}
            assert managers == {"pykcm"}, managers
    finally:
        kubectl("delete", "deployment", "web", "--wait=true")
