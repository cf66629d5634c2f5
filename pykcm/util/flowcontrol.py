"""Token bucket shared by the API client (QPS/burst) and the work queue's overall limiter.

Semantics follow golang.org/x/time/rate as client-go uses it: a reservation always
succeeds and returns how long the caller must wait, so tokens may go negative and
callers queue up in arrival order.
"""

from __future__ import annotations

import asyncio
import math
import time


class TokenBucket:
    def __init__(self, qps: float, burst: int, clock=time.monotonic) -> None:
        if qps <= 0 or burst <= 0:
            raise ValueError(f"token bucket needs qps > 0 and burst > 0, got qps={qps} burst={burst}")
        self.qps = float(qps)
        self.burst = int(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._last_event = self._last  # when the newest reservation may act

    def _advance(self) -> float:
        now = self._clock()
        # A clock that went back adds nothing (x/time/rate's advance), rather than taking tokens away.
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._last) * self.qps)
        self._last = now
        return now

    def reserve(self) -> float:
        """Take one token; return the delay in seconds before the caller may proceed."""
        now = self._advance()
        self._tokens -= 1.0
        delay = 0.0 if self._tokens >= 0 else -self._tokens / self.qps
        self._last_event = now + delay
        return delay

    def allow(self) -> bool:
        """Take a token only if one is there now (rate.Limiter.Allow): a refusal spends nothing."""
        self._advance()
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        self._last_event = self._last
        return True

    def cancel(self, time_to_act: float) -> None:
        """Give back a reservation that will not be used, as rate.Reservation.CancelAt does.

        A reservation already due keeps its token, and so do the tokens that reservations
        made after it have counted on: only what nobody behind it needs is restored.
        """
        now = self._clock()
        if time_to_act < now:
            return
        restore = 1.0 - (self._last_event - time_to_act) * self.qps
        if restore <= 0:
            return
        self._advance()
        self._tokens = min(self.burst, self._tokens + restore)
        if time_to_act == self._last_event and time_to_act - 1.0 / self.qps >= now:
            self._last_event = time_to_act - 1.0 / self.qps

    async def wait(self) -> float:
        """Block until a token is available; return how long we waited.

        A wait cancelled (its request's deadline, a shutdown) gives its token back, as client-go's
        Wait does when its context ends, so it does not delay the requests queued behind it.
        """
        delay = self.reserve()
        if delay > 0:
            time_to_act = self._last_event
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                self.cancel(time_to_act)
                raise
        return delay


# client-go's rest.DefaultQPS and DefaultBurst, which a REST client takes for a QPS or burst of 0.
DEFAULT_QPS = 5.0
DEFAULT_BURST = 10


def client_rate_limiter(qps: float, burst: int) -> TokenBucket | None:
    """A REST client's limiter as client-go makes it: 0 takes the default, a negative QPS none, and
    an infinite one none (Go's rate.Inf allows every request)."""
    qps, burst = qps or DEFAULT_QPS, burst or DEFAULT_BURST
    return TokenBucket(qps, burst) if 0 < qps < math.inf else None
