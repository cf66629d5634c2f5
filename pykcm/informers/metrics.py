"""Reflector and informer metrics, by resource."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, disable_created_metrics

from pykcm.util.promlabels import Children

disable_created_metrics()

informer_events = Counter(
    "pykcm_informer_events_total", "Watch events received, by resource and event type.", ["resource", "type"]
)
informer_relists = Counter("pykcm_informer_relists_total", "Full states a reflector got, streamed or listed.",
                           ["resource"])
informer_resource_version = Gauge(
    "pykcm_informer_last_resource_version", "Last resourceVersion a reflector synced to.", ["resource"]
)
informer_objects = Gauge("pykcm_informer_objects", "Objects held in an informer's cache.", ["resource"])

# Memoised children for every watch event (see promlabels).
informer_events_by = Children(informer_events)
informer_resource_version_by = Children(informer_resource_version)
informer_objects_by = Children(informer_objects)
