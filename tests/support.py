"""Test utilities shared by every integration test: clients, polling, running pykcm."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from pykcm.app.manager import Manager
from pykcm.app.options import Options, resolve_controllers
from pykcm.client.config import load_config
from pykcm.client.discovery import server_preferred_resources
from pykcm.client.errors import AlreadyExists, NotFound
from pykcm.client.resources import CUSTOMRESOURCEDEFINITIONS, NAMESPACES, SERVICEACCOUNTS, Resource
from pykcm.client.rest import RestClient
from pykcm.controller import Controller, RequeueAfter, discover_controllers
from pykcm.testenv import interrupts

T = TypeVar("T")

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: no kubelet runs in the test control plane

CHECKOUT = Path(__file__).resolve().parents[1]  # the source tree these tests belong to

CONTROLLER_KUBECONFIG_ENV = "PYKCM_TEST_CONTROLLER_KUBECONFIG"
SA_CREDENTIALS_ENV = "PYKCM_TEST_USE_SA_CREDENTIALS"


def checkout_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child `python -m pykcm...`: this checkout on PYTHONPATH ahead of the
    inherited one, so the child runs the code under test (whatever the working directory), not an
    installed copy. A PYTHONPATH the caller gives (a plugin, an earlier checkout to measure) comes
    before this checkout."""
    own = (env or {}).get("PYTHONPATH")
    merged = {**os.environ, **(env or {})}
    inherited = None if own else os.environ.get("PYTHONPATH")
    merged["PYTHONPATH"] = os.pathsep.join(filter(None, [own, str(CHECKOUT), inherited]))
    return merged


def admin_client(kubeconfig: Path | str, qps: float = 1000, burst: int = 1000) -> RestClient:
    """An admin client for test set-up; fast limits so the test, not the client, is measured."""
    return RestClient(load_config(str(kubeconfig)).with_limits(qps, burst), "e2e-test")


async def wait_for(
    check: Callable[[], Awaitable[T]], timeout: float = 30.0, interval: float = 0.1, message: str = ""
) -> T:
    """Poll `check` until it returns something truthy; fail the test with the last value otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = await check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or check}: last={last!r}")
        await asyncio.sleep(interval)


def replicaset_manifest(name: str, replicas: int, labels: dict[str, str] | None = None, **spec: Any) -> dict:
    """An apps/v1 ReplicaSet selecting `labels` (default app=<name>). Extra keys: `metadata`,
    `template_metadata`, `selector`, and anything else goes into `spec` (e.g. minReadySeconds)."""
    labels = labels or {"app": name}
    template = spec.pop("template_metadata", {})
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, **spec.pop("metadata", {})},
        "spec": {
            "replicas": replicas,
            "selector": spec.pop("selector", {"matchLabels": labels}),
            "template": {
                "metadata": {"labels": labels, **template},
                "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE}], "terminationGracePeriodSeconds": 30},
            },
            **spec,
        },
    }


async def create_namespace(client: RestClient, prefix: str = "t", service_account: bool = True) -> str:
    """A fresh namespace; with `service_account`, its `default` SA too (the ServiceAccount
    admission plugin rejects pods until it exists, and not every test runs that controller)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    await client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    if service_account:
        with contextlib.suppress(AlreadyExists):
            body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
            await client.create(SERVICEACCOUNTS, body, namespace=name)
    return name


