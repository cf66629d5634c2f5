"""Whether a controller makes progress: its "stuck" signal, exported as a gauge per controller.

A controller looks stuck when one sync has run for 10 minutes (namespace deletions requeue
rather than block, so even they stay far below it), or when keys wait in its queue and no
worker has finished anything for 5 minutes. KCM has no such check: its /healthz pings each
controller. pykcm reports it on /readyz and as `pykcm_controller_stuck`, never on the liveness
path, since a restart would not unstick a controller that an overloaded apiserver throttles and
would drop its expectations and relist every informer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from pykcm.controller import metrics
from pykcm.controller.base import Controller

STUCK_SYNC_AFTER = 10 * 60.0
NO_PROGRESS_AFTER = 5 * 60.0


def stuck_reason(now: float, sync_starts: Sequence[float], queued: int, last_progress: float) -> str | None:
    """Why a controller looks stuck, or None: a sync running too long, or queued keys but no progress."""
    if sync_starts and now - min(sync_starts) > STUCK_SYNC_AFTER:
        return f"a sync has been running for {now - min(sync_starts):.0f}s"
    if queued and now - last_progress > NO_PROGRESS_AFTER:
        return f"{queued} keys queued but no sync finished for {now - last_progress:.0f}s"
    return None


def controller_stuck_reason(controller: Controller, now: float) -> str | None:
    return stuck_reason(
        now, controller.queue.processing_start_times(), len(controller.queue), controller.last_progress
    )


def watch_progress(controller: Controller, clock: Callable[[], float] = time.monotonic) -> Callable[[], str | None]:
    """Export the controller's stuck signal (computed at each scrape); return the reason function."""

    def reason() -> str | None:
        return controller_stuck_reason(controller, clock())

    metrics.controller_stuck.labels(controller.name).set_function(lambda: 1.0 if reason() else 0.0)
    return reason


def forget_progress(controller: Controller) -> None:
    """A stopped controller is not stuck."""
    metrics.controller_stuck.labels(controller.name).set_function(lambda: 0.0)
