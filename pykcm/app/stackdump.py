"""SIGQUIT: write every thread's and every task's stack to stderr and exit 2, as a Go program does.

`kill -QUIT` on KCM prints all goroutines and exits 2; operators use it to see where a stuck
process is. pykcm's equivalents of goroutines are its threads (the event loop, the Lease thread,
the loop watch) and the event loop's tasks (a controller's workers, informers, the server).

The handler is a plain signal handler, not the loop's: Python runs it at the main thread's next
bytecode, so it dumps even when the loop is blocked in Python code or in a sleep, exactly when a
dump is wanted. It then has the loop raise SystemExit from a callback of its own (raised in the
handler, it could land in a transport's callback, which takes it for a connection error), so
`run --local` still stops its control plane; a loop that does not get to it within EXIT_GRACE
(blocked) is left with os._exit, as Go leaves.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
import threading
import traceback
from types import FrameType
from typing import TextIO

EXIT_CODE = 2  # Go's exit status after a SIGQUIT dump
EXIT_GRACE = 3.0  # for a blocked loop to get to the exit


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Dump and exit on SIGQUIT, from now on (call on the main thread, with the loop running)."""
    exiting = threading.Event()

    def exit_on_loop() -> None:
        exiting.set()
        raise SystemExit(EXIT_CODE)

    def exit_if_blocked() -> None:
        if not exiting.wait(EXIT_GRACE):
            os._exit(EXIT_CODE)

    def on_sigquit(_signum: int, frame: FrameType | None) -> None:
        dump(loop, sys.stderr, interrupted=frame)
        threading.Thread(target=exit_if_blocked, name="sigquit-exit", daemon=True).start()
        loop.call_soon_threadsafe(exit_on_loop)

    signal.signal(signal.SIGQUIT, on_sigquit)


def dump(loop: asyncio.AbstractEventLoop, out: TextIO, interrupted: FrameType | None = None) -> None:
    """Every thread's stack, then every pending task's, written at once; this thread's is
    `interrupted` (where the signal handler was called), if given."""
    text = io.StringIO()
    text.write("SIGQUIT: quit\n")
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames = sys._current_frames()
    if interrupted is not None:
        frames[threading.get_ident()] = interrupted
    for ident, frame in frames.items():
        text.write(f"\nthread {names.get(ident, ident)}:\n")
        text.writelines(traceback.format_stack(frame))
    for task in sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name()):
        text.write(f"\ntask {task.get_name()!r}:\n")
        frames = _awaited_frames(task.get_coro())
        text.writelines(traceback.StackSummary.extract((f, f.f_lineno) for f in frames).format())
    out.write(text.getvalue())
    out.flush()


def _awaited_frames(coro: object) -> list[FrameType]:
    """A suspended coroutine's frames, outermost first, down its chain of awaits (Task.get_stack
    gives only the outermost: a worker would show as 'await self._process(key)', not where it waits)."""
    frames: list[FrameType] = []
    while (frame := getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)) is not None:
        frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return frames
