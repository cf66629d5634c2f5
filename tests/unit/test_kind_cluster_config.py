"""What kind/cluster.py adds to the README's kind recipe for this machine, and how its docker
wrapper rewrites kind's node containers (run here against a script that prints its arguments)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from pykcm.testenv.docker import DockerEngine, DockerError
from pykcm.testenv.kind import cluster, nodeimage
from pykcm.testenv.nodes import KCM_CONTROLLERS, KUBEADM_CONTROLLERS
from tests.unit.test_deploy_manifests import controller_manager_args


def test_the_recipe_is_kept_and_gets_the_machines_workarounds() -> None:
    recipe = yaml.safe_load(cluster.RECIPE.read_text())
    config = cluster.cluster_config()
    assert config["nodes"] == recipe["nodes"] and config["name"] == recipe["name"]
    assert config["networking"]["disableDefaultCNI"] is True
    [kubelet] = [yaml.safe_load(p) for p in config["kubeadmConfigPatches"]]
    assert kubelet == {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                       "failCgroupV1": False}
    patch = yaml.safe_load(config["nodes"][0]["kubeadmConfigPatches"][0])
    args = {a["name"]: a["value"] for a in patch["controllerManager"]["extraArgs"]}
    # The recipe's list replaces kind's: kind's own flag must be in it.
    assert args == {"enable-hostpath-provisioner": "true", "controllers": KCM_CONTROLLERS}


def test_kcm_controllers_replace_only_the_recipes_controllers_value() -> None:
    """The KCM side of test_upstream_kind.py: KCM runs every controller, the rest is the recipe."""
    config = cluster.cluster_config(kcm_controllers=KUBEADM_CONTROLLERS)
    patch = yaml.safe_load(config["nodes"][0]["kubeadmConfigPatches"][0])
    args = {a["name"]: a["value"] for a in patch["controllerManager"]["extraArgs"]}
    assert args == {"enable-hostpath-provisioner": "true", "controllers": KUBEADM_CONTROLLERS}
    # In the patch of every kubeadm config version kind may render (v1beta3: a map).
    patches = [yaml.safe_load(p) for p in config["nodes"][0]["kubeadmConfigPatches"]]
    assert {controller_manager_args(p)["controllers"] for p in patches} == {KUBEADM_CONTROLLERS}
    assert config["nodes"][1:] == cluster.cluster_config()["nodes"][1:]
    assert config["kubeadmConfigPatches"] == cluster.cluster_config()["kubeadmConfigPatches"]


def wrapper_argv(tmp_path: Path, *args: str) -> list[str]:
    printer = tmp_path / "print-args"
    printer.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    printer.chmod(0o755)
    cluster.write_wrapper(tmp_path, DockerEngine(tmp_path / "engine", []), real=str(printer))
    out = subprocess.run([str(tmp_path / "bin" / "docker"), *args], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_the_wrapper_runs_nodes_without_privileged_and_with_the_boot_script(tmp_path: Path) -> None:
    argv = wrapper_argv(tmp_path, "run", "--name", "n", "--privileged", "--volume", "/lib/modules:/lib/modules:ro",
                        "--net", "kind", "image")
    assert "--privileged" not in argv
    assert argv[:4] == ["run", "--dns=127.0.0.1", f"--volume={tmp_path / 'boot.sh'}:{cluster.BOOT}:ro",
                        f"--entrypoint={cluster.BOOT}"]
    assert argv[argv.index("n") + 1: argv.index("n") + 1 + len(cluster.PRIVILEGED)] == list(cluster.PRIVILEGED)
    assert ("/lib/modules:/lib/modules:ro" in argv) == os.path.isdir("/lib/modules")  # docker would create it
    assert argv[-3:] == ["--net", "kind", "image"]


def test_the_wrapper_drops_privileged_from_exec_and_leaves_the_rest(tmp_path: Path) -> None:
    assert wrapper_argv(tmp_path, "exec", "--privileged", "n", "cat", "/kind/version") == [
        "exec", "n", "cat", "/kind/version"]
    assert wrapper_argv(tmp_path, "ps", "--privileged") == ["ps", "--privileged"]


def test_the_cluster_module_is_no_input_of_the_node_image() -> None:
    names = {path.name for path in nodeimage.SOURCES}
    assert "cluster.py" not in names and "nodeimage.py" in names


class _Engine(DockerEngine):
    """An engine holding the node image and no network; every docker command is recorded."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, [])
        self.calls: list[tuple[str, ...]] = []

    def docker(self, *args: str, timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        if args[:2] == ("network", "create"):  # as when the host has the bridge already
            raise DockerError("docker network create failed (exit 1): bridge pykcm-kind already exists")
        code = 1 if args[:2] == ("network", "inspect") else 0
        return subprocess.CompletedProcess(list(args), code, "", "")


def test_a_bridge_of_another_engine_is_refused_and_neither_it_nor_the_host_rule_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another engine's kind cluster runs (its bridge is on the host): a create() on this engine must
    not, failing, remove the host rule that cluster relies on."""
    host_commands: list[list[str]] = []

    def run(argv, check: bool = True) -> subprocess.CompletedProcess[str]:
        host_commands.append(list(argv))
        if argv[:2] == ["ip", "-j"]:
            return subprocess.CompletedProcess(argv, 0, "[]", "")
        # The bridge exists; any iptables change is the host rule's.
        return subprocess.CompletedProcess(argv, 0 if argv[:3] == ["ip", "link", "show"] else 1, "", "")

    monkeypatch.setattr(cluster.hostnet, "run", run)
    kind = tmp_path / "kind"
    kind.write_text("#!/bin/sh\nexit 0\n")
    kind.chmod(0o755)
    engine = _Engine(tmp_path / "engine")
    with pytest.raises(cluster.KindError, match="the bridge pykcm-kind exists but is no network of the engine"):
        cluster.create(engine, "pykcm-local/kind-node:x", kind, tmp_path / "kind-dir", log=lambda _: None)
    assert not [argv for argv in host_commands if argv[0] in ("iptables", "ip6tables")]
    assert not [args for args in engine.calls if args[:2] == ("network", "rm")]
    assert not (tmp_path / "kind-dir").exists()
