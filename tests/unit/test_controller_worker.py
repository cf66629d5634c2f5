"""A controller's workers: what ends them, how they share the loop, and when they count as making progress."""

from __future__ import annotations

import asyncio
import time

from pykcm.app.options import Options
from pykcm.controller import Controller, ControllerContext
from pykcm.controller.progress import NO_PROGRESS_AFTER, controller_stuck_reason
from pykcm.informers.factory import SharedInformerFactory
from tests.support import LoopTurns


def context() -> ControllerContext:
    return ControllerContext(client=None, informers=SharedInformerFactory(None), options=Options(), events=None)  # type: ignore[arg-type]


class Recording(Controller):
    name = "worker-test-controller"

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx)
        self.synced: list[str] = []
        self.cancel_first = False
        self.gate: asyncio.Event | None = None

    async def sync(self, key: str) -> None:
        if self.cancel_first:
            self.cancel_first = False
            helper = asyncio.ensure_future(asyncio.sleep(10))
            helper.cancel()
            await helper  # a CancelledError that is not the worker's own
        if self.gate is not None:
            await self.gate.wait()
        self.synced.append(key)


async def test_a_cancellation_the_sync_did_not_ask_for_is_a_failed_sync_and_requeued() -> None:
    controller = Recording(context())
    controller.cancel_first = True
    runner = asyncio.create_task(controller.run())
    controller.queue.add("ns/a")
    for _ in range(200):
        if controller.synced:
            break
        await asyncio.sleep(0.01)
    assert controller.synced == ["ns/a"]  # retried after its backoff, by a worker still running
    assert not runner.done()
    controller.queue.shutdown()
    await asyncio.wait_for(runner, 1)


async def test_cancelling_the_workers_still_stops_them() -> None:
    controller = Recording(context())
    controller.gate = asyncio.Event()
    runner = asyncio.create_task(controller.run())
    controller.queue.add("ns/a")
    await asyncio.sleep(0.01)
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    assert runner.cancelled()


async def test_a_backlog_of_syncs_that_never_suspend_leaves_the_loop_turns() -> None:
    controller = Recording(context())
    for i in range(2000):
        controller.queue.add(f"ns/{i}")
    async with LoopTurns() as turns:
        runner = asyncio.create_task(controller.run())
        while len(controller.synced) < 2000:
            await asyncio.sleep(0.001)
    controller.queue.shutdown()
    await runner
    assert turns.count > 500  # without a turn per key the loop turned once or twice in the whole backlog


async def test_an_idle_controller_given_work_is_not_stuck_at_once() -> None:
    controller = Recording(context())
    controller.workers = 1
    controller.gate = asyncio.Event()
    runner = asyncio.create_task(controller.run())
    await asyncio.sleep(0)
    controller.last_progress = time.monotonic() - 2 * NO_PROGRESS_AFTER  # idle for ten minutes
    controller.queue.add("ns/a")
    controller.queue.add("ns/b")  # waits while the only worker syncs ns/a
    await asyncio.sleep(0.01)
    assert controller_stuck_reason(controller, time.monotonic()) is None
    controller.gate.set()
    controller.queue.shutdown()
    await runner
