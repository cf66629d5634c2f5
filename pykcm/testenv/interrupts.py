"""Signals while a local cluster starts and stops, so that an interruption never leaves its processes
running. They live in their own sessions (they must outlive `testenv start`), so the terminal's
signals do not reach them: only the starter's cleanup stops them, and it has to run.

- `interruptible()`: SIGTERM and SIGHUP raise, as Ctrl-C does, where Python's default action ends
  the process without any cleanup. Only the first signal raises: a second one cannot cut the
  cleanup short; it is remembered, and the teardown then kills instead of waiting.
- `deferred()`: no signal raises between a process's fork and its record (subprocess.Popen would
  leave the child unknown to anyone).
- `killing_on_signal()`: a teardown is never interrupted; a signal during it SIGKILLs the cluster's
  processes, so that it ends at once.

Python runs signal handlers on the main thread only; elsewhere these change nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any, Protocol

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Killable(Protocol):
    def kill(self) -> None: ...


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP in an interruptible() block: raised as Ctrl-C's KeyboardInterrupt is
    (asyncio lets it through, as it does Ctrl-C's)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention for a process ended by a signal


class _Raiser:
    """A handler that raises Interrupted for the first signal only, with a flag of its own: one for
    interruptible() blocks, another for raise_on_termination()'s session. A pytest session runs such
    blocks in-process (their tests), and an Interrupted caught there must not turn the session's own
    SIGTERM into a no-op."""

    def __init__(self) -> None:
        self.raised = False

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if _state.stopping is not None:
            _state.stopping(signum)
        elif _state.deferring:
            _state.pending = _state.pending or (signum, self)  # raised by this handler, at the block's end
        elif self.raised:
            _state.again = signum
        else:
            self.raised = True
            raise Interrupted(signum)


class _State:
    again: int | None = None  # a signal that came after the one that raised
    deferring = 0  # depth of deferred() blocks
    pending: tuple[int, _Raiser] | None = None  # the signal that came in one, and the handler that got it
    stopping: Callable[[int], None] | None = None  # killing_on_signal()'s reaction


_state = _State()
_on_signal = _Raiser()  # interruptible()'s and killing_on_signal()'s
_on_session_signal = _Raiser()  # raise_on_termination()'s


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _install(signums: Iterable[int], handler: _Raiser = _on_signal) -> None:
    """`handler` for `signums`; an ignored SIGHUP (nohup) stays ignored, as Go leaves it."""
    for signum in signums:
        if not (signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN):
            signal.signal(signum, handler)


def raise_on_termination() -> None:
    """For a process that unwinds on KeyboardInterrupt as Ctrl-C's (pytest): SIGTERM and SIGHUP
    raise Interrupted too, from now on, so its cleanup runs (an ignored SIGHUP stays ignored); once,
    whatever interruptible() blocks did before."""
    if _on_main_thread():
        _install((signal.SIGTERM, signal.SIGHUP), _on_session_signal)


def saved() -> dict[int, Any]:
    """The handlers of SIGNALS now, for restore(): an event loop's signal handlers leave SIG_DFL behind."""
    return {signum: signal.getsignal(signum) for signum in SIGNALS}


def restore(handlers: dict[int, Any]) -> None:
    if not _on_main_thread():
        return
    for signum, handler in handlers.items():
        if handler is not None:  # None: installed outside Python, cannot be put back
            signal.signal(signum, handler)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise Interrupted in the block, the first of them only. After an
    Interrupted they are ignored beyond the block: the command is ending, its cleanup done (Python's
    default actions, back at exit, would end it by the signal instead of its own status)."""
    if not _on_main_thread():
        yield
        return
    _on_signal.raised, _state.again, _state.pending = False, None, None
    previous = saved()
    _install(SIGNALS)
    try:
        yield
    except Interrupted:
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        raise
    except BaseException:
        restore(previous)
        raise
    restore(previous)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A signal that comes in the block raises at its end, not inside it."""
    if not _on_main_thread():  # the handler runs on the main thread: it must not wait for another's block
        yield
        return
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
        if not _state.deferring and (pending := _state.pending) is not None:
            _state.pending = None
            signum, handler = pending
            handler(signum, None)


@contextlib.contextmanager
def killing_on_signal(
    processes: Callable[[], Iterable[Killable]], log: Callable[[str], None], announce: str | None = None
) -> Iterator[None]:
    """While the block (a teardown) runs, SIGINT, SIGTERM and SIGHUP do not interrupt it but SIGKILL
    `processes()`, once; so does a signal that came during the cleanup before it. `announce` is logged
    first."""
    if not _on_main_thread():
        yield
        return
    killed = False

    def kill(signum: int) -> None:
        nonlocal killed
        if killed:
            return
        killed = True
        for proc in processes():
            proc.kill()
        with contextlib.suppress(Exception):  # a handler may interrupt a write to the same stream
            log(f"{signal.Signals(signum).name}: killing the local cluster's processes")

    outer, _state.stopping = _state.stopping, kill
    previous = saved()
    _install(SIGNALS)
    try:
        if announce:
            log(announce)
        if (signum := _state.again) is not None:
            _state.again = None
            kill(signum)
        yield
    finally:
        restore(previous)
        _state.stopping = outer
