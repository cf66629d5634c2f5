"""A third-party controller package adds itself to pykcm by being installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pykcm.client.resources import CONFIGMAPS
from tests.support import PykcmProcess, admin_client, create_namespace, wait_for

PLUGIN = Path(__file__).resolve().parents[1] / "plugin_example"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("plugin-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(PLUGIN)],
        check=True, timeout=300,
    )
    return target


def pykcm_env(plugin_path: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(plugin_path), os.environ.get("PYTHONPATH")]))}


def test_installed_plugin_is_listed_off_by_default(plugin_path):
    out = subprocess.run(
        [sys.executable, "-m", "pykcm.app.cli", "controllers"],
        capture_output=True, text=True, check=True, env={**os.environ, **pykcm_env(plugin_path)},
    ).stdout
    assert "greeter-controller\toff (aliases: greeter)" in out


async def test_installed_plugin_runs_when_enabled(control_plane, plugin_path, tmp_path):
    client = admin_client(control_plane.kubeconfig)
    ns = await create_namespace(client, "plugin")
    proc = PykcmProcess(
        "--kubeconfig", str(control_plane.kubeconfig), "--controllers", "greeter", "--leader-elect=false",
        log_path=tmp_path / "pykcm.log", env=pykcm_env(plugin_path),
    )
    try:
        await proc.wait_for_log("Caches are synced")
        labels = {"example.pykcm.io/greet": "true"}
        await client.create(CONFIGMAPS, {"metadata": {"name": "hi", "labels": labels}}, namespace=ns)

        async def greeted() -> bool:
            cm = await client.get(CONFIGMAPS, "hi", namespace=ns)
            return (cm.get("data") or {}).get("greeting") == "hello, hi"

        await wait_for(greeted, timeout=30, message="greeting written by the plugin")
    finally:
        proc.kill()
        await client.close()
