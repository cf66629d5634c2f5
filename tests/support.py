"""Test utilities shared by every integration test: clients, polling, running pykcm."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from pykcm.client.config import load_config
from pykcm.client.errors import AlreadyExists
from pykcm.client.resources import NAMESPACES, SERVICEACCOUNTS
from pykcm.client.rest import RestClient
from pykcm.controller import discover_controllers
from pykcm.manager import Manager
from pykcm.options import Options, resolve_controllers

T = TypeVar("T")


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
    opts = Options(kubeconfig=str(kubeconfig), controllers=controllers.split(","), **options)
    registry = discover_controllers()
    enabled = resolve_controllers(opts.controllers, [c.info() for c in registry.values()])
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
    """`pykcm run` as a real child process, for signal, exit-code and multi-process tests."""

    def __init__(self, *args: str, log_path: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        out = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed in wait()
        self._out = out
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pykcm.cli", "run", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
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
