"""A real Prometheus scrapes two pykcm processes as deploy/prometheus's ServiceMonitor describes:
HTTPS, /metrics, the bearer token of the ServiceAccount that deploy/prometheus's RBAC lets read
/metrics (pykcm checks it with TokenReview and SubjectAccessReview). The scrape configuration is
derived from the rendered ServiceMonitor and Service, so the two cannot drift.

Prometheus runs on 127.0.0.1 from Debian's `prometheus` package (.ci/run installs it). The pykcm
processes run on the host, not in pods, so the targets are static; everything else is the
ServiceMonitor's.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from pykcm.client.resources import REPLICASETS
from pykcm.testenv.build import ensure_binaries
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.processes import LOOPBACK, spawn
from tests.deploy_credentials import DEPLOY, render_deploy
from tests.support import PykcmProcess, admin_client, create_namespace, free_port, replicaset_manifest, wait_for

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus is not installed (Debian package prometheus; .ci/run installs it)",
)
SCRAPE_INTERVAL = "1s"  # the ServiceMonitor's 30s, shortened so the test takes seconds


def scrape_config(objects: list[dict], targets: list[str], token_file: Path) -> dict[str, Any]:
    """Prometheus's scrape job for the ServiceMonitor in `objects`, as prometheus-operator writes
    it: the job is named after the selected Service, the endpoint gives scheme, path, TLS and the
    bearer token (a file Prometheus reads on every scrape)."""
    [monitor] = [o for o in objects if o["kind"] == "ServiceMonitor"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    [service] = [
        o for o in objects
        if o["kind"] == "Service" and selector.items() <= o["metadata"].get("labels", {}).items()
    ]
    [endpoint] = monitor["spec"]["endpoints"]
    assert any(port["name"] == endpoint["port"] for port in service["spec"]["ports"])
    return {
        "job_name": service["metadata"]["name"],
        "scheme": endpoint["scheme"],
        "metrics_path": endpoint["path"],
        "scrape_interval": SCRAPE_INTERVAL,
        "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
        "tls_config": {"insecure_skip_verify": endpoint["tlsConfig"]["insecureSkipVerify"]},
        "static_configs": [{"targets": targets}],
    }


def metrics_reader_token(plane: ControlPlane, kubectl: Path, objects: list[dict], path: Path) -> Path:
    """Apply deploy/prometheus's RBAC and mint a token for the ServiceAccount it binds."""
    rbac = [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding") and "metrics-reader" in
            o["metadata"]["name"]]
    [binding] = [o for o in rbac if o["kind"] == "ClusterRoleBinding"]
    [subject] = binding["subjects"]
    admin = [str(kubectl), "--kubeconfig", str(plane.kubeconfig)]
    namespace, name = subject["namespace"], subject["name"]
    subprocess.run([*admin, "create", "namespace", namespace], capture_output=True, check=False)
    subprocess.run([*admin, "-n", namespace, "create", "serviceaccount", name], capture_output=True, check=False)
    subprocess.run([*admin, "apply", "-f", "-"], input=yaml.safe_dump_all(rbac), text=True, check=True,
                   capture_output=True)
    token = subprocess.run([*admin, "-n", namespace, "create", "token", name, "--duration=1h"],
                           capture_output=True, text=True, check=True).stdout.strip()
    path.write_text(token)
    return path


async def query(session: aiohttp.ClientSession, url: str, promql: str) -> list[dict]:
    async with session.get(f"{url}/api/v1/query", params={"query": promql}) as response:
        body = await response.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


async def test_prometheus_scrapes_pykcm_as_the_service_monitor_says(control_plane: ControlPlane, tmp_path: Path):
    kubectl = ensure_binaries(need_kubectl=True, log=lambda _: None).kubectl
    assert kubectl is not None
    objects = render_deploy(kubectl, DEPLOY, ("prometheus",))
    token_file = metrics_reader_token(control_plane, kubectl, objects, tmp_path / "token")
    lease = f"pykcm-prom-{uuid.uuid4().hex[:6]}"
    ports = [free_port(), free_port()]
    replicas = [
        PykcmProcess("--kubeconfig", str(control_plane.kubeconfig), "--controllers", "replicaset",
                     "--leader-elect=true", f"--leader-elect-resource-name={lease}", "--bind-address", LOOPBACK,
                     "--secure-port", str(port), log_path=tmp_path / f"pykcm-{port}.log")
        for port in ports
    ]
    config = {"global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
              "scrape_configs": [scrape_config(objects, [f"{LOOPBACK}:{p}" for p in ports], token_file)]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    web = free_port()
    prometheus = spawn("prometheus", [
        "prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address={LOOPBACK}:{web}",
    ], tmp_path / "logs")
    url = f"http://{LOOPBACK}:{web}"
    client = admin_client(control_plane.kubeconfig)
    try:
        async with aiohttp.ClientSession() as session:
            async def ready() -> bool:
                try:
                    async with session.get(f"{url}/-/ready") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            await wait_for(ready, timeout=60, interval=0.2, message=f"prometheus ready (log: {prometheus.log_path})")

            async def both_up() -> bool:
                up = await query(session, url, 'up{job="pykcm-metrics"}')
                return len(up) == 2 and all(s["value"][1] == "1" for s in up)

            await wait_for(both_up, timeout=60, interval=0.5, message="both pykcm targets up")

            async def one_leader() -> bool:
                status = await query(session, url, f'leader_election_master_status{{name="{lease}"}}')
                return len(status) == 2 and sorted(s["value"][1] for s in status) == ["0", "1"]

            await wait_for(one_leader, timeout=60, interval=0.5, message="exactly one replica leading")

            adds = 'sum(workqueue_adds_total{job="pykcm-metrics", name="replicaset"})'
            before = float((await query(session, url, adds))[0]["value"][1])
            namespace = await create_namespace(client, "prom")
            await client.create(REPLICASETS, replicaset_manifest("scraped", 1), namespace=namespace)

            async def adds_rose() -> bool:
                return float((await query(session, url, adds))[0]["value"][1]) > before

            await wait_for(adds_rose, timeout=60, interval=0.5, message="workqueue_adds_total rising")
    finally:
        await client.close()
        prometheus.stop(timeout=10)
        for replica in replicas:
            replica.kill()
