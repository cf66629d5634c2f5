"""One controller's life in the manager: wait for its own informers, then run its workers.

KCM starts every controller at once and each waits for its own caches
(WaitForNamedCacheSync), so an informer that cannot sync (a forbidden LIST, say) holds back
only the controllers that read it. Here that controller says so in one line, resource and
reason, every 30 s, and fails its check on /healthz and /readyz (not on /livez: a restart
does not fix RBAC, and relists everything); the others run.
"""

from __future__ import annotations

import asyncio
import time

from pykcm.app import metrics
from pykcm.controller import Controller
from pykcm.controller.progress import forget_progress, watch_progress
from pykcm.informers.informer import SharedInformer
from pykcm.serving.healthz import HealthCheck, controller_checks
from pykcm.util.log import get_logger

SYNC_POLL = 0.1  # how often a controller still waiting checks for an informer that cannot sync
REPORT_EVERY = 30.0  # a controller held back by an informer that cannot sync says so this often
MANAGER_NAME = "pykcm"

log = get_logger("controller-manager")


class ControllerRunner:
    def __init__(self, controller: Controller, informers: list[SharedInformer]) -> None:
        self.controller = controller
        self.informers = informers  # the ones it asked the factory for: what it waits for
        self.started = asyncio.Event()
        self._stuck = lambda: None

    @property
    def name(self) -> str:
        return self.controller.name

    def health_checks(self) -> list[HealthCheck]:
        return controller_checks(self.name, self.cannot_start, lambda: self._stuck())

    def cannot_start(self) -> str | None:
        """Why the controller is held back: the first of its informers failing to sync, or None."""
        if self.started.is_set():
            return None
        for informer in self.informers:
            error = informer.sync_error()
            if error is not None:
                return f"informer for {informer.resource.name} has not synced: {error}"
        return None

    async def run(self) -> None:
        """The controller's start line, the wait for its informers, then its workers until the queue
        is shut down."""
        try:
            await self.controller.run_when_ready(self._ready)
        finally:
            if self.started.is_set():
                metrics.running_managed_controllers.labels(self.name, MANAGER_NAME).set(0)
                forget_progress(self.controller)

    async def _ready(self) -> None:
        await self._wait_for_caches()
        self.controller.last_progress = time.monotonic()  # progress is judged from when workers start
        self._stuck = watch_progress(self.controller)
        metrics.running_managed_controllers.labels(self.name, MANAGER_NAME).set(1)
        self.started.set()

    async def _wait_for_caches(self) -> None:
        resources = [i.resource.name for i in self.informers]
        log.info("Waiting for caches to sync", controller=self.name, informers=resources)
        next_report = 0.0
        # Woken the moment the last informer syncs (client-go polls every 100 ms); the poll period
        # is kept only to report an informer that cannot sync.
        synced = asyncio.ensure_future(asyncio.gather(*(i.wait_synced() for i in self.informers)))
        try:
            while not (await asyncio.wait({synced}, timeout=SYNC_POLL))[0]:
                now = time.monotonic()
                blocked = next(((i, e) for i in self.informers if (e := i.sync_error()) is not None), None)
                if blocked is not None and now >= next_report:
                    next_report = now + REPORT_EVERY
                    informer, error = blocked
                    log.error(None, "Informer cannot sync, controller not started",
                              controller=self.name, resource=informer.resource.name, reason=error)
        finally:
            synced.cancel()
            # Cancelled with us, the gather may finish with its children's CancelledError set as an
            # exception: retrieve it, or asyncio prints "exception was never retrieved" at exit.
            synced.add_done_callback(lambda future: future.cancelled() or future.exception())
        log.info("Caches are synced", controller=self.name)
