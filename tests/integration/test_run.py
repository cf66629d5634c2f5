"""`pykcm run` as users run it: a real process against the real apiserver, stopped by signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pykcm.client.errors import NotFound
from pykcm.client.resources import DEPLOYMENTS, NAMESPACES, SERVICEACCOUNTS
from tests.support import PykcmProcess, admin_client, create_namespace, free_port, https_get, wait_for

pytestmark = pytest.mark.integration


async def default_sa_appears(kubeconfig: Path | str) -> None:
    client = admin_client(kubeconfig)
    try:
        ns = await create_namespace(client, "run", service_account=False)

        async def present() -> bool:
            try:
                return bool(await client.get(SERVICEACCOUNTS, "default", namespace=ns))
            except NotFound:
                return False

        await wait_for(present, timeout=30, message=f"ServiceAccount {ns}/default")
        await client.delete(NAMESPACES, ns)
    finally:
        await client.close()


async def test_run_syncs_caches_works_and_stops_cleanly_on_sigterm(control_plane, tmp_path):
    port = free_port()
    proc = PykcmProcess(
        "--kubeconfig", str(control_plane.kubeconfig), "--controllers", "serviceaccount", "--v", "2",
        "--secure-port", str(port), "--bind-address", "127.0.0.1", "--leader-elect-retry-period=2s",
        log_path=tmp_path / "pykcm.log",
    )
    try:
        await proc.wait_for_log("Caches are synced")
        await default_sa_appears(control_plane.kubeconfig)
        await zpages_are_served(f"https://127.0.0.1:{port}", control_plane)
        proc.signal(signal.SIGTERM)
        assert await proc.wait(30) == 0, proc.log()[-2000:]
        assert '"Stopped"' in proc.log()
        assert "Traceback" not in proc.log()
    finally:
        proc.kill()


async def zpages_are_served(url: str, control_plane) -> None:
    """KCM 1.36's /statusz and /flagz (beta, on by default): text, and the structured kinds; /configz."""
    cert = (control_plane.pki.admin_cert, control_plane.pki.admin_key)
    status, text = await https_get(f"{url}/statusz", cert=cert)
    assert status == 200 and "\npykcm statusz\n" in text and "Binary version" in text, text
    status, body = await https_get(f"{url}/statusz", cert=cert, accept=STRUCTURED.format("Statusz"))
    statusz = json.loads(body)
    assert statusz["paths"] == ["/configz", "/flagz", "/healthz", "/livez", "/metrics", "/readyz"]
    assert statusz["kind"] == "Statusz"
    status, body = await https_get(f"{url}/flagz", cert=cert, accept=STRUCTURED.format("Flagz"))
    flags = json.loads(body)["flags"]
    assert (flags["controllers"], flags["v"], flags["kube-api-qps"]) == ("[serviceaccount]", "2", "20")
    assert (flags["leader-elect-retry-period"], flags["leader-elect"], flags["tls-cert-file"]) == ("2s", "false", "")
    assert (await https_get(f"{url}/flagz"))[0] == 403  # anonymous: authorized as /metrics is
    status, body = await https_get(f"{url}/configz", cert=cert)
    config = json.loads(body)["kubecontrollermanager.config.k8s.io"]
    generic = config["Generic"]
    assert (generic["Controllers"], generic["ClientConnection"]["kubeconfig"]) == (
        ["serviceaccount-controller"], str(control_plane.kubeconfig))  # the alias made canonical, as KCM does
    assert (generic["LeaderElection"]["leaderElect"], generic["LeaderElection"]["retryPeriod"]) == (False, "2s")
    assert (await https_get(f"{url}/configz"))[0] == 403


STRUCTURED = "application/json;as={};v=v1beta1;g=config.k8s.io"


async def test_sigquit_dumps_every_thread_and_task_and_exits_2_as_kcm_does(control_plane, tmp_path):
    proc = PykcmProcess(
        "--kubeconfig", str(control_plane.kubeconfig), "--controllers", "serviceaccount",
        log_path=tmp_path / "pykcm.log",
    )
    try:
        await proc.wait_for_log("Caches are synced")
        proc.signal(signal.SIGQUIT)
        assert await proc.wait(30) == 2, proc.log()[-2000:]
    finally:
        proc.kill()
    dump = proc.log().split("SIGQUIT: quit\n", 1)[1]
    for part in ("thread MainThread:", "thread event-loop-watch:", "task 'controller serviceaccount-controller':",
                 "task 'serviceaccount-controller worker 0':"):
        assert f"\n{part}\n" in dump, dump
    worker = dump.split("\ntask 'serviceaccount-controller worker 0':\n", 1)[1].split("\n\n", 1)[0]
    # Down the chain of awaits: from the worker loop to where it waits (the queue, or a request).
    assert "in _worker\n" in worker and worker.count("  File ") >= 2, worker
    assert "Traceback" not in proc.log()


