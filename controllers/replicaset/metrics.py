"""ReplicaSet controller metrics, named as KCM's pkg/controller/replicaset/metrics (both ALPHA)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from pykcm.util.metricopts import ALPHA, kcm_help

sorting_deletion_age_ratio = Histogram(
    "replicaset_controller_sorting_deletion_age_ratio",
    kcm_help(ALPHA, "The ratio of chosen deleted pod's ages to the current youngest pod's age (at the time). Should "
             "be <2. The intent of this metric is to measure the rough efficacy of the LogarithmicScaleDown feature "
             "gate's effect on the sorting (and deletion) of pods when a replicaset scales down. This only considers "
             "Ready pods when calculating and reporting."),
    buckets=(0.25, 0.5, 1.0, 2.0, 4.0, 8.0),
)
stale_sync_skips = Counter(
    "replicaset_controller_stale_sync_skips",  # exposed as ..._total
    kcm_help(ALPHA, "Total number of ReplicaSet syncs skipped due to a stale watch cache."),
    ["group", "resource"],
)
