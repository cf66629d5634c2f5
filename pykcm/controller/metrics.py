"""Per-controller sync metrics, recorded by the worker loop every controller shares."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

from pykcm.client.metrics import REST_BUCKETS
from pykcm.util.promlabels import Children

disable_created_metrics()

controller_sync_duration = Histogram(
    "pykcm_controller_sync_duration_seconds",
    "Duration of one sync(key) call, by controller and result.",
    ["controller", "result"],
    buckets=REST_BUCKETS,
)
controller_sync_errors = Counter(
    "pykcm_controller_sync_errors_total", "Syncs that returned an error and were re-queued.", ["controller"]
)
controller_stuck = Gauge(
    "pykcm_controller_stuck",
    "1 while a controller looks stuck: one sync running over 10 minutes, or keys queued and no sync "
    "finished for 5 minutes; else 0.",
    ["controller"],
)

# Memoised children for every sync (see promlabels).
controller_sync_duration_by = Children(controller_sync_duration)
controller_sync_errors_by = Children(controller_sync_errors)
