"""Run the test suite's pykcm with deploy/'s ServiceAccount and RBAC instead of an admin credential.

`PYKCM_TEST_CREDENTIALS=deploy` (or `deploy-sa-credentials`, which adds the
service-account-credentials component and `--use-service-account-credentials`) makes the
session fixture apply deploy/'s RBAC to the control plane, mint a token for `kube-system/pykcm`
with TokenRequest, and point every in-process pykcm at it. The tests themselves keep the admin
credential, so a verb missing from deploy/ makes the controllers fail and the scenarios with them.
`PYKCM_TEST_DEPLOY_DIR` swaps in another deploy/ (the negative control uses one without a verb).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from pykcm.testenv.build import ensure_binaries
from pykcm.testenv.controlplane import ControlPlane
from tests.support import CONTROLLER_KUBECONFIG_ENV, SA_CREDENTIALS_ENV

CREDENTIALS_ENV = "PYKCM_TEST_CREDENTIALS"
DEPLOY_DIR_ENV = "PYKCM_TEST_DEPLOY_DIR"
DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
MODES = {"deploy": (), "deploy-sa-credentials": ("service-account-credentials",)}


def write_overlay(
    directory: Path, deploy_dir: Path, components: tuple[str, ...] = (), *,
    resources: tuple[str, ...] = (), images: tuple[dict, ...] = (),
) -> Path:
    """A user's overlay of deploy/ in `directory` (deploy/ copied to base/), with components,
    extra resources (files in `directory`) and kustomize `images:` entries; for kubectl
    kustomize, apply -k and delete -k."""
    if not (directory / "base").exists():
        shutil.copytree(deploy_dir, directory / "base")
    overlay: dict = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["base", *resources],
        "components": [f"base/{c}" for c in components],
    }
    if images:
        overlay["images"] = list(images)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return directory


def kustomize(kubectl: Path, directory: Path) -> list[dict]:
    out = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render_deploy(kubectl: Path, deploy_dir: Path, components: tuple[str, ...]) -> list[dict]:
    """deploy/ with components, rendered by the real kubectl's kustomize, as a user's overlay."""
    with tempfile.TemporaryDirectory() as tmp:
        return kustomize(kubectl, write_overlay(Path(tmp), deploy_dir, components))


def install_deploy_credentials(plane: ControlPlane, mode: str) -> Path:
    """Apply deploy/'s RBAC and return a kubeconfig holding only the pykcm ServiceAccount's token."""
    return install_deploy_credentials_with(plane.kubeconfig, mode, plane.directory / f"pykcm-{mode}.kubeconfig")


def install_deploy_credentials_with(admin_kubeconfig: Path, mode: str, kubeconfig: Path) -> Path:
    """install_deploy_credentials for any cluster (a kind cluster's too): deploy/'s RBAC applied with
    `admin_kubeconfig`, and `kubeconfig` written with that kubeconfig's cluster (server and CA) and
    only the pykcm ServiceAccount's token."""
    if mode not in MODES:
        raise ValueError(f"{CREDENTIALS_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    kubectl = ensure_binaries(need_kubectl=True, log=lambda _: None).kubectl
    assert kubectl is not None
    deploy_dir = Path(os.environ.get(DEPLOY_DIR_ENV) or DEPLOY)
    rbac = [o for o in render_deploy(kubectl, deploy_dir, MODES[mode]) if o["kind"] in RBAC_KINDS]
    admin = ["--kubeconfig", str(admin_kubeconfig)]
    subprocess.run(
        [kubectl, *admin, "apply", "--server-side", "--force-conflicts", "-f", "-"],
        input=yaml.safe_dump_all(rbac), capture_output=True, text=True, check=True,
    )
    token = subprocess.run(
        [kubectl, *admin, "create", "token", "pykcm", "-n", "kube-system", "--duration=3h"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": _current_cluster(admin_kubeconfig)}],
        "users": [{"name": "pykcm", "user": {"token": token}}],
        "contexts": [{"name": "pykcm", "context": {"cluster": "local", "user": "pykcm"}}],
        "current-context": "pykcm",
    }
    kubeconfig.write_text(yaml.safe_dump(config))
    return kubeconfig


def _current_cluster(kubeconfig: Path) -> dict:
    """The `cluster` entry (server, CA) of a kubeconfig's current context."""
    config = yaml.safe_load(kubeconfig.read_text())
    [context] = [c["context"] for c in config["contexts"] if c["name"] == config["current-context"]]
    [cluster] = [c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"]]
    return cluster


def run_managers_as(kubeconfig: Path, mode: str) -> None:
    """Point the in-process managers of tests/support.py at `kubeconfig` for the rest of the
    session (only the session control plane does this: the variables outlive every fixture)."""
    os.environ[CONTROLLER_KUBECONFIG_ENV] = str(kubeconfig)
    if mode == "deploy-sa-credentials":
        os.environ[SA_CREDENTIALS_ENV] = "1"
