"""The kind node image assembled here is a working kind node image: kubeadm finds every image it
asks for in the node's containerd, the node's binaries are the ones built from v1.36.3, the
image is configured as kind runs it, and the preloaded images run (each exported from the
node's containerd and run on the private engine, kube-proxy's iptables in a network namespace of
its own). Nothing here changes the host's network: no bridge, no `kind create cluster`."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pykcm.testenv import docker
from pykcm.testenv.docker import DockerEngine
from pykcm.testenv.errors import BuildError
from pykcm.testenv.kind import nodeimage, preload

# Cold, the first test also waits for the whole assembly (Go builds, debootstrap): 15-20 minutes on 2 cores.
pytestmark = [pytest.mark.integration, pytest.mark.kind, pytest.mark.late("kind-node-image"),
              pytest.mark.timeout(3600)]

ENGINE_WAIT = 900.0  # seconds; another session may hold the kind engine's directory
# The node's own containerd, without its CRI side, on the image's store (as the assembly ran it).
_CONTAINERD = """set -euo pipefail
printf 'version = 2\\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\\n' > /tmp/c.toml
containerd --config /tmp/c.toml > /tmp/containerd.log 2>&1 &
for _ in $(seq 100); do ctr version > /dev/null 2>&1 && break; sleep 0.2; done
"""


@pytest.fixture(scope="module")
def node_image(testenv_log: Callable[[str], None]) -> Iterator[tuple[DockerEngine, str]]:
    missing = nodeimage.missing_prerequisites()
    if missing:
        pytest.skip("; ".join(missing))
    with docker.running(nodeimage.default_docker_directory(), log=testenv_log, wait=ENGINE_WAIT) as engine:
        yield engine, nodeimage.ensure_node_image(testenv_log, engine)


def in_node(engine: DockerEngine, image: str, script: str, *volumes: str) -> str:
    """Run `script` with bash in a container of the node image: host network, no systemd."""
    mounts = [f"--volume={volume}" for volume in volumes]
    return engine.docker("run", "--rm", "--network=host", *mounts, "--entrypoint=/bin/bash", image, "-c", script,
                         timeout=600).stdout


def test_kubeadm_lists_exactly_the_images_in_the_nodes_containerd(node_image):
    engine, image = node_image
    out = in_node(engine, image, _CONTAINERD + (
        'echo "kubeadm: $(kubeadm config images list --kubernetes-version "$(cat /kind/version)" | xargs)"\n'
        'echo "store: $(ctr -n k8s.io images ls -q | xargs)"\n'
    ))
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    wanted, stored = lines["kubeadm"].split(), lines["store"].split()
    assert tuple(wanted) == preload.kubeadm_images()
    assert sorted(stored) == sorted(wanted)


def test_the_node_runs_v1_36_3_on_systemd_containerd_and_runc_1_5(node_image):
    engine, image = node_image
    out = in_node(engine, image, (
        'echo "kubelet: $(kubelet --version)"; echo "kubeadm: $(kubeadm version -o short)";'
        'echo "kubectl: $(kubectl version --client | head -1)"; echo "containerd: $(containerd --version)";'
        'echo "runc: $(runc --version | xargs)"; echo "init: $(readlink -f /sbin/init)";'
        'echo "systemd: $(/usr/lib/systemd/systemd --version | head -1)"; echo "version: $(cat /kind/version)";'
        'echo "entrypoint: $(stat -c %a /usr/local/bin/entrypoint)";'
        'echo "hooks: $(jq -c .hooks.createContainer /etc/containerd/cri-base.json)";'
        'echo "enabled: $(systemctl is-enabled containerd kubelet undo-mount-hacks systemd-binfmt | xargs)"'
    ))
    found = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert found["kubelet"] == "Kubernetes v1.36.3"
    assert found["kubeadm"] == "v1.36.3"
    assert found["kubectl"] == "Client Version: v1.36.3"
    assert found["containerd"].startswith("containerd ") and " 1.6.20" in found["containerd"], found
    assert found["runc"].startswith("runc version 1.5.2 ") and "seccomp" in found["runc"], found
    assert found["init"] == "/usr/lib/systemd/systemd"
    assert found["systemd"].startswith("systemd 252 "), found
    assert found["version"] == "v1.36.3"
    assert found["entrypoint"] == "755"
    assert json.loads(found["hooks"]) == [{"path": "/kind/bin/mount-product-files.sh"}]
    assert found["enabled"] == "enabled enabled enabled masked"


def test_the_image_is_configured_as_kind_runs_a_node(node_image):
    engine, image = node_image
    config = json.loads(engine.docker("image", "inspect", image).stdout)[0]["Config"]
    assert config["Entrypoint"] == ["/usr/local/bin/entrypoint", "/sbin/init"]
    assert not config["Cmd"]
    assert "container=docker" in config["Env"]
    assert config["StopSignal"] == "SIGRTMIN+3"


def test_the_preloaded_images_run(node_image, tmp_path: Path):
    engine, image = node_image
    images = preload.kubeadm_images()
    in_node(engine, image, _CONTAINERD + f"ctr -n k8s.io images export /out/all.tar {' '.join(images)}\n",
            f"{tmp_path}:/out")
    engine.docker("load", "--input", str(tmp_path / "all.tar"), timeout=600)
    try:
        def run(reference: str, *argv: str, entrypoint: str = "") -> str:
            args = ["run", "--rm", "--network=none", *([f"--entrypoint={entrypoint}"] if entrypoint else [])]
            return engine.docker(*args, reference, *argv).stdout

        apiserver, kcm, scheduler, proxy, coredns, pause, etcd = images
        for reference, binary in ((apiserver, "kube-apiserver"), (kcm, "kube-controller-manager"),
                                  (scheduler, "kube-scheduler"), (proxy, "kube-proxy")):
            assert run(reference, "--version", entrypoint=binary).strip() == "Kubernetes v1.36.3", binary
        assert "etcd Version: 3.6.8" in run(etcd, "--version", entrypoint="etcd")
        assert "CoreDNS-1.14.2" in run(coredns, "-version")
        assert run(pause, "-v").strip() == "pause.c v3.10.2"
        # kube-proxy's iptables, in the container's own network namespace: the host's stays untouched.
        rules = engine.docker(
            "run", "--rm", "--network=none", "--cap-add=NET_ADMIN", "--entrypoint=/bin/sh", proxy, "-c",
            "iptables --version && iptables -t nat -N PYKCM-PROBE && iptables-save -t nat && ip6tables-save -t filter",
        ).stdout
        assert rules.startswith("iptables v1.8.9"), rules
        assert ":PYKCM-PROBE - [0:0]" in rules
    finally:
        engine.docker("rmi", *images, check=False)


def test_a_second_call_reuses_the_image(node_image):
    engine, image = node_image
    lines: list[str] = []
    started = time.monotonic()
    assert nodeimage.ensure_node_image(lines.append, engine) == image
    assert time.monotonic() - started < 60
    assert not any("assembling" in line for line in lines), lines


def test_a_failed_assembly_leaves_no_image_and_no_container(node_image, monkeypatch: pytest.MonkeyPatch):
    engine, _ = node_image
    failing = "pykcm-local/kind-node:test-failed-assembly"
    monkeypatch.setattr(nodeimage, "image_reference", lambda digest: failing)
    monkeypatch.setattr(nodeimage, "_ASSEMBLE", "echo importing; exit 3")
    containers = engine.docker("ps", "--all", "--quiet").stdout.split()
    with pytest.raises(BuildError, match=r"node image assembly failed \(exit 3\)"):
        nodeimage.ensure_node_image(lambda _: None, engine)
    assert not engine.image_exists(failing)
    assert engine.docker("ps", "--all", "--quiet").stdout.split() == containers


def test_kind_is_built_at_the_version_of_the_node_files():
    kind = nodeimage.ensure_kind(lambda _: None)
    out = subprocess.run([str(kind), "version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("kind v0.33.0 "), out
