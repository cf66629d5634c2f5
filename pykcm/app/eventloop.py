"""The event loop pykcm runs on: uvloop's where it is installed, unless turned off (--no-uvloop).

uvloop (libuv, Cython) runs the same asyncio code with less CPU per request: its event loop and
its TLS transport are compiled, where asyncio's TLS layer (sslproto) is Python, and the REST
client spends most of its time there. It is a dependency wherever it has wheels; without it,
or with --no-uvloop, asyncio's own loop runs everything unchanged.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory(use_uvloop: bool) -> LoopFactory | None:
    """uvloop's loop factory, or None for asyncio's default loop."""
    if not use_uvloop:
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], use_uvloop: bool) -> T:
    """asyncio.run(main) on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
        return runner.run(main)


def implementation(loop: asyncio.AbstractEventLoop) -> str:
    """For the start-up log: "uvloop" or "asyncio"."""
    return type(loop).__module__.split(".")[0]


def exit_on_sigterm() -> None:
    """Until the loop's own handlers are installed (the start: the kubeconfig, an exec plugin), SIGTERM
    ends the process at once. Its default action would, except in a container's PID 1, which the kernel
    shields from any signal it has no handler for: a pod deleted as it started would run on, lead, and
    be killed at the end of its grace period without releasing the Lease. A handler already there
    (`--local`'s, which stops its cluster and says so) stays."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit)


def _exit(signum: int, _frame: object) -> None:
    sys.exit(128 + signum)
