"""The contract between the runtime and a controller.

A controller is a class with a name, the informers it asks the shared factory for (in its
constructor), a work queue of string keys, and `sync(key)`. The runtime owns everything
else: the worker loop, retries with backoff, metrics, shutdown, and the lines it logs for them
(`log_lines`: a built-in controller declares KCM's, which operators grep and alert on).

What a cache holds (pykcm/informers/projection.py): a controller may say which fields of each
object it reads, `informers.informer(PODS, fields={...})`; the shared informer then keeps only
the union of what its controllers asked for, so 50,000 pods cost about 150 MiB, not gigabytes.
Asking without `fields` means whole objects (managedFields aside), and one such controller gives
every sharer whole objects: a plugin is never handed less than it asked for. A projection must
name every field the controller reads, including through helpers (`podutil.POD_FIELDS` lists
what the pod predicates and the deletion ranking read); a field left out reads as absent. Ask
in the constructor: an informer that runs cannot grow its fields (RuntimeError). Cached objects
are shared by every controller and must not be modified: copy before changing.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from pykcm.client.events import EventRecorder
from pykcm.client.rest import RestClient
from pykcm.controller import metrics
from pykcm.informers.factory import SharedInformerFactory
from pykcm.informers.store import Obj, object_key
from pykcm.util.durations import go_duration
from pykcm.util.errors import described
from pykcm.util.log import get_logger, one_line
from pykcm.workqueue import RateLimiter, RateLimitingQueue, default_controller_rate_limiter

if TYPE_CHECKING:
    from pykcm.app.options import Options  # the controllers' view of the component configuration

log = get_logger("controller")


class RequeueAfter(Exception):
    """Raised by sync to say "not finished, look again in `seconds`" without error backoff.

    A delay <= 0 (a computed deadline that has already passed) is a rate-limited requeue, as
    controller-runtime's `Requeue: true`: it backs off like an error (without being logged as one)
    instead of running the key again at once, which would spin it on the shared event loop.
    `error`, where KCM's sync returns one here, is logged as the controller's failed line (KCM's
    worker logs it) but not counted as a sync error; the key comes back as the delay says, after
    `seconds` or, for a delay <= 0, with the backoff."""

    def __init__(self, seconds: float, error: BaseException | str | None = None) -> None:
        super().__init__(f"requeue after {seconds:g}s")
        self.seconds = seconds
        self.error = error


class Slot(Enum):
    """A value the runtime fills in as it writes a line."""

    KEY = "key"  # the work-queue key
    NAME = "name"  # the controller's name
    WORKERS = "workers"  # its worker count


KEY, NAME, WORKERS = Slot.KEY, Slot.NAME, Slot.WORKERS


class Line:
    """A log line: its message and key/values, a Slot value filled in as it is written. On a
    failure line `err` says how the error reads: {err} is the error, {key} the work-queue key."""

    __slots__ = ("err", "kv", "msg")

    def __init__(self, msg: str, /, err: str = "{err}", **kv: Any) -> None:
        self.msg, self.err, self.kv = msg, err, kv

    def fill(self, **slots: Any) -> dict[str, Any]:
        return {k: slots[v.value] if isinstance(v, Slot) else v for k, v in self.kv.items()}


def handle_error(msg: str, /, err: str = "{err}", **kv: Any) -> Line:
    """A line as KCM's utilruntime.HandleError* writes it: from the logger named UnhandledError."""
    return Line(msg, err=err, logger="UnhandledError", **kv)


@dataclass(frozen=True)
class LogLines:
    """The lines the runtime writes for a controller. The built-in ones declare KCM's, which
    operators grep and alert on; a plugin may declare its own."""

    start: Line  # the controller starts, before it waits for its caches (KCM's order)
    stop: Line  # it ends, however: drained, cancelled (its caches' wait too) or crashed
    failed: Line  # a sync raised (an error line, with err=), retried with backoff; or a RequeueAfter's error
    finished: Line  # at V(4), after every sync, with duration=
    workers: Line | None = None  # at V(5), as the workers start


GENERIC_LOG_LINES = LogLines(
    start=Line("Starting controller", controller=NAME, workers=WORKERS),
    stop=Line("Shutting down controller", controller=NAME),
    failed=Line("Error syncing, requeuing", controller=NAME, key=KEY),
    finished=Line("Finished syncing", controller=NAME, key=KEY),
)


@dataclass
class ControllerContext:
    """What the manager hands each controller."""

    client: RestClient  # the controller's own client (own user agent and QPS budget)
    informers: SharedInformerFactory
    options: Options
    events: EventRecorder


