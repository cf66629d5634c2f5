"""Pod predicates and the order in which a controller gives pods up.

From KCM's pkg/api/v1/pod/util.go and pkg/controller/controller_utils.go: active, terminating,
ready and available pods; when the next pod becomes available; and `ActivePodsWithRanks`, the
comparator that puts the pods best deleted first. Times are Unix seconds (floats); API
timestamps are parsed with `parse_time`. The functions that read every pod of a controller
(10,000 for a large ReplicaSet) are async and hand the event loop back as they go: KCM runs them
on a worker goroutine, beside its informers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pykcm.informers.projection import Projection
from pykcm.informers.store import Obj
from pykcm.util.apitime import parse_time
from pykcm.util.timeslice import TimeSlice

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


async def filter_pods(pods: Iterable[Obj], keep: Callable[[Obj], bool]) -> list[Obj]:
    """The pods `keep` accepts, in order (FilterActivePods, FilterTerminatingPods, FilterClaimedPods)."""
    kept: list[Obj] = []
    time_slice = TimeSlice()
    for pod in pods:
        if keep(pod):
            kept.append(pod)
        if time_slice.over():
            await time_slice.pause()
    return kept


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


async def min_next_availability_check(
    pods: Iterable[Obj], min_ready_seconds: int, evaluated_at: float, now: Callable[[], float] = time.time
) -> float | None:
    """When to look again so the earliest not-yet-available pod is counted (FindMinNextPodAvailabilityCheck).

    The candidate is chosen as of `evaluated_at` (when status was computed); the delay is then
    recomputed for that pod as of `now()`, read after the scan as KCM's clock, falling back to 0
    if it became due in between.
    """
    best: tuple[float, Obj] | None = None
    time_slice = TimeSlice()
    for pod in pods:
        delay = next_availability_check(pod, min_ready_seconds, evaluated_at)
        if delay is not None and (best is None or delay < best[0]):
            best = (delay, pod)
        if time_slice.over():
            await time_slice.pause()
    if best is None:
        return None
    refreshed = next_availability_check(best[1], min_ready_seconds, now())
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


def _newer_first(t1: float | None, t2: float | None, buckets: tuple[int, int], uids: tuple[str, str],
                 by_age_bucket: bool) -> bool:
    """Less for rules 6 and 8: a zero time counts as newest; `by_age_bucket`, ages compare in their
    log2 `buckets` and equal buckets fall back to the pod UID (a stable pseudo-random order)."""
    if t1 is None or t2 is None:
        return t1 is None
    if not by_age_bucket:
        return t1 > t2
    if buckets[0] == buckets[1]:
        return uids[0] < uids[1]
    return buckets[0] < buckets[1]


@dataclass(slots=True, eq=False)
class _Ranked:
    """What ActivePodsWithRanks.Less reads of one pod, worked out once per sort: a comparison then
    reads fields instead of parsing timestamps (a sort makes n log n of them, on the event loop)."""

    pod: Obj
    scheduled: bool
    phase: int
    ready: bool
    cost: int
    rank: int
    uid: str
    ready_since: float | None
    ready_bucket: int
    restarts: tuple[int, int]
    created: float | None
    created_bucket: int
    by_age_bucket: bool  # a `now` was given: KCM's LogarithmicScaleDown

    @classmethod
    def of(cls, pod: Obj, rank: int, now: float | None, use_deletion_cost: bool) -> _Ranked:
        ready = is_pod_ready(pod)
        since = _ready_time(pod) if ready else None
        created = parse_time(pod["metadata"].get("creationTimestamp"))
        return cls(
            pod=pod,
            scheduled=bool((pod.get("spec") or {}).get("nodeName", "")),
            phase=_PHASE_ORDINAL.get(phase(pod), 0),
            ready=ready,
            cost=deletion_cost(pod) if use_deletion_cost else 0,
            rank=rank,
            uid=pod["metadata"].get("uid", ""),
            ready_since=since,
            ready_bucket=_log2_bucket(since, now) if since is not None and now is not None else 0,
            restarts=max_container_restarts(pod),
            created=created,
            created_bucket=_log2_bucket(created, now) if created is not None and now is not None else 0,
            by_age_bucket=now is not None,
        )

    def __lt__(self, other: _Ranked) -> bool:
        """True if this pod should be deleted before `other` (ActivePodsWithRanks.Less): the first
        differing rule wins. A sort calls only this, so it orders as a comparator built on it would."""
        a, b = self, other
        # 1. unscheduled before scheduled
        if a.scheduled != b.scheduled:
            return not a.scheduled
        # 2. Pending < Unknown < Running
        if a.phase != b.phase:
            return a.phase < b.phase
        # 3. not ready before ready
        if a.ready != b.ready:
            return not a.ready
        # 4. lower pod-deletion-cost first (with KCM's PodDeletionCost gate on; 0 for all with it off)
        if a.cost != b.cost:
            return a.cost < b.cost
        # 5. more co-located related pods first
        if a.rank != b.rank:
            return a.rank > b.rank
        # 6. both ready: ready for a shorter time first
        if a.ready and b.ready and a.ready_since != b.ready_since:
            return _newer_first(a.ready_since, b.ready_since, (a.ready_bucket, b.ready_bucket), (a.uid, b.uid),
                                a.by_age_bucket)
        # 7. more container restarts first
        if a.restarts != b.restarts:
            return a.restarts > b.restarts
        # 8. newer first
        if a.created != b.created:
            return _newer_first(a.created, b.created, (a.created_bucket, b.created_bucket), (a.uid, b.uid),
                                a.by_age_bucket)
        return False


def _ready_time(pod: Obj) -> float | None:
    cond = ready_condition(pod)
    return parse_time(cond.get("lastTransitionTime")) if cond is not None else None


async def sort_for_deletion(
    pods: Sequence[Obj], ranks: Sequence[int], now: float | None, *, use_deletion_cost: bool = True
) -> list[Obj]:
    """`pods` ordered best-to-delete first. `ranks[i]` is the number of related active pods on
    pod i's node; `now` enables the logarithmic age comparison (None compares exact times);
    `use_deletion_cost` False leaves the pod-deletion-cost annotation out (KCM's PodDeletionCost off)."""
    ranked: list[_Ranked] = []
    time_slice = TimeSlice()
    for pod, rank in zip(pods, ranks, strict=True):
        ranked.append(_Ranked.of(pod, rank, now, use_deletion_cost))
        if time_slice.over():
            await time_slice.pause()

    return [r.pod for r in await _sorted_handing_back(ranked, time_slice)]


_SORT_RUN = 1024  # pods one sorted() call orders: about 5 ms with the Python __lt__


async def _sorted_handing_back(items: list[_Ranked], time_slice: TimeSlice) -> list[_Ranked]:
    """sorted(items) that hands the loop back: one sorted() call of 10,000 pods holds it ~0.15 s,
    so runs are sorted a turn each, then merged pairwise. The merge is stable, taking the later
    run's item only when strictly less, so the order is sorted()'s wherever __lt__ is consistent."""
    runs = []
    for start in range(0, len(items), _SORT_RUN):
        await time_slice.pause()
        runs.append(sorted(items[start:start + _SORT_RUN]))
    while len(runs) > 1:
        merged = []
        for first, second in zip(runs[::2], runs[1::2], strict=False):
            run: list[_Ranked] = []
            i = j = 0
            while i < len(first) and j < len(second):
                if second[j] < first[i]:
                    run.append(second[j])
                    j += 1
                else:
                    run.append(first[i])
                    i += 1
                if time_slice.over():
                    await time_slice.pause()
            merged.append(run + first[i:] + second[j:])
        runs = merged + runs[len(merged) * 2:]
    return runs[0] if runs else []
