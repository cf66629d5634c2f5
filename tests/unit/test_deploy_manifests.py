"""deploy/'s manifests read as files, no cluster and no kubectl: the kind recipe's hand-over of
pykcm's controllers whatever kubeadm config version kind renders, and the DaemonSet's bind address
and probes against kubeadm's kube-controller-manager (tests/integration/test_deploy.py renders them
with kustomize and runs them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pykcm.app import cli
from pykcm.app.kcmflags import KCM_CONTROLLER_ALIASES
from pykcm.app.options import Options
from pykcm.testenv.nodes import PYKCM_CONTROLLERS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# kind renders kubeadm.k8s.io/v1beta4 for v1.36+ node images from kind v0.32.0 on, v1beta3 before
# (kind's pkg/cluster/internal/kubeadm/config.go), and drops without a word a patch whose
# apiVersion matches no document it rendered.
KUBEADM_CONFIG_VERSIONS = {"kubeadm.k8s.io/v1beta3", "kubeadm.k8s.io/v1beta4"}
# kubeadm's KCM runs `--controllers=*,bootstrapsigner,tokencleaner`: both are off by default in KCM
# and a worker's `kubeadm join` waits for the bootstrap signer.
KUBEADMS_OWN = {"bootstrap-signer-controller", "token-cleaner-controller"}
# cmd/kubeadm/app/util/staticpod/utils.go (v1.36.3): LivenessProbe and StartupProbe, the latter with
# failureThreshold ceil(ControlPlaneComponentHealthCheck / period) = ceil(4 min / 10 s).
KUBEADM_LIVENESS = {"initialDelaySeconds": 10, "periodSeconds": 10, "timeoutSeconds": 15, "failureThreshold": 8}
KUBEADM_STARTUP = {"initialDelaySeconds": 10, "periodSeconds": 10, "timeoutSeconds": 15, "failureThreshold": 24}
TIMINGS = ("initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold")


def kind_cluster_configuration_patches() -> list[dict[str, Any]]:
    """Every ClusterConfiguration patch of the kind recipe, the cluster's and each node's."""
    config = yaml.safe_load((DEPLOY / "kind" / "kind-config.yaml").read_text())
    raw = [*config.get("kubeadmConfigPatches", []),
           *(p for node in config["nodes"] for p in node.get("kubeadmConfigPatches", []))]
    return [doc for doc in map(yaml.safe_load, raw) if doc["kind"] == "ClusterConfiguration"]


def controller_manager_args(patch: dict[str, Any]) -> dict[str, str]:
    """extraArgs as a map: v1beta3 has one, v1beta4 a list of name/value pairs."""
    extra = patch["controllerManager"]["extraArgs"]
    if patch["apiVersion"] == "kubeadm.k8s.io/v1beta3":
        assert isinstance(extra, dict), "v1beta3's extraArgs is a map"
        return extra
    assert isinstance(extra, list), "v1beta4's extraArgs is a list of name/value pairs"
    return {a["name"]: a["value"] for a in extra}


def kcm_choices(controllers: str) -> tuple[bool, set[str], set[str]]:
    """KCM's reading of a --controllers value: `*` or not, the names turned on and those turned
    off, aliases made canonical (controller-manager's options/generic.go)."""
    names = controllers.split(",")
    on = {KCM_CONTROLLER_ALIASES.get(n, n) for n in names if n != "*" and not n.startswith("-")}
    off = {KCM_CONTROLLER_ALIASES.get(n[1:], n[1:]) for n in names if n.startswith("-")}
    return "*" in names, on, off


def test_kind_recipe_hands_pykcms_controllers_over_whichever_kubeadm_config_kind_renders() -> None:
    patches = kind_cluster_configuration_patches()
    assert {p["apiVersion"] for p in patches} == KUBEADM_CONFIG_VERSIONS
    assert len(patches) == len(KUBEADM_CONFIG_VERSIONS)
    args = [controller_manager_args(p) for p in patches]
    assert all(a == args[0] for a in args), "the patches of the two versions differ"
    # kind's own flag: a v1beta4 list replaces kind's, so the recipe repeats it (and v1beta3 alike).
    assert args[0]["enable-hostpath-provisioner"] == "true"
    star, on, off = kcm_choices(args[0]["controllers"])
    assert star and on == KUBEADMS_OWN and off == set(PYKCM_CONTROLLERS)


def test_kcm_choices_reads_kubeadms_aliases_as_kcm_does() -> None:
    assert kcm_choices("*,bootstrapsigner,tokencleaner,-replicaset,-namespace-controller") == (
        True, KUBEADMS_OWN, {"replicaset-controller", "namespace-controller"})


def daemonset_container() -> dict[str, Any]:
    daemonset = yaml.safe_load((DEPLOY / "daemonset.yaml").read_text())
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    return container


def expanded_args(container: dict[str, Any], values: dict[str, str]) -> list[str]:
    """The container's args with `$(NAME)` replaced as the kubelet does, from `values` for the
    downward API's fields and from `value` for the rest."""
    env = {e["name"]: e["value"] if "value" in e else values[e["valueFrom"]["fieldRef"]["fieldPath"]]
           for e in container.get("env", [])}
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m[1]], a) for a in container["args"]]


