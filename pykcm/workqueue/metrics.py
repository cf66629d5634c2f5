"""Work queue metrics under client-go's names (component-base/metrics/prometheus/workqueue).

Label values are queue names, so cardinality stays bounded however many objects exist.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from typing import Protocol
from weakref import WeakSet

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pykcm.util.metricopts import BETA, exponential_buckets, kcm_help

disable_created_metrics()

WORKQUEUE_BUCKETS = exponential_buckets(10e-9, 10, 10)

# Every workqueue family is BETA in component-base.
workqueue_depth = Gauge("workqueue_depth", kcm_help(BETA, "Current depth of workqueue"), ["name"])
workqueue_adds = Counter("workqueue_adds_total", kcm_help(BETA, "Total number of adds handled by workqueue"), ["name"])
workqueue_queue_duration = Histogram(
    "workqueue_queue_duration_seconds",
    kcm_help(BETA, "How long in seconds an item stays in workqueue before being requested."),
    ["name"],
    buckets=WORKQUEUE_BUCKETS,
)
workqueue_work_duration = Histogram(
    "workqueue_work_duration_seconds",
    kcm_help(BETA, "How long in seconds processing an item from workqueue takes."),
    ["name"],
    buckets=WORKQUEUE_BUCKETS,
)
workqueue_retries = Counter(
    "workqueue_retries_total", kcm_help(BETA, "Total number of retries handled by workqueue"), ["name"]
)



class NoMetrics:
    """What an unnamed queue reports: nothing."""

    def add(self, item: Hashable) -> None:
        pass

    def get(self, item: Hashable) -> None:
        pass

    def done(self, item: Hashable) -> None:
        pass

    def retry(self) -> None:
        pass

    def processing_start_times(self) -> list[float]:
        return []


class QueueMetrics(NoMetrics):
    """client-go's defaultQueueMetrics: depth, adds, time queued, time worked, retries.

    Depth counts dirty items (incremented on every accepted add, decremented on get), so an
    item re-added while it is being processed counts as waiting even before done() requeues it.
    """

    def __init__(self, name: str, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._depth = workqueue_depth.labels(name)
        self._adds = workqueue_adds.labels(name)
        self._queue_duration = workqueue_queue_duration.labels(name)
        self._work_duration = workqueue_work_duration.labels(name)
        self._retries = workqueue_retries.labels(name)
        self._add_times: dict[Hashable, float] = {}
        self._start_times: dict[Hashable, float] = {}

    def add(self, item: Hashable) -> None:
        self._adds.inc()
        self._depth.inc()
        self._add_times.setdefault(item, self._clock())

    def get(self, item: Hashable) -> None:
        now = self._clock()
        self._depth.dec()
        added = self._add_times.pop(item, None)
        if added is not None:
            self._queue_duration.observe(now - added)
        self._start_times[item] = now

    def done(self, item: Hashable) -> None:
        started = self._start_times.pop(item, None)
        if started is not None:
            self._work_duration.observe(self._clock() - started)

    def retry(self) -> None:
        self._retries.inc()

    def processing_start_times(self) -> list[float]:
        # A copy: the scrape's collector iterates it while workers may start or finish items.
        return list(self._start_times.values())


class ProcessingQueue(Protocol):
    """What the progress collector reads from a named queue."""

    name: str

    def processing_start_times(self) -> list[float]: ...


class _WorkQueueProgress(Collector):
    """Unfinished-work gauges computed at scrape time from every live named queue."""

    def __init__(self) -> None:
        self.queues: WeakSet[ProcessingQueue] = WeakSet()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        unfinished = GaugeMetricFamily(
            "workqueue_unfinished_work_seconds",
            kcm_help(BETA, "How many seconds of work has done that is in progress and hasn't been observed by "
                     "work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads "
                     "by observing the rate at which this increases."),
            labels=["name"],
        )
        longest = GaugeMetricFamily(
            "workqueue_longest_running_processor_seconds",
            kcm_help(BETA, "How many seconds has the longest running processor for workqueue been running."),
            labels=["name"],
        )
        now = time.monotonic()
        # Grouped by name: two live queues with one name (an old manager's, not yet collected) must
        # not produce duplicate series, which Prometheus rejects.
        running: dict[str, list[float]] = {}
        for queue in list(self.queues):
            running.setdefault(queue.name, []).extend(now - s for s in queue.processing_start_times())
        for name, durations in running.items():
            unfinished.add_metric([name], sum(durations))
            longest.add_metric([name], max(durations, default=0.0))
        yield unfinished
        yield longest

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []


workqueue_progress = _WorkQueueProgress()
REGISTRY.register(workqueue_progress)
