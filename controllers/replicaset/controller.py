"""ReplicaSet controller: keep `spec.replicas` pods matching the selector, report status.

KCM's pkg/controller/replicaset/replica_set.go (v1.36), top to bottom:

1. Informers: ReplicaSets (indexed by their own controller's UID, to find sibling ReplicaSets
   of one Deployment) and Pods (indexed by controller, orphans by namespace, so a sync reads
   only its own pods and its adoption candidates).
2. Event handlers turn changes into `namespace/name` keys and keep the expectations: a pod add
   observes a creation, a pod delete (or deletionTimestamp) observes a deletion.
3. `sync` (syncReplicaSet): stale-cache check, read the RS from the cache, claim pods
   (adopt/release), create or delete pods if expectations are satisfied, write status.

KCM's feature gates it reads (`--feature-gates`, Options.feature_enabled), all on by default:
StaleControllerConsistencyReplicaSet (off: no stale-cache check, no write recorded),
DeploymentReplicaSetTerminatingReplicas (off: terminating pods not counted, status.terminatingReplicas
left unset) and PodDeletionCost (off: the pod-deletion-cost annotation does not rank pods for deletion).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from pykcm.client.errors import NAMESPACE_TERMINATING_CAUSE, ApiError, NotFound
from pykcm.client.resources import PODS, REPLICASETS
from pykcm.controller import KEY, Controller, ControllerContext, Line, LogLines, RequeueAfter, handle_error
from pykcm.controller.consistency import ConsistencyStore, NoopConsistencyStore, StaleCacheError
from pykcm.controller.controllerref import (
    POD_CONTROLLER_INDEX,
    PodControllerRefManager,
    filter_claimed_pods,
    get_controller_of,
    new_controller_ref,
    pod_controller_index,
    pods_by_owner,
)
from pykcm.controller.expectations import ControllerExpectations
from pykcm.controller.podcontrol import PodControl
from pykcm.controller.podutil import (
    POD_FIELDS,
    filter_pods,
    is_pod_active,
    is_pod_ready,
    is_pod_terminating,
    min_next_availability_check,
)
from pykcm.controller.selectors import Selector, SelectorError, selector_from_label_selector
from pykcm.informers.projection import union
from pykcm.informers.store import DeletedFinalStateUnknown, Obj, object_key, unwrap_tombstone
from pykcm.util.apitime import go_string
from pykcm.util.log import NIL_STRINGER, kobj, kobj_slice

from .metrics import stale_sync_skips
from .scaling import pods_to_delete, related_pods, slow_start_batch
from .status import calculate_status, min_ready_seconds, spec_replicas, update_status

KIND = "ReplicaSet"
API_VERSION = "apps/v1"
BURST_REPLICAS = 500  # most pods created or deleted by one sync
# A stale-cache skip looks again after this fixed delay. KCM sends it through the rate limiter,
# but then every skip raises the per-item backoff, a burst of pod events makes dozens of skips,
# and a quiet spell right after (an apiserver restart) leaves the key waiting for minutes.
# The event that brings the cache up to date enqueues the ReplicaSet anyway; this is the backstop.
STALE_CACHE_RETRY = 1.0
CONTROLLER_UID_INDEX = "controllerUID"
# What this controller reads of a pod: podutil's predicates and ranking, plus the labels its
# selectors match and the owner references it claims by. ReplicaSets are kept whole: a status
# update PUTs the cached object back.
CONTROLLER_POD_FIELDS = union(POD_FIELDS, {"metadata": {"labels": True, "ownerReferences": True}})


def controller_uid_index(rs: Obj) -> list[str]:
    """Index ReplicaSets by the UID of *their* controller (e.g. a Deployment)."""
    ref = get_controller_of(rs)
    return [ref["uid"]] if ref is not None and ref.get("uid") else []


def labels_of(obj: Obj) -> dict[str, str] | None:
    return obj["metadata"].get("labels")


class ReplicaSetController(Controller):
    name = "replicaset-controller"
    aliases = ("replicaset",)
    client_name = "replicaset-controller"
    queue_name = "replicaset"
    workers = 5
    workers_option = "concurrent_replicaset_syncs"
    burst_replicas = BURST_REPLICAS
    log_lines = LogLines(  # KCM's (replica_set.go)
        start=Line("Starting controller", name=KIND.lower()),
        stop=Line("Shutting down controller", name=KIND.lower()),
        failed=handle_error("Unhandled Error", err='sync "{key}" failed with {err}'),
        finished=Line("Finished syncing", kind=KIND, key=KEY),
    )

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx)
        self.replica_sets = self.informers.informer(REPLICASETS, indexers={CONTROLLER_UID_INDEX: controller_uid_index})
        self.pods = self.informers.informer(
            PODS, indexers={POD_CONTROLLER_INDEX: pod_controller_index}, fields=CONTROLLER_POD_FIELDS
        )
        self._selectors: dict[str, tuple[int, Selector | str]] = {}  # by RS uid: selector or error
        self.expectations = ControllerExpectations()
        self.consistency = NoopConsistencyStore()
        if self.options.feature_enabled("StaleControllerConsistencyReplicaSet"):
            self.consistency = ConsistencyStore(
                {REPLICASETS: self.replica_sets.last_sync_resource_version, PODS: self.pods.last_sync_resource_version}
            )
        self.count_terminating = self.options.feature_enabled("DeploymentReplicaSetTerminatingReplicas")
        self.use_deletion_cost = self.options.feature_enabled("PodDeletionCost")
        self.pod_control = PodControl(self.client, self.events, on_write=self.pod_written)
        self.replica_sets.add_event_handler(on_add=self.rs_added, on_update=self.rs_updated, on_delete=self.rs_deleted)
        self.pods.add_event_handler(on_add=self.pod_added, on_update=self.pod_updated, on_delete=self.pod_deleted)

    # -- lookups --------------------------------------------------------------------------------------

    def resolve_controller_ref(self, namespace: str, ref: dict) -> Obj | None:
        """The cached RS a controller ref points at: right kind, same name *and* same UID."""
        if ref.get("kind") != KIND:
            return None
        rs = self.replica_sets.indexer.get_by(namespace, ref.get("name", ""))
        if rs is None or rs["metadata"].get("uid") != ref.get("uid"):
            return None
        return rs

    def selector_of(self, rs: Obj) -> Selector:
        """The ReplicaSet's parsed selector (SelectorError if invalid), parsed once per generation:
        orphan events match every ReplicaSet of a namespace against the pod."""
        meta = rs["metadata"]
        uid, generation = meta.get("uid", ""), meta.get("generation", 0)
        cached = self._selectors.get(uid)
        if cached is None or cached[0] != generation:
            try:
                parsed: Selector | str = selector_from_label_selector(rs["spec"].get("selector"))
            except SelectorError as err:
                parsed = str(err)
            cached = self._selectors[uid] = (generation, parsed)
        if isinstance(cached[1], str):
            raise SelectorError(cached[1])
        return cached[1]

    def pod_replica_sets(self, pod: Obj) -> list[Obj]:
        """ReplicaSets in the pod's namespace whose (valid, non-empty) selector matches it."""
        labels = labels_of(pod)
        if not labels:
            return []
        matching = []
        for rs in self.replica_sets.indexer.in_namespace(pod["metadata"].get("namespace", "")):
            try:
                selector = self.selector_of(rs)
            except SelectorError:
                continue  # an invalid selector matches nothing
            if not selector.empty() and selector.matches(labels):
                matching.append(rs)
        if len(matching) > 1:
            # The apiserver lets only one of them become the controller; still a user error.
            shown = " ".join(f"{k}:{v}" for k, v in sorted(labels.items()))  # Go's %+v of a map
            self.log.error(f"user error! more than one ReplicaSet is selecting pods with labels: map[{shown}]",
                           "Unhandled Error", logger="UnhandledError")
        return matching

    def replica_sets_with_same_controller(self, rs: Obj) -> list[Obj]:
        """The ReplicaSets (`rs` too) whose controller is `rs`'s, none if it has none."""
        ref = get_controller_of(rs)
        if ref is None:
            # KCM's error has Go's %v of the whole ReplicaSet, which cannot be reproduced: its key instead.
            self.log.error(f"ReplicaSet has no controller: {object_key(rs)}", "Unhandled Error",
                           logger="UnhandledError")
            return []
        siblings = self.replica_sets.indexer.by_index(CONTROLLER_UID_INDEX, ref["uid"])
        if (log := self.log.v(2)).enabled():
            log.info("Found related ReplicaSets", replicaSet=kobj(rs), relatedReplicaSets=kobj_slice(siblings))
        return siblings

    # -- ReplicaSet events ----------------------------------------------------------------------------

    def rs_added(self, rs: Obj) -> None:
        self.named_log.v(4).info("Adding", replicaSet=kobj(rs))
        self.enqueue(rs)

    def rs_updated(self, old: Obj, cur: Obj) -> None:
        if old["metadata"].get("uid") != cur["metadata"].get("uid"):
            # Deleted and recreated under the same name between two events: the old one's
            # expectations must not block the new one.
            self.rs_deleted(DeletedFinalStateUnknown(object_key(old), old))
        if spec_replicas(old) != spec_replicas(cur):
            self.named_log.v(4).info(
                "replicaSet updated. Desired pod count change.",
                replicaSet=kobj(old), oldReplicas=spec_replicas(old), newReplicas=spec_replicas(cur),
            )
        # Always: a resync thereby retries a ReplicaSet whose last attempt failed.
        self.enqueue(cur)

    def rs_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        rs = unwrap_tombstone(obj)
        key = object_key(rs)
        self.named_log.v(4).info("Deleting", replicaSet=kobj(rs))
        self.consistency.clear(key, rs["metadata"].get("uid", ""))
        self.expectations.delete(key)
        self._selectors.pop(rs["metadata"].get("uid", ""), None)
        self.queue.add(key)

    # -- Pod events -----------------------------------------------------------------------------------

    def pod_added(self, pod: Obj) -> None:
        if pod["metadata"].get("deletionTimestamp") is not None:
            # Seen for the first time already terminating (e.g. after a restart): not a creation.
            self.pod_deleted(pod)
            return
        ref = get_controller_of(pod)
        if ref is not None:
            rs = self.resolve_controller_ref(pod["metadata"].get("namespace", ""), ref)
            if rs is None:
                return
            key = object_key(rs)
            if (log := self.named_log.v(4)).enabled():  # KCM's detail=<%v of the pod> left out
                log.info("Pod created", pod=kobj(pod))
            self.expectations.creation_observed(key, self.named_log)
            self.queue.add(key)
            return
        # An orphan: wake every ReplicaSet that might adopt it (no expectation waits on orphans).
        matching = self.pod_replica_sets(pod)
        if matching and (log := self.named_log.v(4)).enabled():
            log.info("Orphan Pod created", pod=kobj(pod))
        for rs in matching:
            self.enqueue(rs)

    def pod_updated(self, old: Obj, cur: Obj) -> None:
        if old["metadata"].get("resourceVersion") == cur["metadata"].get("resourceVersion"):
            return  # a resync replay; nothing changed
        labels_changed = labels_of(old) != labels_of(cur)
        if cur["metadata"].get("deletionTimestamp") is not None:
            # Graceful deletion started: replace the pod now, don't wait for it to disappear.
            self.pod_deleted(cur)
            if labels_changed:
                self.pod_deleted(old)
            return
        cur_ref, old_ref = get_controller_of(cur), get_controller_of(old)
        ref_changed = cur_ref != old_ref
        namespace = cur["metadata"].get("namespace", "")
        if ref_changed and old_ref is not None:
            previous = self.resolve_controller_ref(old["metadata"].get("namespace", ""), old_ref)
            if previous is not None:
                self.enqueue(previous)
        if cur_ref is not None:
            rs = self.resolve_controller_ref(namespace, cur_ref)
            if rs is None:
                return
            if (log := self.named_log.v(4)).enabled():  # KCM's ObjectMetas left out: ours are projected
                log.info("Pod objectMeta updated.", pod=kobj(old))
            self.enqueue(rs)
            min_ready = min_ready_seconds(rs)
            if min_ready > 0 and not is_pod_ready(old) and is_pod_ready(cur):
                # Look again when this pod should count as available.
                self.named_log.v(2).info("pod will be enqueued after a while for availability check",
                                         duration=min_ready, kind=KIND, pod=kobj(old))
                self.enqueue_after(rs, min_ready)
            return
        if labels_changed or ref_changed:
            if (matching := self.pod_replica_sets(cur)) and (log := self.named_log.v(4)).enabled():
                log.info("Orphan Pod objectMeta updated.", pod=kobj(old))
            for rs in matching:
                self.enqueue(rs)

    def pod_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        pod = unwrap_tombstone(obj)
        ref = get_controller_of(pod)
        if ref is None:
            return  # nobody waits for an orphan's deletion
        rs = self.resolve_controller_ref(pod["metadata"].get("namespace", ""), ref)
        if rs is None:
            return
        key = object_key(rs)
        if (log := self.named_log.v(4)).enabled():  # KCM's delete_by=<its Go caller> left out
            stamp = pod["metadata"].get("deletionTimestamp")  # a *metav1.Time: Go's %v, or nil's
            log.info("Pod deleted", deletion_timestamp=go_string(stamp) if stamp else NIL_STRINGER, pod=kobj(pod))
        self.expectations.deletion_observed(key, object_key(pod), self.named_log)
        self.queue.add(key)

    def pod_written(self, pod: Obj) -> None:
        """PodControl wrote `pod` for its controller: later syncs must see at least this version."""
        ref = get_controller_of(pod)
        if ref is None:
            return
        meta = pod["metadata"]
        owner_key = f"{meta.get('namespace', '')}/{ref.get('name', '')}"
        self.consistency.wrote_at(owner_key, ref.get("uid", ""), PODS, meta.get("resourceVersion", ""))

    # -- sync -----------------------------------------------------------------------------------------

    async def _ensure_caches_caught_up(self, key: str) -> None:
        """KCM's stale-cache check. KCM's informers run beside its workers; here they take turns on
        one loop, so they get one turn to apply what has arrived (most often this controller's own
        status write, re-queued by pod events during the sync) before the sync is skipped."""
        try:
            self.consistency.ensure_ready(key)
            return
        except StaleCacheError:
            await asyncio.sleep(0)
        try:
            self.consistency.ensure_ready(key)
        except StaleCacheError as err:
            stale_sync_skips.labels(err.resource.group, err.resource.plural).inc()
            raise RequeueAfter(STALE_CACHE_RETRY, error=err) from err  # logged as KCM's sync error

    async def sync(self, key: str) -> None:
        """syncReplicaSet, in KCM's order: stale-cache check, cache read, expectations, claim,
        create/delete (only with satisfied expectations and no deletionTimestamp), status write,
        then the manageReplicas error (if any) for a rate-limited retry."""
        await self._ensure_caches_caught_up(key)
        rs = self.replica_sets.indexer.get(key)
        if rs is None:
            self.log.v(4).info("deleted", kind=KIND, key=key)
            self.consistency.clear(key)
            self.expectations.delete(key)
            return
        needs_sync = self.expectations.satisfied(key)
        try:
            selector = self.selector_of(rs)
        except SelectorError as err:
            # Retrying cannot fix the spec; the next update of the ReplicaSet enqueues it again.
            self.log.error(f"error converting pod selector to selector for rs {key}: {err}", "Unhandled Error",
                           logger="UnhandledError")
            return
        # A snapshot, as KCM's lister returns: the loops below hand the event loop back, and the
        # informers may change the cache meanwhile, as KCM's run beside its worker.
        all_pods = pods_by_owner(self.pods.indexer, rs, KIND, include_orphans=True)
        active = await self.claim_pods(rs, selector, await filter_pods(all_pods, is_pod_active))
        terminating = None  # the gate off: status.terminatingReplicas unset
        if self.count_terminating:
            terminating = await filter_claimed_pods(rs, selector, await filter_pods(all_pods, is_pod_terminating))

        manage_error = None
        if needs_sync and rs["metadata"].get("deletionTimestamp") is None:
            manage_error = await self.manage_replicas(active, rs)
        evaluated_at = time.time()
        status = await calculate_status(rs, active, terminating, manage_error, evaluated_at)
        updated = await update_status(self.client, rs, status, self.log)
        written = updated["metadata"].get("resourceVersion", "")
        self.consistency.wrote_at(key, rs["metadata"]["uid"], REPLICASETS, written)
        if manage_error is not None:
            # v1.36.3 returns here, before planning the availability recheck: the rate-limited
            # retry re-evaluates availability anyway (pinned by a unit test).
            raise manage_error
        await self.schedule_availability_check(key, updated, active, evaluated_at)

    async def claim_pods(self, rs: Obj, selector: Selector, pods: list[Obj]) -> list[Obj]:
        meta = rs["metadata"]

        async def can_adopt() -> None:
            # An uncached read: our cache may still show an RS that was deleted or recreated.
            try:
                fresh = await self.client.get(REPLICASETS, meta["name"], meta["namespace"])
                if fresh["metadata"].get("uid") != meta["uid"]:
                    raise ValueError(
                        f"original {KIND} {meta['namespace']}/{meta['name']} is gone: "
                        f"got uid {fresh['metadata'].get('uid')}, wanted {meta['uid']}"
                    )
            except Exception as err:
                raise ValueError(f"can't recheck DeletionTimestamp: {err}") from err
            deleted_at = fresh["metadata"].get("deletionTimestamp")
            if deleted_at is not None:
                raise ValueError(f"{meta['namespace']}/{meta['name']} has just been deleted at {go_string(deleted_at)}")

        manager = PodControllerRefManager(rs, selector, API_VERSION, KIND, self.pod_control.patch_pod, can_adopt)
        claimed, error = await manager.claim_pods(pods)
        if error is not None:
            raise error
        return claimed

    async def schedule_availability_check(self, key: str, rs: Obj, active: Sequence[Obj], evaluated_at: float) -> None:
        """With minReadySeconds, look again when the next Ready pod becomes available."""
        min_ready = min_ready_seconds(rs)
        status = rs.get("status") or {}
        if min_ready <= 0 or status.get("readyReplicas", 0) == status.get("availableReplicas", 0):
            return
        delay = await min_next_availability_check(active, min_ready, evaluated_at)
        self.queue.add_after(key, float(min_ready) if delay is None else delay)

    # -- manageReplicas -------------------------------------------------------------------------------

    async def manage_replicas(self, active: Sequence[Obj], rs: Obj) -> BaseException | None:
        """Create or delete pods toward spec.replicas, at most `burst_replicas` per sync.

        Returns (rather than raises) the first failure: status is still written before retrying.
        """
        diff = len(active) - spec_replicas(rs)
        if diff < 0:
            return await self.create_replicas(rs, min(-diff, self.burst_replicas))
        if diff > 0:
            return await self.delete_replicas(rs, active, min(diff, self.burst_replicas))
        return None

    async def create_replicas(self, rs: Obj, count: int) -> BaseException | None:
        key = object_key(rs)
        namespace = rs["metadata"]["namespace"]
        template = rs["spec"].get("template") or {}
        controller_ref = new_controller_ref(rs, API_VERSION, KIND)
        # Expect all `count` before the first call: pod adds may arrive before the calls return.
        self.expectations.expect_creations(key, count)
        self.log.v(2).info("Too few replicas", replicaSet=kobj(rs), need=spec_replicas(rs), creating=count)

        async def create_one() -> None:
            try:
                await self.pod_control.create_pod(namespace, template, rs, controller_ref)
            except ApiError as err:
                if err.has_cause(NAMESPACE_TERMINATING_CAUSE):
                    return  # every create fails until the namespace is gone; not worth an error
                raise

        successes, error = await slow_start_batch(count, create_one)
        if (skipped := count - successes) > 0:
            # The informer will never see these pods, so stop waiting for them.
            self.log.v(2).info(
                "Slow-start failure. Skipping creation of pods, decrementing expectations",
                podsSkipped=skipped, kind=KIND, replicaSet=kobj(rs),
            )
            for _ in range(skipped):  # one "Lowered expectations" each, as KCM's CreationObserved
                self.expectations.creation_observed(key)
        return error

    async def delete_replicas(self, rs: Obj, active: Sequence[Obj], count: int) -> BaseException | None:
        key = object_key(rs)
        self.log.v(2).info("Too many replicas", replicaSet=kobj(rs), need=spec_replicas(rs), deleting=count)
        related = await related_pods(self.replica_sets_with_same_controller(rs), self.selector_of,
                                     self.pods.indexer.in_namespace)
        if (log := self.log.v(4)).enabled():  # 10,000 pods make a costly list
            log.info("Found related pods", kind=KIND, replicaSet=kobj(rs), pods=kobj_slice(related))
        victims = await pods_to_delete(active, related, count, use_deletion_cost=self.use_deletion_cost)
        # Expect these exact pods, so "deletionTimestamp set" and "deleted" count once each.
        self.expectations.expect_deletions(key, [object_key(p) for p in victims])
        errors = await asyncio.gather(*(self.delete_one(rs, key, pod) for pod in victims))
        return next((e for e in errors if e is not None), None)

    async def delete_one(self, rs: Obj, key: str, pod: Obj) -> BaseException | None:
        try:
            await self.pod_control.delete_pod(rs["metadata"]["namespace"], pod["metadata"]["name"], rs)
        except Exception as err:
            # The informer won't observe a deletion that didn't happen.
            self.expectations.deletion_observed(key, object_key(pod))
            if isinstance(err, NotFound):
                return None
            self.log.v(2).info("Failed to delete pod, decremented expectations", pod=object_key(pod), kind=KIND,
                               replicaSet=kobj(rs))
            return err
        return None