class Controller(ABC):
    name: ClassVar[str]  # canonical KCM name, e.g. "replicaset-controller"
    aliases: ClassVar[tuple[str, ...]] = ()  # accepted in --controllers, e.g. ("replicaset",)
    enabled_by_default: ClassVar[bool] = True
    client_name: ClassVar[str] = ""  # user agent suffix / service account name; defaults to `name`
    queue_name: ClassVar[str] = ""  # workqueue metrics label; defaults to the first alias
    workers: ClassVar[int] = 1  # default worker count
    workers_option: ClassVar[str | None] = None  # Options attribute that overrides `workers`
    log_lines: ClassVar[LogLines] = GENERIC_LOG_LINES  # what the runtime logs on start, stop and each sync

    def __init__(self, ctx: ControllerContext) -> None:
        self.ctx = ctx
        self.client = ctx.client
        self.informers = ctx.informers
        self.options = ctx.options
        self.events = ctx.events
        self.queue = RateLimitingQueue(self.queue_label(), self.rate_limiter())
        self.log = get_logger(self.queue_label())  # KCM's Run and sync log through the manager's unnamed logger
        # ...and its constructor gets one named after the controller: the event handlers and what the
        # constructor sets up (the namespace deleter's discovery) log through it, and so does the event
        # recorder, which the manager names.
        self.named_log = self.log.named(self.name)
        self.last_progress = time.monotonic()

    # -- declared by subclasses -----------------------------------------------------------------------

    @abstractmethod
    async def sync(self, key: str) -> None:
        """Make the world match the desired state for `key`. Raise to retry with backoff."""

    def rate_limiter(self) -> RateLimiter:
        return default_controller_rate_limiter()

    @classmethod
    def client_limits(cls, qps: float, burst: int) -> tuple[float, int]:
        """QPS and burst for this controller's client; the namespace controller raises them."""
        return qps, burst

    # -- helpers for event handlers -------------------------------------------------------------------

    def enqueue(self, obj: Obj) -> None:
        self.queue.add(object_key(obj))

    def enqueue_after(self, obj: Obj, seconds: float) -> None:
        self.queue.add_after(object_key(obj), seconds)

    # -- runtime --------------------------------------------------------------------------------------

    @classmethod
    def queue_label(cls) -> str:
        return cls.queue_name or (cls.aliases[0] if cls.aliases else cls.name)

    def worker_count(self) -> int:
        return int(getattr(self.options, self.workers_option)) if self.workers_option else self.workers

    async def run_when_ready(self, ready: Callable[[], Awaitable[None]]) -> None:
        """The controller's life as the runtime runs it, in KCM's order: its start line, `ready` (the
        wait for its caches), `run`, then its stop line however that ends (drained, cancelled or
        crashed: KCM's deferred line says so in each case)."""
        lines = self.log_lines
        self.log.info(lines.start.msg, **self._kv(lines.start))
        try:
            await ready()
            await self.run()
        finally:
            self.log.info(lines.stop.msg, **self._kv(lines.stop))

    async def run(self) -> None:
        """Run workers until the queue is shut down: in-flight syncs go on, queued keys are left
        (the manager is stopping; the next leader lists everything again)."""
        workers = self.log_lines.workers
        if workers is not None:
            self.log.v(5).info(workers.msg, **self._kv(workers))
        # Named: a SIGQUIT dump (pykcm/app/stackdump.py) lists tasks by name.
        await asyncio.gather(*(asyncio.create_task(self._worker(), name=f"{self.name} worker {i}")
                               for i in range(self.worker_count())))

    def _kv(self, line: Line, key: str = "") -> dict[str, Any]:
        return line.fill(key=key, name=self.name, workers=self.worker_count())

    async def _worker(self) -> None:
        while True:
            key, shutdown = await self.queue.get()
            if shutdown:
                return
            if self.queue.shutting_down:  # client-go's Get still hands out queued keys; KCM's context is cancelled
                self.queue.done(key)
                return
            if len(self.queue.in_flight()) == 1:  # an idle controller's wait for work is not a lack of progress
                self.last_progress = time.monotonic()
            try:
                await self._process(key)
            finally:
                self.queue.done(key)
                self.last_progress = time.monotonic()
            # KCM's workers are goroutines; these take turns on one loop, and a sync that finds nothing
            # to do never suspends: without a turn given here a backlog of such keys would hold the loop.
            await asyncio.sleep(0)

    async def _process(self, key: str) -> None:
        start = time.monotonic()
        result = "success"
        failure: Exception | str | None = None
        logged: BaseException | str | None = None  # a requeue's error: logged, not backed off
        try:
            await self.sync(key)
            self.queue.forget(key)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():  # this worker is being stopped
                raise
            # A sync that awaited something cancelled under it failed like any other sync; ending the worker
            # would drop the key and make the controller look cleanly stopped.
            result, failure = "error", "sync was cancelled by something it awaited"
        except RequeueAfter as again:
            result, logged = "requeue", again.error
            if again.seconds > 0:
                self.queue.add_after(key, again.seconds)
            else:  # an immediate re-add would spin the key; the rate limiter backs off until a sync succeeds
                self.queue.add_rate_limited(key)
        except Exception as err:
            result, failure = "error", described(err)
        finally:
            elapsed = time.monotonic() - start
            metrics.controller_sync_duration_by(self.name, result).observe(elapsed)
            if self.log.v(4).enabled():
                finished = self.log_lines.finished
                # One dict: a line that declares `duration` too gets the runtime's, klog's last duplicate.
                self.log.v(4).info(finished.msg, **{**self._kv(finished, key), "duration": go_duration(elapsed)})
        # After "Finished syncing": KCM logs that in the sync, this in the worker.
        if failure is not None:
            self._failed(key, failure)
        elif logged is not None:
            self._log_failure(key, logged)

    def _failed(self, key: str, err: Exception | str) -> None:
        metrics.controller_sync_errors_by(self.name).inc()
        self._log_failure(key, err)
        self.queue.add_rate_limited(key)

    def _log_failure(self, key: str, err: BaseException | str) -> None:
        line = self.log_lines.failed
        self.log.error(line.err.format(err=one_line(err), key=key), line.msg, **self._kv(line, key))
