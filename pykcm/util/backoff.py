"""Jittered exponential backoff, as k8s.io/apimachinery/pkg/util/wait."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable


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


class BackoffManager:
    """wait.Backoff{initial, factor, jitter, cap}.DelayWithReset(clock, reset_interval), as the
    reflector uses it: each `next()` is one step of the sequence (jittered per step); the
    sequence starts over when `reset_interval` has passed since it last (re)started, however
    recent the last step. Steps are ceil(cap / initial), as client-go's reflector sets them."""

    def __init__(
        self, initial: float, cap: float, factor: float = 2.0, jitter: float = 1.0, reset_interval: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial, self.cap, self.factor, self.jitter = initial, cap, factor, jitter
        self.reset_interval = reset_interval
        self._initial_steps = math.ceil(cap / initial)
        self._clock = clock
        self._duration, self._steps = initial, self._initial_steps
        self._last_start = clock()

    def next(self) -> float:
        now = self._clock()
        if now - self._last_start > self.reset_interval:
            self._duration, self._steps = self.initial, self._initial_steps
            self._last_start = now
        if self._steps < 1:  # at the cap: the duration no longer grows
            return jitter(self._duration, self.jitter)
        self._steps -= 1
        current = self._duration
        grown = current * self.factor
        if grown > self.cap:
            grown, self._steps = self.cap, 0
        self._duration = grown
        return jitter(current, self.jitter)
