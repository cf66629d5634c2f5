"""How a ReplicaSet grows and shrinks: slow-start creation batches and the choice of victims.

- `slow_start_batch`: call `create` `count` times in batches of 1, 2, 4, ... run concurrently;
  stop after the first batch with a failure, so a quota denial costs one doomed call, not 500.
- `pods_to_delete`: the `n` pods best given up, by KCM's ranking (`podutil.sort_for_deletion`)
  where a pod's rank is the number of active related pods on its node. It reads every active and
  related pod (10,000 for a large ReplicaSet) and hands the event loop back as it goes.
- `related_pods`: those related pods, the ones selected by any ReplicaSet sharing the controller
  (a Deployment's revisions): a scan of their namespaces, which hands the loop back too.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from pykcm.controller.podutil import is_pod_active, is_pod_ready, sort_for_deletion
from pykcm.controller.selectors import Selector, SelectorError
from pykcm.informers.store import Obj
from pykcm.util.apitime import parse_time
from pykcm.util.timeslice import TimeSlice

from .metrics import sorting_deletion_age_ratio

SLOW_START_INITIAL_BATCH_SIZE = 1


def slow_start_batch_sizes(count: int, initial: int = SLOW_START_INITIAL_BATCH_SIZE) -> list[int]:
    """The batch sizes for `count` calls if all succeed: 1, 2, 4, ... and the remainder."""
    sizes, remaining, size = [], count, min(count, initial)
    while size > 0:
        sizes.append(size)
        remaining -= size
        size = min(2 * size, remaining)
    return sizes


async def slow_start_batch(
    count: int, create: Callable[[], Awaitable[None]], initial: int = SLOW_START_INITIAL_BATCH_SIZE
) -> tuple[int, BaseException | None]:
    """(successful calls, first error). Batches after a failing one are never started."""
    successes = 0
    for size in slow_start_batch_sizes(count, initial):
        results = await asyncio.gather(*(create() for _ in range(size)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for err in errors:
            if not isinstance(err, Exception):
                raise err  # cancellation and the like are not creation failures
        successes += size - len(errors)
        if errors:
            return successes, errors[0]
    return successes, None


async def related_pods(
    siblings: Iterable[Obj], selector_of: Callable[[Obj], Selector], pods_in: Callable[[str], Iterable[Obj]]
) -> list[Obj]:
    """Pods selected by any of `siblings` (an invalid selector selects none), read from
    `pods_in(namespace)`: one pass over each namespace whatever the number of siblings, each pod
    matched once (so never "owned by both", KCM's V(5) line), the loop handed back as it goes
    (10,000 pods take ~0.1 s)."""
    selectors: dict[str, list[Selector]] = {}
    for sibling in siblings:
        try:
            selectors.setdefault(sibling["metadata"]["namespace"], []).append(selector_of(sibling))
        except SelectorError:
            continue
    related, time_slice = [], TimeSlice()
    for namespace, matchers in selectors.items():
        for pod in pods_in(namespace):  # a copy: the cache may change meanwhile
            labels = pod["metadata"].get("labels")
            if any(selector.matches(labels) for selector in matchers):
                related.append(pod)
            if time_slice.over():
                await time_slice.pause()
    return related


async def ranks_by_colocated_related_pods(pods: Sequence[Obj], related: Iterable[Obj]) -> list[int]:
    """For each pod, how many active related pods share its node ("" for unscheduled too)."""
    on_node: dict[str, int] = {}
    time_slice = TimeSlice()
    for pod in related:
        if is_pod_active(pod):
            node = (pod.get("spec") or {}).get("nodeName", "")
            on_node[node] = on_node.get(node, 0) + 1
        if time_slice.over():
            await time_slice.pause()
    ranks: list[int] = []
    for pod in pods:
        ranks.append(on_node.get((pod.get("spec") or {}).get("nodeName", ""), 0))
        if time_slice.over():
            await time_slice.pause()
    return ranks


async def pods_to_delete(
    active: Sequence[Obj], related: Iterable[Obj], count: int, now: float | None = None, *,
    use_deletion_cost: bool = True,
) -> list[Obj]:
    """The `count` pods to delete; all of them, unsorted, if `count` covers every pod. `use_deletion_cost`
    False (KCM's PodDeletionCost gate off) leaves the pod-deletion-cost annotation out of the ranking."""
    if count >= len(active):
        return list(active)[:count]
    now = time.time() if now is None else now
    # Pods that tie keep their input order through the stable sort: shuffled first, ties are broken
    # at random on every sync as KCM's (its indexer hands them out in Go's map order), so a delete
    # refused for some tied pods (an admission policy) does not keep the others from being tried.
    active = random.sample(active, len(active))
    ranks = await ranks_by_colocated_related_pods(active, related)
    ranked = await sort_for_deletion(active, ranks, now, use_deletion_cost=use_deletion_cost)
    await _report_deletion_age_ratio(ranked, count, now)
    return ranked[:count]


async def _report_deletion_age_ratio(ranked: Sequence[Obj], count: int, now: float) -> None:
    """Age of each deleted Ready pod over the youngest Ready pod's age (integer ms division, as KCM)."""
    youngest: float | None = None
    time_slice = TimeSlice()
    for pod in ranked:
        created = _created(pod) if is_pod_ready(pod) else None
        if created is not None and (youngest is None or created > youngest):
            youngest = created
        if time_slice.over():
            await time_slice.pause()
    if youngest is None:
        return
    youngest_age_ms = int((now - youngest) * 1000)
    if youngest_age_ms <= 0:
        return
    for pod in ranked[:count]:
        created = _created(pod)
        if is_pod_ready(pod) and created is not None:
            sorting_deletion_age_ratio.observe(float(int((now - created) * 1000) // youngest_age_ms))
        if time_slice.over():
            await time_slice.pause()


def _created(pod: Obj) -> float | None:
    return parse_time(pod["metadata"].get("creationTimestamp"))