async def test_run_local_starts_its_own_control_plane_serves_and_stops(tmp_path):
    port = free_port()
    proc = PykcmProcess(
        "--local", "--controllers", "serviceaccount", "--secure-port", str(port), log_path=tmp_path / "local.log"
    )
    try:
        await proc.wait_for_log("Caches are synced", timeout=180)
        assert await https_get(f"https://127.0.0.1:{port}/healthz") == (200, "ok")
        assert _listening_addresses(port) == {"127.0.0.1"}  # --local serves on loopback only
        kubeconfig = Path(re.search(r"kubeconfig: (\S+)", proc.log()).group(1))
        state = json.loads((kubeconfig.parent / "testenv.json").read_text())
        pids = [p["pid"] for p in state["processes"].values()]
        assert pids and all(_alive(pid) for pid in pids)
        await default_sa_appears(kubeconfig)
        proc.signal(signal.SIGINT)
        assert await proc.wait(60) == 0, proc.log()[-2000:]
        assert not any(_alive(pid) for pid in pids), "the local control plane outlived pykcm"
        assert not kubeconfig.parent.exists()
    finally:
        proc.kill()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["run", "--kubeconfig", "/does/not/exist"], 1, "does not exist"),
        (["run", "--master", "https://127.0.0.1:1", "--controllers", "serviceaccount"], 1, "apiserver"),
        (["run", "--controllers", "nope"], 2, "not in the list of known controllers"),
        (["run", "--kube-api-qps", "fast"], 2, "--kube-api-qps"),
        (["run", "--min-resync-period", "12 hours"], 2, "invalid duration"),
    ],
)
def test_bad_input_is_one_line_and_exit_code(args, code, message, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    result = subprocess.run(
        [sys.executable, "-m", "pykcm.app.cli", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pykcm: error:"), result.stderr
    assert message in lines[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _listening_addresses(port: int) -> set[str]:
    """IPv4 addresses with a listening TCP socket on `port`, from /proc/net/tcp."""
    addresses = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        host, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A = LISTEN
            addresses.add(".".join(str(b) for b in reversed(bytes.fromhex(host))))
    return addresses


async def test_run_local_is_a_cluster_with_nodes_and_stops_when_one_of_its_processes_dies(tmp_path):
    """`pykcm run --local` as the README shows it: a Deployment gets Running, Ready pods; when the
    scheduler dies pykcm says which process and stops the whole cluster instead of hanging."""
    proc = PykcmProcess("--local", "--local-nodes", "2", log_path=tmp_path / "local.log")
    try:
        await proc.wait_for_log("Caches are synced", timeout=900)  # a cold machine builds first
        assert "Try this:" in proc.log() and "create deployment web" in proc.log()
        kubeconfig = Path(re.search(r"kubeconfig: (\S+)", proc.log()).group(1))
        state = json.loads((kubeconfig.parent / "testenv.json").read_text())
        processes = state["processes"]
        assert {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"} <= set(processes)
        client = admin_client(kubeconfig)
        try:
            ns = await create_namespace(client, "local")
            body = {
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                "spec": {
                    "replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                                 "spec": {"containers": [{"name": "web", "image": "nginx"}]}},
                },
            }
            await client.create(DEPLOYMENTS, body, namespace=ns)

            async def available() -> bool:
                status = (await client.get(DEPLOYMENTS, "web", namespace=ns)).get("status", {})
                return status.get("availableReplicas") == 3

            await wait_for(available, timeout=120, message="3 available replicas")
        finally:
            await client.close()
        os.kill(processes["kube-scheduler"]["pid"], signal.SIGKILL)
        assert await proc.wait(60) == 1, proc.log()[-2000:]
        assert "pykcm: error: the local cluster lost kube-scheduler" in proc.log()
        assert not any(_alive(p["pid"]) for p in processes.values()), "the local cluster outlived pykcm"
    finally:
        proc.kill()
