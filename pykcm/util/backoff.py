"""Jittered exponential backoff, as k8s.io/apimachinery/pkg/util/wait."""

from __future__ import annotations

import random
import time


def jitter(duration: float, max_factor: float) -> float:
    """A random duration in [duration, duration * (1 + max_factor))."""
    return duration + random.random() * max_factor * duration if max_factor > 0 else duration


class Backoff:
    """Delays `initial`, x`factor` ... up to `cap`, each jittered; reset after `reset_after` quiet seconds."""

    def __init__(
        self, initial: float, cap: float, factor: float = 2.0, jitter: float = 1.0, reset_after: float = 120.0,
        clock=time.monotonic,
    ) -> None:
        self.initial, self.cap, self.factor, self.jitter, self.reset_after = initial, cap, factor, jitter, reset_after
        self._clock = clock
        self._current = 0.0
        self._last = 0.0

    def next(self) -> float:
        now = self._clock()
        if self._current == 0.0 or now - self._last > self.reset_after:
            self._current = self.initial
        else:
            self._current = min(self._current * self.factor, self.cap)
        self._last = now
        return jitter(self._current, self.jitter)

    def reset(self) -> None:
        self._current = 0.0
