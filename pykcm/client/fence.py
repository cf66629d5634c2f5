"""Fenced writes: a leader refuses to mutate anything once its Lease may have expired.

Leader election alone cannot stop a leader that stalls past its lease (a GC pause, SIGSTOP, a
frozen VM) from writing when it resumes, before its renew loop notices: a standby may lead by
then. The fence closes that window. Every mutating request checks that the last successful Lease
renewal was *sent* less than `window` seconds ago on this process's monotonic clock, after the
rate limiter and again in the same synchronous step that hands its bytes to the connection's
transport (pykcm.client.httpconnection writes a request with one write(), or one over 64 KiB in
pieces until the transport is full, the rest as it drains: a body's later bytes cannot make a
request that started arriving in time apply any sooner). The socket and
TLS transports of both asyncio and uvloop call send() on the socket before write() returns
(unless the kernel buffer is full), so a freeze lands before that check (the request is refused
on waking) or after the bytes left (the apiserver reads them while this process is frozen); only
the microseconds between the check and the socket's send() remain. A standby starts its own
countdown only after it has seen that renewal, so a request that passes the check is sent, and
arrives at the apiserver, before any standby can lead, provided it gets there within the margin
between `window` and the lease duration. That bounds the wire, not the apiserver: a write held in
its priority-and-fairness queue, by admission webhooks or by etcd may still take effect after a
standby leads. A refused write raises FencedWrite and tells the owner (who steps down); nothing
is sent.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from pykcm.client.errors import TransportError

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Reviews are answered, not stored: serving /metrics may ask for them whatever the lease says.
UNFENCED_PREFIXES = ("/apis/authentication.k8s.io/", "/apis/authorization.k8s.io/")


# The request the current task is sending, (method, API path): read by the connection pool when it
# writes the request, which it does in the sending task.
_SENDING: ContextVar[tuple[str, str] | None] = ContextVar("pykcm_sending", default=None)


@contextlib.contextmanager
def sending(method: str, path: str) -> Iterator[None]:
    """Name the request this task sends while the block runs, for check_sending()."""
    token = _SENDING.set((method, path))
    try:
        yield
    finally:
        _SENDING.reset(token)


class FencedWrite(TransportError):
    """A write refused before it was sent because the lease may have expired."""


class WriteFence:
    """Open (every request passes) until armed with the time of the last renewal a leader sent;
    shut (every write refused) once the lease is lost or released."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._renew_sent: Callable[[], float] | None = None
        self._window = 0.0
        self._on_refuse: Callable[[str, str], None] = lambda _request, _reason: None
        self._shut = ""  # once set, every write is refused with this reason

    @property
    def armed(self) -> bool:
        return self._renew_sent is not None

    def arm(self, renew_sent: Callable[[], float], window: float, on_refuse: Callable[[str, str], None]) -> None:
        """Fence from now on: `renew_sent()` is the monotonic time the last successful renewal was sent;
        `on_refuse(request, reason)` hears of each refused write ("POST /api/v1/...")."""
        self._renew_sent, self._window, self._on_refuse = renew_sent, window, on_refuse

    def shut(self, reason: str) -> None:
        """Refuse every write from now on (the lease was lost or released)."""
        self._shut = reason

    def reason_to_refuse(self) -> str | None:
        if self._shut:
            return self._shut
        if self._renew_sent is None:
            return None
        age = self._clock() - self._renew_sent()
        if age < self._window:
            return None
        return f"lease last renewed {age:.1f}s ago, past the {self._window:g}s write window"

    def check(self, method: str, path: str) -> None:
        """Raise FencedWrite (and report it) if this request must not be sent."""
        if method not in MUTATING_METHODS or path.startswith(UNFENCED_PREFIXES):
            return
        reason = self.reason_to_refuse()
        if reason is None:
            return
        self._on_refuse(f"{method} {path}", reason)
        raise FencedWrite(f"{method} {path}: refused, {reason}")

    def check_sending(self) -> None:
        """check() the request the current task is sending, if it named one (see sending())."""
        request = _SENDING.get()
        if request is not None:
            self.check(*request)

