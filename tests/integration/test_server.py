"""The secure port against the real apiserver: health endpoints, delegated authn/authz, TLS, start-up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from cryptography import x509

from pykcm.app.manager import Manager
from pykcm.app.options import Options
from pykcm.client.config import load_config
from pykcm.client.errors import NotFound
from pykcm.client.resources import CLUSTERROLEBINDINGS, CLUSTERROLES, NAMESPACES, SERVICEACCOUNTS
from pykcm.client.rest import RestClient
from pykcm.controller import Controller, ControllerContext, progress
from pykcm.serving.certs import self_signed_certificate
from pykcm.testenv.controlplane import ControlPlane
from tests.support import (
    STARTING_LINE,
    create_namespace,
    free_port,
    https_get,
    running_manager,
    sample,
    stderr_after_start,
    wait_for,
)

pytestmark = pytest.mark.integration


def admin_cert(plane: ControlPlane) -> tuple[Path, Path]:
    """The admin client certificate: group system:masters, so always authorized."""
    return plane.pki.admin_cert, plane.pki.admin_key


@contextlib.asynccontextmanager
async def serving(plane: ControlPlane, controllers: str = "serviceaccount", **options: Any) -> AsyncIterator[str]:
    """pykcm in this process, leading its own Lease and serving on a free port; yields the base URL."""
    port = free_port()
    options = {
        "leader_elect": True,
        "leader_elect_resource_name": f"pykcm-{uuid.uuid4().hex[:8]}",
        "secure_port": port,
        "bind_address": "127.0.0.1",
        **options,
    }
    async with running_manager(plane.kubeconfig, controllers, **options):
        yield f"https://127.0.0.1:{port}"


async def test_scenario_48_anonymous_health_is_allowed_and_metrics_forbidden(control_plane: ControlPlane) -> None:
    async with serving(control_plane) as url:
        assert await https_get(f"{url}/healthz") == (200, "ok")
        assert await https_get(f"{url}/healthz?verbose") == (
            200,
            "[+]leaderElection ok\n[+]serviceaccount-controller ok\nhealthz check passed\n",
        )
        for endpoint in ("livez", "readyz"):
            status, body = await https_get(f"{url}/{endpoint}?verbose")
            assert status == 200 and body.endswith(f"{endpoint} check passed\n")
        status, body = await https_get(f"{url}/healthz?verbose&exclude=leaderElection")
        assert status == 200 and "[+]leaderElection excluded: ok\n" in body

        status, body = await https_get(f"{url}/metrics")
        assert status == 403
        assert orjson.loads(body)["message"] == 'forbidden: User "system:anonymous" cannot get path "/metrics"'
        # Always-allowed paths match exactly, as in KCM: a single check's path needs authorization.
        assert (await https_get(f"{url}/healthz/leaderElection"))[0] == 403

        assert await https_get(f"{url}/healthz/leaderElection", cert=admin_cert(control_plane)) == (200, "ok")
        status, body = await https_get(f"{url}/metrics", cert=admin_cert(control_plane))
        assert status == 200 and "leader_election_master_status" in body


async def _service_account_token(client: RestClient, namespace: str, name: str) -> str:
    body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
    await client.create(SERVICEACCOUNTS, body, namespace=namespace)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    review = await client.request("POST", SERVICEACCOUNTS.path(namespace, name, "token"), body=request)
    return review["status"]["token"]


async def _grant_metrics(client: RestClient, name: str, namespace: str, service_account: str) -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
    await client.create(CLUSTERROLES, role)
    await client.create(CLUSTERROLEBINDINGS, binding)


async def test_metrics_need_a_valid_token_and_rbac(control_plane: ControlPlane, client: RestClient) -> None:
    namespace = await create_namespace(client, "metrics-auth")
    role = f"pykcm-test-metrics-{uuid.uuid4().hex[:6]}"
    token = await _service_account_token(client, namespace, "scraper")
    try:
        async with serving(control_plane) as url:
            status, body = await https_get(f"{url}/metrics", token="not-a-token")
            assert status == 401 and orjson.loads(body)["reason"] == "Unauthorized"

            status, body = await https_get(f"{url}/metrics", token=token)
            assert status == 403
            message = orjson.loads(body)["message"]
            assert message == f'forbidden: User "system:serviceaccount:{namespace}:scraper" cannot get path "/metrics"'

            assert (await https_get(f"{url}/healthz", token=token))[0] == 200

            await _grant_metrics(client, role, namespace, "scraper")

            async def scraped() -> bool:
                status, body = await https_get(f"{url}/metrics", token=token)
                return status == 200 and "workqueue_adds_total" in body

            # The denial is cached for 10 s, as KCM caches SubjectAccessReview answers.
            await wait_for(scraped, timeout=25, interval=1.0, message="/metrics with an authorized token")
    finally:
        for res in (CLUSTERROLEBINDINGS, CLUSTERROLES):
            with contextlib.suppress(NotFound):
                await client.delete(res, role)
        await client.delete(NAMESPACES, namespace)


def _verbose_check_names(body: str) -> list[str]:
    return [line[3:].split(" ")[0] for line in body.splitlines() if line.startswith("[+]")]


@pytest.mark.parametrize(
    ("controllers", "present", "absent"),
    [
        ("*,-replicaset-controller", ["namespace-controller", "serviceaccount-controller"], ["replicaset-controller"]),
        ("*,-replicaset", ["namespace-controller", "serviceaccount-controller"], ["replicaset-controller"]),
        ("-namespace,namespace,serviceaccount", ["serviceaccount-controller"], ["namespace-controller"]),
    ],
)
async def test_scenario_49_disabled_controllers_have_no_health_check(
    control_plane: ControlPlane, controllers: str, present: list[str], absent: list[str]
) -> None:
    async with serving(control_plane, controllers) as url:
        status, body = await https_get(f"{url}/healthz?verbose")
    assert status == 200
    names = _verbose_check_names(body)
    assert names[0] == "leaderElection"
    assert set(present) <= set(names)
    assert not set(absent) & set(names)


class BlockingController(Controller):
    """Syncs of the namespaces named in `blocks` hang until released: a wedged controller."""

    name = "blocking-test-controller"
    queue_name = "blocking_test"
    release: ClassVar[asyncio.Event]
    blocks: ClassVar[set[str]] = set()

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx)
        self.namespaces = self.informers.informer(NAMESPACES)
        self.namespaces.add_event_handler(on_add=self.enqueue, on_update=lambda _o, new: self.enqueue(new))

    async def sync(self, key: str) -> None:
        if key in self.blocks:  # a test's own namespace: another test's may be left terminating
            await self.release.wait()


async def test_a_stuck_controller_is_unready_and_reported_but_stays_live(
    control_plane: ControlPlane, client: RestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wedged controller fails /readyz and raises pykcm_controller_stuck; /livez and /healthz,
    what a liveness probe restarts on, stay green as KCM's (leader election and pings)."""
    monkeypatch.setattr(progress, "STUCK_SYNC_AFTER", 1.0)
    BlockingController.release = asyncio.Event()
    port = free_port()
    options = Options(kubeconfig=str(control_plane.kubeconfig), leader_elect=False, secure_port=port,
                      bind_address="127.0.0.1")
    manager = Manager(options, load_config(str(control_plane.kubeconfig)), [BlockingController])
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    url = f"https://127.0.0.1:{port}"
    name = f"blocked-{uuid.uuid4().hex[:6]}"
    BlockingController.blocks = {name}
    labels = {"controller": BlockingController.name}
    try:
        await asyncio.wait_for(manager.synced.wait(), 30)
        assert await https_get(f"{url}/readyz") == (200, "ok")
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        await client.create(NAMESPACES, body)

        async def unready() -> tuple[int, str] | None:
            result = await https_get(f"{url}/readyz")
            return result if result[0] == 500 else None

        status, text = await wait_for(unready, timeout=15, interval=0.3, message="readyz failing")
        assert text == "[-]blocking-test-controller failed: reason withheld\nreadyz check failed\n"
        assert await https_get(f"{url}/livez") == (200, "ok")
        assert await https_get(f"{url}/healthz") == (200, "ok")
        # Only an authorized caller sees why.
        status, text = await https_get(f"{url}/readyz/blocking-test-controller", cert=admin_cert(control_plane))
        assert status == 500 and "a sync has been running for" in text
        status, text = await https_get(f"{url}/metrics", cert=admin_cert(control_plane))
        assert sample(text, "pykcm_controller_stuck", labels) == 1

        BlockingController.release.set()

        async def ready() -> bool:
            return (await https_get(f"{url}/readyz"))[0] == 200

        await wait_for(ready, timeout=10, interval=0.3, message="readyz recovering")
        status, text = await https_get(f"{url}/metrics", cert=admin_cert(control_plane))
        assert sample(text, "pykcm_controller_stuck", labels) == 0
    finally:
        BlockingController.release.set()
        stop.set()
        await asyncio.wait_for(task, 60)
        with contextlib.suppress(NotFound):
            await client.delete(NAMESPACES, name)


