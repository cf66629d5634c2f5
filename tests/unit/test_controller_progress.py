"""A controller's "stuck" signal is a gauge per controller, computed when scraped."""

from __future__ import annotations

from prometheus_client import REGISTRY

from pykcm.app.options import Options
from pykcm.controller import Controller, ControllerContext
from pykcm.controller.progress import STUCK_SYNC_AFTER, watch_progress
from pykcm.informers.factory import SharedInformerFactory


class Idle(Controller):
    name = "progress-test-controller"

    async def sync(self, key: str) -> None:
        return None


def stuck_value() -> float | None:
    return REGISTRY.get_sample_value("pykcm_controller_stuck", {"controller": Idle.name})


def test_the_stuck_gauge_follows_the_controller() -> None:
    ctx = ControllerContext(client=None, informers=SharedInformerFactory(None), options=Options(), events=None)  # type: ignore[arg-type]
    controller = Idle(ctx)
    now = [1000.0]
    watch_progress(controller, clock=lambda: now[0])
    controller.last_progress = now[0]
    assert stuck_value() == 0
    controller.queue.add("a")
    now[0] += STUCK_SYNC_AFTER + 1  # a key waits and nothing finished for over 10 minutes
    assert stuck_value() == 1
