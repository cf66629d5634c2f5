"""Event-loop lag: how late the one asyncio loop runs a callback that was due, and what blocked it.

Everything but the Lease renewal (informers, queues, workers, serving) shares one loop, so
anything that blocks it delays everything: this measures by how much. A task asks to wake every
`interval` seconds and records how much later than asked it actually ran; each wake-up is a
heartbeat. The Lease has a thread of its own (leasethread.py), which stops renewing only once
the heartbeat has stopped for too long.

The lag says that the loop was blocked, not by what: a plugin's sync calling a blocking library,
say. BlockedLoopWatch, a thread of its own, sees the heartbeat stop and logs where the loop's
thread is at that moment (its Python stack, class-qualified, so the plugin is named) and whether
it was computing or waiting, then how long the stall lasted once the loop runs again.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from prometheus_client import Gauge, Histogram, disable_created_metrics

from pykcm.util.errors import in_stdlib
from pykcm.util.log import get_logger

disable_created_metrics()

log = get_logger("event-loop")

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SAMPLE_INTERVAL = 0.1

event_loop_lag = Histogram(
    "pykcm_event_loop_lag_seconds",
    "How much later than due the event loop ran a periodic timer; high values mean something blocked the loop.",
    buckets=LAG_BUCKETS,
)
event_loop_lag_max = Gauge(
    "pykcm_event_loop_lag_max_seconds", "The highest event-loop lag observed since the process started."
)


async def measure_event_loop_lag(
    interval: float = SAMPLE_INTERVAL,
    histogram: Histogram = event_loop_lag,
    maximum: Gauge = event_loop_lag_max,
    on_tick: Callable[[], None] = lambda: None,
) -> None:
    """Run until cancelled, observing each wake-up's lateness (and the highest so far); `on_tick`
    runs at each wake-up (a heartbeat)."""
    highest = 0.0
    while True:
        due = time.monotonic() + interval
        await asyncio.sleep(interval)
        lag = max(0.0, time.monotonic() - due)
        histogram.observe(lag)
        if lag > highest:
            highest = lag
            maximum.set(lag)
        on_tick()


class LoopHeartbeat:
    """The last time (monotonic) the main event loop ran a periodic callback."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def beat(self) -> None:
        self.last = time.monotonic()

    def age(self) -> float:
        return time.monotonic() - self.last


BLOCKED_REPORT_AFTER = 2.0  # under the Lease thread's heartbeat bound (5 s with KCM's defaults)
WATCH_PERIOD = 0.25
COMPUTING_SHARE = 0.1  # of the stall's wall time on the loop thread's CPU clock: computing; a wait uses ~0
# Frames logged: the innermost (the blocking call) and the outermost (the task's own coroutines:
# a worker, its sync), so a sync blocked deep inside a library is still named.
INNER_FRAMES, OUTER_FRAMES = 5, 3
_COROUTINE_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class BlockedLoopWatch:
    """Names what blocks the event loop: a daemon thread that, once the heartbeat is older than
    `after`, samples the loop thread's stack and logs it, and logs again when the loop runs.

    Built on the loop's thread (it samples the thread that built it). One line per stall, not per
    poll: a wedged loop is reported once.
    """

    def __init__(self, heartbeat: LoopHeartbeat, after: float = BLOCKED_REPORT_AFTER,
                 period: float = WATCH_PERIOD) -> None:
        self._heartbeat = heartbeat
        self._after = after
        self._period = period
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="event-loop-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        stalled_since: float | None = None  # the last beat before a reported stall
        mark = (time.monotonic(), _thread_cpu(self._loop_thread))  # while the loop ran: a stall's CPU from here
        while not self._stop.wait(self._period):
            last, now = self._heartbeat.last, time.monotonic()
            if now - last < self._after / 2:
                mark = (now, _thread_cpu(self._loop_thread))
            elif stalled_since is None and now - last >= self._after:
                stalled_since = last
                self._report(now - last, mark)
            if stalled_since is not None and last != stalled_since:
                log.info("Event loop runs again", blocked_for=f"{last - stalled_since:.1f}s")
                stalled_since = None

    def _report(self, age: float, mark: tuple[float, float | None]) -> None:
        stack = _described_stack(sys._current_frames().get(self._loop_thread))
        # Computing or waiting: the loop thread's CPU since the loop last ran, over the stall so far
        # (a long window, so a thread short of CPU on a busy node still reads as computing).
        since, cpu_then = mark
        cpu_now = _thread_cpu(self._loop_thread)
        state = "unknown"
        if cpu_now is not None and cpu_then is not None:
            busy = (cpu_now - cpu_then) / max(time.monotonic() - since, 1e-3)
            state = "computing" if busy > COMPUTING_SHARE else "waiting"
        log.warning("Event loop blocked", blocked_for=f"{age:.1f}s", at=stack[0] if stack else "unknown",
                    state=state, stack=stack)


def _thread_cpu(thread_id: int) -> float | None:
    """CPU seconds the thread has used (Linux: its per-thread clock), or None where unknown."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread_id))
    except (AttributeError, OSError):
        return None


def _described_stack(frame: FrameType | None) -> list[str]:
    """The frames outside the standard library (asyncio's own frames say nothing), as
    "file.py:12 in Class.method", innermost first, up to the task's outermost coroutine (what runs
    the loop is left out); of a deep stack the innermost and the outermost, "..." between them."""
    described: list[str] = []
    task_end = 0  # after the outermost coroutine frame seen: the task's own part of the stack
    while frame is not None:
        code = frame.f_code
        if not in_stdlib(code.co_filename):
            name = getattr(code, "co_qualname", code.co_name)
            described.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {name}")
            if code.co_flags & _COROUTINE_FLAGS:
                task_end = len(described)
        frame = frame.f_back
    described = described[:task_end] or described
    if len(described) > INNER_FRAMES + OUTER_FRAMES:
        return [*described[:INNER_FRAMES], "...", *described[-OUTER_FRAMES:]]
    return described