@pytest.mark.parametrize(
    ("drain", "message", "after"),
    [(0.5, "Shutdown cut syncs short", {"after": "0.5s"}), (0.0, "Stopped without a drain, syncs cut short", {})],
)
async def test_a_sync_still_running_when_the_drain_times_out_is_named(
    control_plane: ControlPlane, client: RestClient, caplog: pytest.LogCaptureFixture,
    drain: float, message: str, after: dict[str, str],
) -> None:
    """On stop, a sync that outlasts the drain is cancelled and its key logged: the next leader redoes it."""
    BlockingController.release = asyncio.Event()
    options = Options(kubeconfig=str(control_plane.kubeconfig), leader_elect=False, secure_port=free_port(),
                      bind_address="127.0.0.1", controller_shutdown_timeout=drain)
    manager = Manager(options, load_config(str(control_plane.kubeconfig)), [BlockingController])
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    name = f"cut-{uuid.uuid4().hex[:6]}"
    BlockingController.blocks = {name}
    try:
        await asyncio.wait_for(manager.synced.wait(), 30)
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        await client.create(NAMESPACES, body)
        queue = manager.controllers[0].queue

        async def blocked() -> bool:
            return name in queue.in_flight()

        await wait_for(blocked, timeout=15, interval=0.1, message="the sync blocked")
        with caplog.at_level(logging.INFO, logger="pykcm"):
            stop.set()
            await asyncio.wait_for(task, 30)
    finally:
        BlockingController.release.set()
        stop.set()
        with contextlib.suppress(NotFound):
            await client.delete(NAMESPACES, name)
    cut = [r for r in caplog.records if r.getMessage() == message]
    assert len(cut) == 1 and cut[0].kv == {"controller": BlockingController.name, "keys": [name], **after}


