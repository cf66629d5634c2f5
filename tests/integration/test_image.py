"""pykcm's container image, built from this checkout by a private Docker engine on a local Debian
base (no registry is reachable here), inspected, and run hardened against the real control plane."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pykcm.testenv import image as pykcm_image
from pykcm.testenv.baseimage import HOST_CA_BUNDLE
from pykcm.testenv.docker import DockerEngine
from tests.integration.test_run import default_sa_appears
from tests.support import CHECKOUT, checkout_env, free_port, https_get, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.image]

ENGINE_WAIT = 900.0  # seconds; another session's image tests take about a minute warm, four cold
HARDENED = ["--read-only", "--tmpfs=/tmp", "--user=65532:65532", "--cap-drop=ALL",
            "--security-opt=no-new-privileges", "--network=host"]


@pytest.fixture(scope="module")
def built(testenv_log: Callable[[str], None]) -> Iterator[tuple[DockerEngine, pykcm_image.Image]]:
    missing = pykcm_image.missing_prerequisites()
    if missing:
        pytest.skip("; ".join(missing))
    # Parallel test sessions on one machine share the engine's directory (and its cache): take turns.
    with pykcm_image.built(CHECKOUT, log=testenv_log, wait=ENGINE_WAIT) as (engine, image):
        testenv_log(f"image {image.describe()}; layers, newest first:\n{pykcm_image.layer_table(image)}")
        yield engine, image


def run_in_image(engine: DockerEngine, image: pykcm_image.Image, code: str) -> str:
    return engine.docker("run", "--rm", *HARDENED, "--entrypoint=python3", image.name, "-c", code).stdout


def test_no_layer_holds_wheels_pip_or_build_tools(built):
    engine, image = built
    for layer in image.layers:
        assert "wheel" not in layer.created_by and "pip " not in layer.created_by, layer
    added = [layer for layer in image.layers if layer.size and "/opt/pykcm" in layer.created_by]
    assert len(added) == 1, pykcm_image.layer_table(image)  # the virtual environment, nothing else
    found = json.loads(run_in_image(engine, image, (
        "import glob, json, shutil; print(json.dumps({"
        "'wheels': glob.glob('/wheels') + glob.glob('/opt/**/*.whl', recursive=True), "
        "'pip': glob.glob('/opt/pykcm/lib/python3*/site-packages/pip'), "
        "'tools': [t for t in ('pip', 'pip3', 'gcc', 'cc', 'strip') if shutil.which(t)]}))"
    )))
    assert found == {"wheels": [], "pip": [], "tools": []}


def test_the_build_hosts_ca_bundle_stays_out_of_the_image(built):
    engine, image = built
    code = (
        "import hashlib, pathlib; p = pathlib.Path('/etc/ssl/certs/ca-certificates.crt'); "
        "print(hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else 'absent')"
    )
    in_image = run_in_image(engine, image, code).strip()
    assert in_image != hashlib.sha256(HOST_CA_BUNDLE.read_bytes()).hexdigest()
    env = json.loads(engine.docker("image", "inspect", "--format", "{{json .Config.Env}}", image.name).stdout)
    assert not [e for e in env if e.startswith(("PIP_CERT=", "SSL_CERT_FILE="))], env


def test_image_size_is_reported(built, testenv_log):
    _, image = built
    venv = sum(layer.size for layer in image.layers if "/opt/pykcm" in layer.created_by)
    testenv_log(f"pykcm image: {image.size / 1e6:.1f} MB ({venv / 1e6:.1f} MB of it pykcm's environment)")
    assert venv < 120e6  # the environment was 110 MB with all bytecode, 87 MB without kubernetes' models'


async def test_image_runs_hardened_and_works_against_the_control_plane(built, control_plane, tmp_path, testenv_log):
    engine, image = built
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(control_plane.kubeconfig.read_bytes())
    os.chown(kubeconfig, 65532, 65532)  # readable by the container's user only
    kubeconfig.chmod(0o600)
    port = free_port()
    name = f"pykcm-image-test-{os.getpid()}"
    engine.docker(
        "run", "--detach", f"--name={name}", *HARDENED, f"--volume={kubeconfig}:/etc/pykcm/kubeconfig:ro",
        image.name, "run", "--kubeconfig=/etc/pykcm/kubeconfig", "--controllers=serviceaccount",
        f"--secure-port={port}", "--bind-address=127.0.0.1", "--no-leader-elect",
    )
    try:
        async def synced() -> bool:
            return "Caches are synced" in logs(engine, name)

        await wait_for(synced, timeout=60, interval=0.5, message="pykcm in its container to sync its caches")
        assert await https_get(f"https://127.0.0.1:{port}/readyz") == (200, "ok")
        await default_sa_appears(control_plane.kubeconfig)
        memory = engine.docker("stats", "--no-stream", "--format={{.MemUsage}}", name).stdout.strip()
        testenv_log(f"pykcm in its container: ready, memory {memory}")
        assert "Traceback" not in logs(engine, name)
    finally:
        engine.docker("rm", "--force", name, check=False)


def test_saved_tarball_imports_into_a_containerd(built, tmp_path, testenv_log):
    """The tarball is what a node's containerd imports: tried on the engine's own containerd, in a
    namespace of the test's (removed afterwards), with its layers unpacked."""
    engine, image = built
    target = pykcm_image.save(engine, image.name, tmp_path / "pykcm.tar", log=testenv_log)
    with tarfile.open(target) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
    assert manifest[0]["RepoTags"] == ["pykcm:dev"]

    def ctr(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", f"--address={engine.containerd_address}", "--namespace=pykcm-import-test",
                               *args], capture_output=True, text=True, timeout=300, check=False)

    try:
        imported = ctr("images", "import", str(target))
        assert imported.returncode == 0, imported.stderr
        assert ctr("images", "list", "--quiet").stdout.split() == [image.name]  # docker.io/library/pykcm:dev
    finally:
        ctr("images", "remove", "--sync", image.name)
        ctr("namespaces", "remove", "pykcm-import-test")


def logs(engine: DockerEngine, name: str) -> str:
    result = engine.docker("logs", name, check=False)
    return result.stdout + result.stderr


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pykcm.app.cli", "testenv", "image", *args],
                          capture_output=True, text=True, timeout=120, env=checkout_env())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkout", "/nonexistent"], "/nonexistent has no Dockerfile and pyproject.toml"),
        ([], "another private Docker engine is running in"),  # the module's engine holds the default directory
    ],
)
def test_cli_refusals_are_one_line(built, args, message):
    result = cli("--checkout", str(CHECKOUT), *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("pykcm: error:"), result.stderr
    assert message in lines[0]


def test_missing_prerequisites_are_one_line_each(monkeypatch):
    monkeypatch.setenv("PATH", str(Path("/nonexistent")))
    missing = pykcm_image.missing_prerequisites()
    assert any("apt-get install docker.io" in line for line in missing)
    assert any("apt-get install debootstrap" in line for line in missing)
    assert all("\n" not in line for line in missing)