def test_secure_port_listens_on_the_pods_ip_only() -> None:
    """Not every interface of the node (0.0.0.0, pykcm's and KCM's default): kubeadm binds KCM to
    127.0.0.1, but pykcm's Service endpoints and probes reach it at the pod's IP, which on the host
    network is the node's."""
    container = daemonset_container()
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
    assert [a for a in container["args"] if a.startswith("--bind-address")] == ["--bind-address=$(POD_IP)"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert "host" not in container[probe]["httpGet"], f"{probe}: the kubelet probes the pod's IP"


@pytest.mark.parametrize("pod_ip", ["10.89.0.7", "fd00:10:89::7"])
def test_pykcm_run_takes_the_daemonsets_args_as_the_kubelet_expands_them(
    pod_ip: str, started_options: list[Options]
) -> None:
    runs = started_options
    assert cli.main(expanded_args(daemonset_container(), {"status.podIP": pod_ip})) == 0
    [options] = runs
    assert (options.bind_address, options.secure_port, options.leader_elect) == (pod_ip, 10357, True)


def test_probes_time_out_and_start_as_kubeadms_kcm() -> None:
    """/livez restarts pykcm when KCM's /healthz would restart KCM: the same timings, and a startup
    probe giving a slow start kubeadm's 4 minutes. The readiness probe (KCM has none) waits as long."""
    container = daemonset_container()
    for probe, kubeadm in (("livenessProbe", KUBEADM_LIVENESS), ("startupProbe", KUBEADM_STARTUP)):
        assert container[probe]["httpGet"] == {"path": "/livez", "port": "https", "scheme": "HTTPS"}
        assert {k: container[probe].get(k) for k in TIMINGS} == kubeadm, probe
    assert container["readinessProbe"]["timeoutSeconds"] == KUBEADM_LIVENESS["timeoutSeconds"]


def readme_controllers_examples() -> list[str]:
    """Every --controllers value the README shows, as `--controllers=...` or a quoted `value:`."""
    text = (DEPLOY.parent / "README.md").read_text()
    return re.findall(r"`--controllers=([^`]+)`", text) + re.findall(r'value: "(\*,[^"]+)"', text)


def test_every_readme_example_handing_pykcms_three_over_keeps_kubeadms_two() -> None:
    """Copying one must not turn off the bootstrap signer `kubeadm join` waits for."""
    handing_over = [value for value in readme_controllers_examples()
                    if "..." not in value and kcm_choices(value)[2] >= set(PYKCM_CONTROLLERS)]
    assert handing_over
    for value in handing_over:
        star, on, off = kcm_choices(value)
        assert star and on >= KUBEADMS_OWN and off == set(PYKCM_CONTROLLERS), value