async def test_serves_the_given_certificate(control_plane: ControlPlane, tmp_path: Path) -> None:
    cert_pem, key_pem = self_signed_certificate("127.0.0.1")
    (tmp_path / "tls.crt").write_bytes(cert_pem)
    (tmp_path / "tls.key").write_bytes(key_pem)
    options = {"tls_cert_file": str(tmp_path / "tls.crt"), "tls_private_key_file": str(tmp_path / "tls.key")}
    async with serving(control_plane, **options) as url:
        port = int(url.rsplit(":", 1)[1])
        served = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
    assert x509.load_pem_x509_certificate(served.encode()) == x509.load_pem_x509_certificate(cert_pem)


async def test_scenario_50_unreachable_apiserver_exits_within_15s_with_one_line() -> None:
    start = time.monotonic()
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "pykcm.app.cli", "run", "--master", f"https://127.0.0.1:{free_port()}",
         "--controllers", "serviceaccount", "--leader-elect=true"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "KUBECONFIG": "/dev/null"},
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 1, result.stderr
    assert 9 < elapsed < 20, elapsed  # KCM's 10 s wait; the rest is Python's start on a busy machine
    assert STARTING_LINE.match(result.stderr.splitlines()[0]), result.stderr  # KCM's first line, as KCM
    lines = stderr_after_start(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pykcm: error: failed to wait for apiserver being healthy")
