"""Prometheus collectors under the names client-go and component-base use.

Label values are queue names, controller names, resources, verbs, hosts and HTTP codes:
never object names, so cardinality stays bounded however many objects exist.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING
from weakref import WeakSet

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from pykcm.workqueue import Queue

disable_created_metrics()

# component-base/metrics/prometheus/workqueue: ExponentialBuckets(10e-9, 10, 10)
WORKQUEUE_BUCKETS = tuple(10e-9 * 10**i for i in range(10))
# component-base/metrics/prometheus/restclient
REST_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)

workqueue_depth = Gauge("workqueue_depth", "Current depth of workqueue", ["name"])
workqueue_adds = Counter("workqueue_adds_total", "Total number of adds handled by workqueue", ["name"])
workqueue_queue_duration = Histogram(
    "workqueue_queue_duration_seconds",
    "How long in seconds an item stays in workqueue before being requested.",
    ["name"],
    buckets=WORKQUEUE_BUCKETS,
)
workqueue_work_duration = Histogram(
    "workqueue_work_duration_seconds",
    "How long in seconds processing an item from workqueue takes.",
    ["name"],
    buckets=WORKQUEUE_BUCKETS,
)
workqueue_retries = Counter("workqueue_retries_total", "Total number of retries handled by workqueue", ["name"])

rest_client_requests = Counter(
    "rest_client_requests_total",
    "Number of HTTP requests, partitioned by status code, method, and host.",
    ["code", "method", "host"],
)
rest_client_request_duration = Histogram(
    "rest_client_request_duration_seconds",
    "Request latency in seconds. Broken down by verb, and host.",
    ["verb", "host"],
    buckets=REST_BUCKETS,
)
rest_client_rate_limiter_duration = Histogram(
    "rest_client_rate_limiter_duration_seconds",
    "Client side rate limiter latency in seconds. Broken down by verb, and host.",
    ["verb", "host"],
    buckets=REST_BUCKETS,
)

# component-base/metrics/prometheus/clientgo/leaderelection; `name` is the Lease name.
leader_election_master_status = Gauge(
    "leader_election_master_status",
    "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. "
    "'name' is the string used to identify the lease. Please make sure to group by name.",
    ["name"],
)
leader_election_slowpath = Counter(
    "leader_election_slowpath_total",
    "Total number of slow path exercised in renewing leader leases. "
    "'name' is the string used to identify the lease. Please make sure to group by name.",
    ["name"],
)
running_managed_controllers = Gauge(
    "running_managed_controllers",
    "Indicates where instances of a controller are currently running",
    ["name", "manager"],
)

controller_sync_duration = Histogram(
    "pykcm_controller_sync_duration_seconds",
    "Duration of one sync(key) call, by controller and result.",
    ["controller", "result"],
    buckets=REST_BUCKETS,
)
controller_sync_errors = Counter(
    "pykcm_controller_sync_errors_total", "Syncs that returned an error and were re-queued.", ["controller"]
)
informer_events = Counter(
    "pykcm_informer_events_total", "Watch events received, by resource and event type.", ["resource", "type"]
)
informer_relists = Counter("pykcm_informer_relists_total", "Full LISTs performed by a reflector.", ["resource"])
informer_resource_version = Gauge(
    "pykcm_informer_last_resource_version", "Last resourceVersion a reflector synced to.", ["resource"]
)
informer_objects = Gauge("pykcm_informer_objects", "Objects held in an informer's cache.", ["resource"])


class _WorkQueueProgress(Collector):
    """Unfinished-work gauges computed at scrape time from every live named queue."""

    def __init__(self) -> None:
        self.queues: WeakSet[Queue] = WeakSet()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        unfinished = GaugeMetricFamily(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has done that is in progress and hasn't been observed by "
            "work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by "
            "observing the rate at which this increases.",
            labels=["name"],
        )
        longest = GaugeMetricFamily(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
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
