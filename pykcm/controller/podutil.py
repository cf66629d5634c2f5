"""Pod predicates and the order in which a controller gives pods up.

From KCM's pkg/api/v1/pod/util.go and pkg/controller/controller_utils.go: active, terminating,
ready and available pods; when the next pod becomes available; and `ActivePodsWithRanks`, the
comparator that puts the pods best deleted first. Times are Unix seconds (floats); API
timestamps are parsed with `parse_time`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any

from pykcm.informers.projection import Projection
from pykcm.informers.store import Obj
from pykcm.util.apitime import parse_time

POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
_PHASE_ORDINAL = {"Pending": 0, "Unknown": 1, "Running": 2}  # any other phase counts as Pending
_INT32 = (-(2**31), 2**31 - 1)

# Every field of a pod the functions of this module read, as a projection (informers/projection.py)
# for the pod informer of a controller that uses them: about a tenth of a full pod.
POD_FIELDS: Projection = {
    "kind": True,
    "apiVersion": True,
    "metadata": {
        "name": True,
        "namespace": True,
        "uid": True,
        "resourceVersion": True,
        "creationTimestamp": True,
        "deletionTimestamp": True,
        "annotations": {POD_DELETION_COST: True},
    },
    "spec": {"nodeName": True, "initContainers": {"name": True, "restartPolicy": True}},
    "status": {
        "phase": True,
        "conditions": {"type": True, "status": True, "lastTransitionTime": True},
        "containerStatuses": {"restartCount": True},
        "initContainerStatuses": {"name": True, "restartCount": True},
    },
}


# -- lifecycle --------------------------------------------------------------------------------------


def phase(pod: Obj) -> str:
    return (pod.get("status") or {}).get("phase", "")


def is_pod_terminal(pod: Obj) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def is_pod_active(pod: Obj) -> bool:
    """Counts toward replicas: not finished and not being deleted."""
    return not is_pod_terminal(pod) and pod["metadata"].get("deletionTimestamp") is None


def is_pod_terminating(pod: Obj) -> bool:
    """Being deleted but not yet finished (status.terminatingReplicas)."""
    return not is_pod_terminal(pod) and pod["metadata"].get("deletionTimestamp") is not None


# -- readiness --------------------------------------------------------------------------------------


def ready_condition(pod: Obj) -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond
    return None


def is_pod_ready(pod: Obj) -> bool:
    cond = ready_condition(pod)
    return cond is not None and cond.get("status") == "True"


def ready_since(pod: Obj) -> float | None:
    """When a Ready pod last became Ready; None if not ready or the time is unknown."""
    return _ready_time(pod) if is_pod_ready(pod) else None


def is_pod_available(pod: Obj, min_ready_seconds: int, now: float) -> bool:
    """Ready for at least `min_ready_seconds` (inclusive) as of `now`."""
    if not is_pod_ready(pod):
        return False
    if min_ready_seconds == 0:
        return True
    since = ready_since(pod)
    return since is not None and since + min_ready_seconds <= now


def next_availability_check(pod: Obj, min_ready_seconds: int, now: float) -> float | None:
    """Seconds until this Ready pod becomes available, or None (not ready, or already available)."""
    if min_ready_seconds <= 0:
        return None
    since = ready_since(pod)
    if since is None:
        return None
    remaining = since + min_ready_seconds - now
    return remaining if remaining > 0 else None


def min_next_availability_check(
    pods: Iterable[Obj], min_ready_seconds: int, evaluated_at: float, now: float
) -> float | None:
    """When to look again so the earliest not-yet-available pod is counted (FindMinNextPodAvailabilityCheck).

    The candidate is chosen as of `evaluated_at` (when status was computed); the delay is then
    recomputed for that pod as of `now`, falling back to 0 if it became due in between.
    """
    best: tuple[float, Obj] | None = None
    for pod in pods:
        delay = next_availability_check(pod, min_ready_seconds, evaluated_at)
        if delay is not None and (best is None or delay < best[0]):
            best = (delay, pod)
    if best is None:
        return None
    refreshed = next_availability_check(best[1], min_ready_seconds, now)
    return refreshed if refreshed is not None else 0.0


# -- deletion ranking -------------------------------------------------------------------------------


def deletion_cost(pod: Obj) -> int:
    """The pod-deletion-cost annotation as int32; missing or invalid counts as 0."""
    value = (pod["metadata"].get("annotations") or {}).get(POD_DELETION_COST)
    if value is None:
        return 0
    # Go's rule: no "+" sign and no leading zeros ("0" itself is fine).
    if not value or not value.isascii() or not (value[0] == "-" or value == "0" or "1" <= value[0] <= "9"):
        return 0  # isascii: Python's int() also reads other scripts' digits, Go's ParseInt not
    try:
        cost = int(value, 10)
    except ValueError:
        return 0
    return cost if _INT32[0] <= cost <= _INT32[1] and value.lstrip("-").isdigit() else 0


def max_container_restarts(pod: Obj) -> tuple[int, int]:
    """(highest restartCount of regular containers, highest of sidecar init containers)."""
    status = pod.get("status") or {}
    regular = max((c.get("restartCount", 0) for c in status.get("containerStatuses") or ()), default=0)
    sidecars = {
        c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or () if c.get("restartPolicy") == "Always"
    }
    sidecar = max(
        (c.get("restartCount", 0) for c in status.get("initContainerStatuses") or () if c.get("name") in sidecars),
        default=0,
    )
    return regular, sidecar


_MAX_DURATION_NS = 2**63 - 1


def _log2_bucket(t: float, now: float) -> int:
    """floor(log2(now - t)) with the age in nanoseconds, -1 for a future or current time. Go's
    time.Sub saturates at the largest Duration (about 292 years), so older ages share one bucket."""
    age_ns = min((now - t) * 1e9, _MAX_DURATION_NS)
    return int(math.log2(age_ns)) if age_ns > 0 else -1


def _newer_first(t1: float | None, t2: float | None, uid1: str, uid2: str, now: float | None) -> bool:
    """Less for rules 6 and 8: a zero time counts as newest; with `now`, ages compare in log2
    buckets and equal buckets fall back to the pod UID (a stable pseudo-random order)."""
    if t1 is None or t2 is None:
        return t1 is None
    if now is None:
        return t1 > t2
    diff = _log2_bucket(t1, now) - _log2_bucket(t2, now)
    if diff == 0:
        return uid1 < uid2
    return diff < 0


def _less(a: Obj, b: Obj, rank_a: int, rank_b: int, now: float | None, use_deletion_cost: bool = True) -> bool:
    """True if `a` should be deleted before `b` (ActivePodsWithRanks.Less); first differing rule wins."""
    node_a, node_b = (a.get("spec") or {}).get("nodeName", ""), (b.get("spec") or {}).get("nodeName", "")
    # 1. unscheduled before scheduled
    if node_a != node_b and (not node_a or not node_b):
        return not node_a
    # 2. Pending < Unknown < Running
    phase_a, phase_b = _PHASE_ORDINAL.get(phase(a), 0), _PHASE_ORDINAL.get(phase(b), 0)
    if phase_a != phase_b:
        return phase_a < phase_b
    # 3. not ready before ready
    ready_a, ready_b = is_pod_ready(a), is_pod_ready(b)
    if ready_a != ready_b:
        return not ready_a
    # 4. lower pod-deletion-cost first (with KCM's PodDeletionCost gate on)
    if use_deletion_cost:
        cost_a, cost_b = deletion_cost(a), deletion_cost(b)
        if cost_a != cost_b:
            return cost_a < cost_b
    # 5. more co-located related pods first
    if rank_a != rank_b:
        return rank_a > rank_b
    uid_a, uid_b = a["metadata"].get("uid", ""), b["metadata"].get("uid", "")
    # 6. both ready: ready for a shorter time first
    if ready_a and ready_b:
        since_a, since_b = _ready_time(a), _ready_time(b)
        if since_a != since_b:
            return _newer_first(since_a, since_b, uid_a, uid_b, now)
    # 7. more container restarts first
    restarts_a, restarts_b = max_container_restarts(a), max_container_restarts(b)
    if restarts_a != restarts_b:
        return restarts_a > restarts_b
    # 8. newer first
    created_a = parse_time(a["metadata"].get("creationTimestamp"))
    created_b = parse_time(b["metadata"].get("creationTimestamp"))
    if created_a != created_b:
        return _newer_first(created_a, created_b, uid_a, uid_b, now)
    return False


def _ready_time(pod: Obj) -> float | None:
    cond = ready_condition(pod)
    return parse_time(cond.get("lastTransitionTime")) if cond is not None else None


def sort_for_deletion(
    pods: Sequence[Obj], ranks: Sequence[int], now: float | None, *, use_deletion_cost: bool = True
) -> list[Obj]:
    """`pods` ordered best-to-delete first. `ranks[i]` is the number of related active pods on
    pod i's node; `now` enables the logarithmic age comparison (None compares exact times);
    `use_deletion_cost` False leaves the pod-deletion-cost annotation out (KCM's PodDeletionCost off)."""
    indexed = list(range(len(pods)))

    def compare(i: int, j: int) -> int:
        if _less(pods[i], pods[j], ranks[i], ranks[j], now, use_deletion_cost):
            return -1
        if _less(pods[j], pods[i], ranks[j], ranks[i], now, use_deletion_cost):
            return 1
        return 0

    indexed.sort(key=functools.cmp_to_key(compare))
    return [pods[i] for i in indexed]
