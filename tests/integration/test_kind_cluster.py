"""The README's kind recipe, for real and offline: `kind create cluster` with deploy/kind/kind-config.yaml
and the node image assembled here makes a control plane and a worker whose KCM leaves the
ReplicaSet, Namespace and ServiceAccount controllers alone; pykcm run from outside (on the host,
with kind's kubeconfig) does their work; `kind delete cluster` and the engine's stop leave nothing
on the host. Every address touched is on this machine: kind's apiserver on loopback, the nodes on
the private engine's bridge (which a host rule keeps from forwarding anywhere else)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pykcm.testenv import docker
from pykcm.testenv.build import KUBECTL, ensure_components
from pykcm.testenv.kind import cluster, nodeimage
from pykcm.testenv.kind.cluster import KindCluster
from pykcm.testenv.kind.preload import PAUSE_IMAGE
from pykcm.testenv.nodes import KCM_CONTROLLERS, PYKCM_CONTROLLERS
from tests.support import PykcmProcess

# Cold, the node image's assembly comes first (Go builds, debootstrap): 15-20 minutes on 2 cores.
pytestmark = [pytest.mark.integration, pytest.mark.kind, pytest.mark.timeout(3600)]

ENGINE_WAIT = 900.0  # seconds; another session may hold the kind engine's directory
WAIT = "180s"  # each kubectl wait; pods start in seconds, on a shared 2-core machine in tens


class Kubectl:
    def __init__(self, kubeconfig: Path, log: Callable[[str], None]) -> None:
        self.argv = [str(ensure_components((KUBECTL,), log)[KUBECTL]), "--kubeconfig", str(kubeconfig)]

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run([*self.argv, *args], input=stdin, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr.strip()}"
        return done.stdout

    def json(self, *args: str) -> dict:
        return json.loads(self(*args, "-o", "json"))


def deployment(name: str, namespace: str, node: str) -> str:
    """2 pause pods pinned to `node`, from the image the node preloads (nothing is pulled)."""
    return json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 2, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
            }},
        },
    })


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
        assert cluster.host_traces(engine_dir, ids) == before
    # After the engine's stop (another run may take its directory at once: its mounts are not ours).
    assert set(cluster.host_traces(None, ids)) == {line for line in before if not line.startswith("mount ")}


def test_kind_cluster_with_pykcm_from_outside(
    kind_cluster: KindCluster, testenv_log: Callable[[str], None], tmp_path: Path
) -> None:
    made = kind_cluster
    kubectl = Kubectl(made.kubeconfig, testenv_log)
    [worker] = [name for name in made.nodes() if name.endswith("-worker")]
    kubectl("wait", "--for=condition=Ready", "nodes", "--all", f"--timeout={WAIT}")

    # KCM runs without pykcm's three controllers: its flag, and its log says so.
    [pod] = kubectl.json("-n", "kube-system", "get", "pod", "-l", "component=kube-controller-manager")["items"]
    assert f"--controllers={KCM_CONTROLLERS}" in pod["spec"]["containers"][0]["command"]
    kcm_log = kubectl("-n", "kube-system", "logs", pod["metadata"]["name"])
    for name in PYKCM_CONTROLLERS:
        assert f'"Warning: controller is disabled" controller="{name}"' in kcm_log

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
