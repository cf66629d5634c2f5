"""Facts about this process that more than one layer reports."""

from __future__ import annotations

import functools
import time

from prometheus_client import ProcessCollector

_IMPORTED = time.time()


@functools.cache
def process_start_time() -> float:
    """When this process started, in seconds since the epoch, as prometheus_client reads /proc."""
    for family in ProcessCollector(registry=None).collect():
        if family.name == "process_start_time_seconds":
            return family.samples[0].value
    return _IMPORTED  # no /proc: near enough