@contextlib.asynccontextmanager
async def running_manager(kubeconfig: Path | str, controllers: str = "*", **options: Any) -> AsyncIterator[Manager]:
    """Run pykcm's manager in this event loop until the block ends; yields once caches are synced."""
    # Tests run side by side: no Lease and no HTTPS port unless a test asks for them.
    options = {"leader_elect": False, "secure_port": 0, **options}
    # Under PYKCM_TEST_CREDENTIALS (see conftest.py) pykcm runs with deploy/'s ServiceAccount and
    # RBAC instead of the admin credential the test itself uses, proving that RBAC is enough.
    # The mode then also decides --use-service-account-credentials, whatever the test asked for.
    if os.environ.get(CONTROLLER_KUBECONFIG_ENV):
        kubeconfig = os.environ[CONTROLLER_KUBECONFIG_ENV]
        options["use_service_account_credentials"] = bool(os.environ.get(SA_CREDENTIALS_ENV))
    opts = Options(kubeconfig=str(kubeconfig), controllers=controllers.split(","), **options)
    registry = discover_controllers()
    enabled = resolve_controllers(opts.controllers, registry.values())
    manager = Manager(opts, load_config(str(kubeconfig)), [registry[n] for n in enabled])
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    synced = asyncio.create_task(manager.synced.wait())
    await asyncio.wait({task, synced}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # surface the start-up error
    assert manager.synced.is_set(), "pykcm did not sync its caches within 60s"
    try:
        yield manager
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


class PykcmProcess:
    """`pykcm run` as a real child process, for signal, exit-code and multi-process tests.

    Leader election and serving are off unless `args` turn them on (later flags win), so
    processes of different tests never contend for one Lease or port.
    """

    ISOLATION_ARGS = ("--leader-elect=false", "--secure-port=0")

    def __init__(self, *args: str, log_path: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        out = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed in wait() and kill()
        self._out = out
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pykcm.app.cli", "run", *self.ISOLATION_ARGS, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=checkout_env(env),
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    async def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        async def seen() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"pykcm exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            return text in self.log()

        await wait_for(seen, timeout, 0.2, f"{text!r} in pykcm's log")

    def signal(self, signum: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    async def wait(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"pykcm did not exit within {timeout}s:\n{self.log()[-3000:]}")
        if hasattr(self._out, "close"):
            self._out.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if hasattr(self._out, "close"):
            self._out.close()


def is_ready(obj: dict[str, Any]) -> bool:
    """A pod's (or node's) Ready condition is True."""
    return any(c["type"] == "Ready" and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


async def is_gone(client: RestClient, res: Resource, name: str, namespace: str | None = None) -> bool:
    """True once GET answers 404 (for use with wait_for)."""
    try:
        await client.get(res, name, namespace)
    except NotFound:
        return True
    return False


async def ensure_crd(client: RestClient, group: str, kind: str, plural: str, version: str = "v1") -> Resource:
    """Install a namespaced CRD whose objects accept any fields (if it is not installed yet) and
    wait until it is Established; return the Resource for its objects."""
    name = f"{plural}.{group}"
    body = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [{
                "name": version, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }],
        },
    }
    with contextlib.suppress(AlreadyExists):
        await client.create(CUSTOMRESOURCEDEFINITIONS, body)

    async def established() -> bool:
        crd = await client.get(CUSTOMRESOURCEDEFINITIONS, name)
        conditions = crd.get("status", {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    await wait_for(established, 30, message=f"CRD {name} Established")

    async def discovered() -> bool:  # discovery follows a new CRD a moment later
        found = await server_preferred_resources(client)
        return any(rl.group_version == f"{group}/{version}" and any(r.name == plural for r in rl.resources)
                   for rl in found.resources)

    await wait_for(discovered, 30, message=f"{name} in discovery")
    return Resource(group, version, plural, kind)


class ControllerSpy:
    """Records what a running controller decides, without changing it: each sync (key, start
    time, outcome) and each delayed or rate-limited requeue. Attach right after the manager
    started; keys processed before that are not seen."""

    def __init__(self, controller: Controller) -> None:
        self.syncs: list[tuple[str, float, str]] = []
        self.delayed: list[tuple[str, float]] = []
        self.rate_limited: list[str] = []
        sync, queue = controller.sync, controller.queue
        add_after, add_rate_limited = queue.add_after, queue.add_rate_limited

        async def spy_sync(key: str) -> None:
            started = time.monotonic()
            outcome = "ok"
            try:
                await sync(key)
            except RequeueAfter as again:
                outcome = f"requeue {again.seconds:g}"
                raise
            except asyncio.CancelledError:
                outcome = "cancelled"
                raise
            except Exception as err:
                outcome = f"error {err}"
                raise
            finally:
                self.syncs.append((key, started, outcome))

        def spy_add_after(key: str, delay: float) -> None:
            self.delayed.append((key, delay))
            add_after(key, delay)

        def spy_add_rate_limited(key: str) -> None:
            self.rate_limited.append(key)
            add_rate_limited(key)

        controller.sync = spy_sync  # type: ignore[method-assign]
        queue.add_after = spy_add_after  # type: ignore[method-assign]
        queue.add_rate_limited = spy_add_rate_limited  # type: ignore[method-assign]

    def outcomes(self, key: str) -> list[str]:
        return [outcome for k, _, outcome in self.syncs if k == key]

    def sync_times(self, key: str) -> list[float]:
        return [started for k, started, _ in self.syncs if k == key]


class LoopTurns:
    """Counts the event loop's turns while in use (`async with LoopTurns() as turns`): a task that
    does nothing but yield runs once per turn, so a low count means something held the loop."""

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> LoopTurns:
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _tick(self) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(0)


def controller_of(manager: Manager, name: str) -> Controller:
    return next(c for c in manager.controllers if c.name == name)


@contextlib.asynccontextmanager
async def loopback_server(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]], ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[str]:
    """Serve every method and path with `handle` on 127.0.0.1 (a fake apiserver); yields its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def process_alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie counts as gone (an orphan's, which PID 1 of a container may never reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@contextlib.contextmanager
def sigterm_as_each_process_starts(monkeypatch: Any) -> Iterator[list[subprocess.Popen[Any]]]:
    """SIGTERM raised right after each fork, before the caller holds the child; yields the children
    started, and kills what still runs at the end (the signal handlers are restored first)."""
    started: list[subprocess.Popen[Any]] = []
    real_popen = subprocess.Popen

    def popen_then_signal(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        started.append(real_popen(*args, **kwargs))
        signal.raise_signal(signal.SIGTERM)
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
    handlers = interrupts.saved()
    try:
        yield started
    finally:
        interrupts.restore(handlers)
        monkeypatch.setattr(subprocess, "Popen", real_popen)
        for child in started:
            if child.poll() is None:
                child.kill()
                child.wait()


def free_port() -> int:
    """A TCP port nobody listens on right now, for `--secure-port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def https_get(
    url: str, *, token: str | None = None, cert: tuple[Path, Path] | None = None, accept: str | None = None
) -> tuple[int, str]:
    """GET from a pykcm/KCM secure port (self-signed, so unverified), as anonymous, with a bearer
    token, or with a client certificate (`(cert, key)`, e.g. the control plane's admin pair)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if accept is not None:
        headers["Accept"] = accept
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        timeout = aiohttp.ClientTimeout(total=10)
        async with session.get(url, headers=headers, timeout=timeout) as resp:
            return resp.status, await resp.text()


def sample(metrics_text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The value of the sample `name` whose labels include `labels` in Prometheus text, or None."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                return s.value
    return None


# KCM's first line, which pykcm writes too: `I1127 20:43:26.123456    4242 manager.py:101] "Starting" version="v0.1.0"`.
STARTING_LINE = re.compile(r'^I\d{4} [\d:.]+ +\d+ manager\.py:\d+\] "Starting" version="v[^"]+"$')


def stderr_after_start(stderr: str) -> list[str]:
    """`stderr`'s lines but the start line: what a run that stops at once says."""
    return [line for line in stderr.strip().splitlines() if not STARTING_LINE.match(line)]
