"""Leader election on a thread of its own, with its own event loop and connection, and the fence.

On the main loop, the Lease renewal would share the loop and the connection pool with all other
traffic: a busy loop (thousands of ready callbacks, a pool full of slow requests) delays it past
the renew deadline and costs the lease. Here a LeaderElector runs on its own thread and loop with
its own RestClient (same server, TLS, client-certificate rotation and token source as the main
client, its own connections), so busy only means slower controllers.

A wedged loop must still lose the lease, or a process doing nothing would keep it: the main loop
ticks a LoopHeartbeat, and the thread neither acquires nor renews while the last tick is older
than `heartbeat_bound` (well under the lease duration). A process stalled as a whole (SIGSTOP, a
frozen VM) is stopped by the WriteFence: once leading, every mutating request of the main client
first checks that the last renewal was sent less than the lease duration minus a margin ago;
otherwise it is refused, nothing is sent, and this elector reports the lease lost. A lost lease
writes nothing more, not even the "stopped leading" Event (a release still records it). A renewal
that finds the Lease held by another (or created by another after a deletion) shuts the fence from
this thread at once, and
renewals come often enough (renew_interval) that a healthy leader's window never closes.

    elector = ThreadedElector(config, "kube-system", "pykcm", identity, le_config, fence, heartbeat)
    if await elector.acquire(stop):
        lost = not await elector.renew(stop_renewing)
        ...
        await elector.release()
    await elector.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from pykcm.app import metrics
from pykcm.app.leaderelection import USER_AGENT_SUFFIX, LeaderElectionConfig, LeaderElector, LeaseLock
from pykcm.app.looplag import LoopHeartbeat
from pykcm.client.config import ClientConfig
from pykcm.client.events import EventRecorder
from pykcm.client.fence import WriteFence
from pykcm.client.rest import RestClient
from pykcm.util.errors import described_with_type
from pykcm.util.log import get_logger

log = get_logger("leaderelection")

T = TypeVar("T")

FENCE_MARGIN = 0.2  # of the lease duration, at least 1 s: time for a checked request to reach the apiserver


def fence_window(config: LeaderElectionConfig) -> float:
    # From the whole seconds the Lease says (leaseDurationSeconds), which is what standbys wait out;
    # the margin at most half of them, so that a lease of a second or two still leaves writes a window.
    lease_duration = float(int(config.lease_duration))
    return lease_duration - min(max(1.0, FENCE_MARGIN * lease_duration), lease_duration / 2)


def renew_interval(config: LeaderElectionConfig) -> float:
    """The retry period, or half the fence's window if less: a renewal then has the other half to
    be sent and answered before the window closes, for any setting KCM accepts (e.g. 3s/2.5s/2s)."""
    window = fence_window(config)
    # A lease under a second leaves no window (every write is refused): nothing to keep open.
    return min(config.retry_period, window / 2) if window > 0 else config.retry_period


def heartbeat_bound(config: LeaderElectionConfig) -> float:
    """How long the main loop may go without a tick before the lease is no longer renewed."""
    return min(config.renew_deadline, config.lease_duration) / 2


class ThreadedElector:
    """The LeaderElector's acquire/renew/release/check, run on a daemon thread, awaited from the main loop."""

    def __init__(
        self,
        client_config: ClientConfig,
        namespace: str,
        name: str,
        identity: str,
        config: LeaderElectionConfig,
        fence: WriteFence,
        heartbeat: LoopHeartbeat,
        event_component: str,
    ) -> None:
        self.config = config
        self.identity = identity
        self._fence = fence
        self._heartbeat = heartbeat
        self._fenced = asyncio.Event()
        self._lost = False  # the lease lost (or a write refused): nothing more may be sent, Events neither
        if (interval := renew_interval(config)) < config.retry_period:
            log.info("Renewing the lease more often than the retry period, within the write fence's window",
                     lock=f"{namespace}/{name}", interval=f"{interval:g}s", retryPeriod=f"{config.retry_period:g}s",
                     window=f"{fence_window(config):g}s")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="leader-election", daemon=True)
        self._thread.start()
        # Built on the thread: the client's connections and the event sender belong to its loop.
        lease_config = replace(client_config, write_fence=None)
        self.elector: LeaderElector = self._run_sync(self._build(lease_config, namespace, name, event_component))

    async def _build(self, client_config: ClientConfig, namespace: str, name: str, component: str) -> LeaderElector:
        client = RestClient(client_config, USER_AGENT_SUFFIX)
        # Its Events logged at V(0), as KCM's broadcaster logs them (StartStructuredLogging(0)).
        events = EventRecorder(client, component, log_verbosity=0)
        lock = LeaseLock(client, namespace, name, self.identity, events, request_timeout=self.config.request_timeout)
        # The fence's state is one attribute, so shutting it from this thread needs no lock.
        return LeaderElector(lock, self.config, may_write=self._loop_stalled, event_on_loss=False,
                             on_lost=self._fence.shut, renew_interval=renew_interval(self.config))

    def _loop_stalled(self) -> str | None:
        age, bound = self._heartbeat.age(), heartbeat_bound(self.config)
        return f"event loop has not run for {age:.1f}s (over {bound:g}s)" if age > bound else None

    # -- the thread -----------------------------------------------------------------------------------

    def _run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the thread's loop; cancelling the caller cancels it there."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _with_stop(self, stop: asyncio.Event, run: Callable[[asyncio.Event], Coroutine[Any, Any, bool]]) -> bool:
        """`run(thread_stop)` on the thread, with `stop` (a main-loop event) mirrored into thread_stop."""
        thread_stop = await self._call(_new_event())
        mirror = asyncio.create_task(stop.wait())
        mirror.add_done_callback(lambda t: t.cancelled() or self._loop.call_soon_threadsafe(thread_stop.set))
        try:
            return await self._call(run(thread_stop))
        finally:
            mirror.cancel()

    # -- the LeaderElector's API ----------------------------------------------------------------------

    @property
    def lock(self) -> LeaseLock:
        return self.elector.lock

    def is_leader(self) -> bool:
        return self.elector.is_leader()

    def check(self) -> str | None:
        return self.elector.check()

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Stand by until leader (True) or `stop` (False); once leading, the fence is armed."""
        if not await self._with_stop(stop, self.elector.acquire):
            return False
        self._fenced.clear()
        self._fence.arm(lambda: self.elector.renew_sent, fence_window(self.config), self._on_write_refused)
        return True

    async def renew(self, stop: asyncio.Event) -> bool:
        """Renew until `stop` (True), or until the renewal fails or the fence refused a write (False);
        a crash of the renewal raises. Any end but True leaves the fence shut and the metric at 0."""
        renewing = asyncio.ensure_future(self._with_stop(stop, self.elector.renew))
        fenced = asyncio.create_task(self._fenced.wait())
        renewed = False
        try:
            await asyncio.wait({renewing, fenced}, return_when=asyncio.FIRST_COMPLETED)
            if not self._fenced.is_set():
                renewed = bool(await renewing)
                return renewed
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)
            return False
        finally:
            fenced.cancel()
            cancelled = not renewing.done()  # we are cancelled: so is the renewal on the thread
            if cancelled:
                renewing.cancel()
            if not renewed:
                self._lost = self._lost or not cancelled
                # Any other end (lost, a refused write, a crash of the renewal, cancelled) leaves this
                # process not leading: no write of it may pass, and the metric says so.
                if not self._fenced.is_set():  # else the refused write's reason stays
                    self._fence.shut(self.elector.lost_reason or _stop_reason(renewing, cancelled))
                metrics.leader_election_master_status.labels(self.elector.name).set(0)

    def _on_write_refused(self, request: str, reason: str) -> None:
        """Called by the fence on the main loop, for the first refused write and any after it."""
        self._fence.shut(reason)
        if not self._fenced.is_set():
            log.error(None, "Refused a write: stepping down", lock=self.lock.describe(), write=request, reason=reason)
            self._fenced.set()

    async def release(self) -> bool:
        self._fence.shut("leader lease released")
        return await self._call(self.elector.release())

    async def close(self) -> None:
        """Flush the LeaderElection events (drop them once the lease is lost, as KCM's exit at once
        does: a retry waiting to send would go out after another may lead), close the Lease client
        and stop the thread."""
        if not self._loop.is_closed():
            with contextlib.suppress(Exception):
                await self._call(self._close_on_thread(flush=not self._lost))
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join, 10)
            if not self._thread.is_alive():
                self._loop.close()

    async def _close_on_thread(self, flush: bool) -> None:
        if self.lock.events is not None:
            await self.lock.events.close() if flush else await self.lock.events.close(timeout=0)
        await self.lock.client.close()


def _stop_reason(renewing: asyncio.Future[bool], cancelled: bool) -> str:
    """Why the fence shuts when the elector gave no reason: stopped, its renewal crashed, or lost."""
    if cancelled or renewing.cancelled():
        return "leader election stopped"  # this process is stopping: not a lost lease
    if renewing.done() and (err := renewing.exception()) is not None:
        return f"lease renewal crashed: {described_with_type(err)}"
    return "leader election lost"


async def _new_event() -> asyncio.Event:
    return asyncio.Event()
