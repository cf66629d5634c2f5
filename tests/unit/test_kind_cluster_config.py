"""What kind/cluster.py adds to the README's kind recipe for this machine, and how its docker
wrapper rewrites kind's node containers (run here against a script that prints its arguments)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from pykcm.testenv.docker import DockerEngine
from pykcm.testenv.kind import cluster, nodeimage
from pykcm.testenv.nodes import KCM_CONTROLLERS, KUBEADM_CONTROLLERS


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
