"""Token bucket shared by the API client (QPS/burst) and the work queue's overall limiter.

Semantics follow golang.org/x/time/rate as client-go uses it: a reservation always
succeeds and returns how long the caller must wait, so tokens may go negative and
callers queue up in arrival order.
"""

from __future__ import annotations

import asyncio
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

    def reserve(self) -> float:
        """Take one token; return the delay in seconds before the caller may proceed."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def undo(self) -> None:
        """Give back the token of the last reservation (the caller decided not to proceed)."""
        self._tokens = min(self.burst, self._tokens + 1.0)

    async def wait(self) -> float:
        """Block until a token is available; return how long we waited."""
        delay = self.reserve()
        if delay > 0:
            await asyncio.sleep(delay)
        return delay


# client-go's rest.DefaultQPS and DefaultBurst, which a REST client takes for a QPS or burst of 0.
DEFAULT_QPS = 5.0
DEFAULT_BURST = 10


def client_rate_limiter(qps: float, burst: int) -> TokenBucket | None:
    """A REST client's limiter as client-go makes it: 0 takes the default, a negative QPS none."""
    qps, burst = qps or DEFAULT_QPS, burst or DEFAULT_BURST
    return TokenBucket(qps, burst) if qps > 0 else None
