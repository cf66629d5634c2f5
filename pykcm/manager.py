"""Builds the shared informer factory and the enabled controllers, runs them, stops them cleanly."""

from __future__ import annotations

import asyncio
import time

from pykcm import metrics
from pykcm.client.config import ClientConfig
from pykcm.client.errors import ApiError, TransportError
from pykcm.client.rest import RestClient
from pykcm.controller import Controller, ControllerContext
from pykcm.events import EventRecorder
from pykcm.informers.factory import SharedInformerFactory
from pykcm.log import get_logger
from pykcm.options import Options

log = get_logger("controller-manager")

MANAGER_NAME = "pykcm"
APISERVER_HEALTH_TIMEOUT = 10.0  # KCM gives up building its controller context after 10 s
SHUTDOWN_DRAIN_TIMEOUT = 30.0  # in-flight syncs get this long to finish on SIGTERM


class ManagerError(Exception):
    """A start-up failure the user must see as one line (and exit 1)."""


class Manager:
    def __init__(self, options: Options, config: ClientConfig, controllers: list[type[Controller]]) -> None:
        self.options = options
        self.client = RestClient(config.with_limits(options.kube_api_qps, options.kube_api_burst))
        self.factory = SharedInformerFactory(self.client.for_controller("shared-informers"), options.min_resync_period)
        self.controller_classes = controllers
        self.controllers: list[Controller] = []
        self.synced = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._wait_for_apiserver()
            await self._run_controllers(stop)
        finally:
            await self.client.close()

    async def _wait_for_apiserver(self) -> None:
        deadline = time.monotonic() + APISERVER_HEALTH_TIMEOUT
        last_error = ""
        while time.monotonic() < deadline:
            try:
                await self.client.request("GET", "/healthz", accept="text/plain")
                return
            except (ApiError, TransportError, ValueError) as err:
                last_error = " ".join(str(err).split())
            await asyncio.sleep(1.0)
        raise ManagerError(f"failed to wait for apiserver being healthy: {last_error}")

    def _build_controllers(self) -> None:
        for cls in self.controller_classes:
            qps, burst = cls.client_limits(self.options.kube_api_qps, self.options.kube_api_burst)
            client = self.client.for_controller(cls.client_name or cls.name, qps, burst)
            # Events are sourced from the controller's canonical name, e.g. "replicaset-controller".
            events = EventRecorder(client, cls.name)
            ctx = ControllerContext(client=client, informers=self.factory, options=self.options, events=events)
            self.controllers.append(cls(ctx))
            log.info("Controller built", controller=cls.name)

    async def _run_controllers(self, stop: asyncio.Event) -> None:
        self._build_controllers()
        self.factory.start()
        log.info("Waiting for caches to sync", informers=sorted(r.name for r in self.factory.informers))
        synced = asyncio.create_task(self.factory.wait_for_cache_sync())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({synced, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not synced.done():
            synced.cancel()
            stopped.cancel()
            await self._shutdown([])
            return
        stopped.cancel()
        log.info("Caches are synced", controllers=[c.name for c in self.controllers])
        self.synced.set()
        workers = [asyncio.create_task(c.run(), name=f"controller {c.name}") for c in self.controllers]
        for controller in self.controllers:
            metrics.running_managed_controllers.labels(controller.name, MANAGER_NAME).set(1)
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({waiter, *workers}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        crashed = [t for t in done if t is not waiter and t.exception()]
        await self._shutdown(workers)
        if crashed:
            raise ManagerError(f"controller stopped unexpectedly: {crashed[0].exception()}")

    async def _shutdown(self, workers: list[asyncio.Task]) -> None:
        log.info("Shutting down controllers", controllers=[c.name for c in self.controllers])
        for controller in self.controllers:
            controller.queue.shutdown()
        if workers:
            _, pending = await asyncio.wait(workers, timeout=SHUTDOWN_DRAIN_TIMEOUT)
            for task in pending:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        for controller in self.controllers:
            metrics.running_managed_controllers.labels(controller.name, MANAGER_NAME).set(0)
        await asyncio.gather(*(c.events.close() for c in self.controllers))
        await self.factory.shutdown()
        log.info("Stopped")
