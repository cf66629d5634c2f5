"""Reflector and informer metrics: client-go's informer families (by informer name and group,
version, resource, as KCM names them) and pykcm's own (by resource)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

from pykcm.util.metricopts import ALPHA, kcm_help
from pykcm.util.promlabels import Children

disable_created_metrics()

# client-go's `name` label is the informer factory's name: KCM's is "kube-controller-manager".
INFORMER_NAME = "pykcm"
_CLIENT_GO_LABELS = ["name", "group", "version", "resource"]

# client-go's FIFO families, ALPHA in component-base (metrics/prometheus/clientgo/fifo).
informer_queued_items = Gauge(
    "informer_queued_items", kcm_help(ALPHA, "Number of items currently queued in the FIFO."), _CLIENT_GO_LABELS
)
informer_processing_latency = Histogram(
    "informer_processing_latency_seconds",
    kcm_help(ALPHA, "Time taken to process events after popping from the queue."),
    _CLIENT_GO_LABELS, buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
informer_store_resource_version = Gauge(
    "informer_store_resource_version",
    kcm_help(ALPHA, "The 15 least significant digits of the resource version of the store."), _CLIENT_GO_LABELS,
)

informer_events = Counter(
    "pykcm_informer_events_total", "Watch events received, by resource and event type.", ["resource", "type"]
)
informer_relists = Counter("pykcm_informer_relists_total", "Full states a reflector got, streamed or listed.",
                           ["resource"])
informer_objects = Gauge("pykcm_informer_objects", "Objects held in an informer's cache.", ["resource"])

# Memoised children for every watch event (see promlabels).
informer_events_by = Children(informer_events)
informer_objects_by = Children(informer_objects)


def store_resource_version_value(rv: str) -> int | None:
    """client-go's gauge value: the last 15 digits, below 2^53 so a float holds them exactly."""
    return int(rv[-15:]) if rv.isdigit() else None
