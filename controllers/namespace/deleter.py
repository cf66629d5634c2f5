"""Empties a deleted namespace: pods first, then every other namespaced resource type, with one
DELETECOLLECTION per type or LIST + DELETE per object where that is not supported; finalizes the
namespace once nothing is left (KCM's deletion/namespaced_resources_deleter.go)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pykcm.client.discovery import (
    APIResourceList,
    DiscoveryResult,
    GroupVersion,
    GroupVersionResource,
    filtered_by,
    group_version_resources,
)
from pykcm.client.errors import ApiError, Conflict, Gone, MethodNotSupported, NotFound, TransportError
from pykcm.client.resources import NAMESPACES, PODS, Resource
from pykcm.client.rest import PARTIAL_METADATA, PARTIAL_METADATA_LIST, RestClient
from pykcm.controllers.namespace.conditions import ConditionUpdater, ContentTotals, GVRDeletion
from pykcm.informers.store import Obj
from pykcm.util.apitime import parse_time
from pykcm.util.errors import AggregateError
from pykcm.util.log import Logger, one_line

FINALIZER_ESTIMATE_SECONDS = 15  # assumed time for finalizers of remaining objects to finish
PODS_GVR = GroupVersionResource("", "v1", "pods")
# Namespace deletion deletes generically; Background keeps the garbage collector from adding the
# orphan finalizer, so dependents are cleaned up instead of blocking the namespace.
BACKGROUND = {"propagationPolicy": "Background"}
TERMINAL_POD_PHASES = ("Succeeded", "Failed")

Discover = Callable[[], Awaitable[DiscoveryResult]]


class ResourcesRemaining(Exception):
    """Content was deleted but has not gone yet; look again in about `estimate` seconds."""

    def __init__(self, estimate: int) -> None:
        super().__init__(f"some content remains in the namespace, estimate {estimate} seconds before it is removed")
        self.estimate = estimate


class NoResourcesDiscovered(Exception):
    """Discovery found nothing at start-up; KCM exits in that case and so does pykcm."""


class UnexpectedItemsRemain(Exception):
    """Objects without finalizers survived a delete: nothing explains why, so it is an error."""

    def __init__(self, namespace: str, gvr: GroupVersionResource) -> None:
        super().__init__(f"unexpected items still remain in namespace: {namespace} for gvr: {gvr}")


LIST, DELETE_COLLECTION = "list", "deletecollection"
# Lists page by page where KCM lists in one piece: a terminating namespace of 10,000 pods is a 16 MB
# answer, decoded in one step of the event loop (0.1-0.5 s) at every check while the pods go.
PAGE_SIZE = 500
RESTARTED: list[Obj] = []  # _pages' word for "forget the pages so far" (compared by identity)


class OperationNotSupportedCache:
    """Resource types whose discovery lacks `list` or `deletecollection`, filled once at start-up.

    The deleter also treats 405 and 404 answers as "not supported" but, like KCM, only for that
    call: such answers are not remembered.
    """

    def __init__(self) -> None:
        self._unsupported: set[tuple[str, GroupVersionResource]] = set()

    def is_supported(self, operation: str, gvr: GroupVersionResource) -> bool:
        return (operation, gvr) not in self._unsupported

    def set_not_supported(self, operation: str, gvr: GroupVersionResource) -> None:
        self._unsupported.add((operation, gvr))


class NamespacedResourcesDeleter:
    def __init__(self, client: RestClient, discover: Discover, finalizer_token: str, log: Logger) -> None:
        self.client = client
        self.discover = discover
        self.finalizer_token = finalizer_token
        self.log = log
        self.op_cache = OperationNotSupportedCache()

    async def init_op_cache(self, log: Logger | None = None) -> None:
        """Pre-fill the not-supported cache from discovery; refuse to run if nothing is discovered.
        `log`: KCM's deleter does this in the controller's constructor, with its named logger."""
        log = log or self.log
        resources, err = await self._discover()
        if err is not None:  # utilruntime.HandleErrorWithContext: its logger named UnhandledError
            log.named("UnhandledError").error(err, "Unable to get all supported resources from server")
        if not resources:
            raise NoResourcesDiscovered(f"unable to get any supported resources from server: {err}")
        for rl in resources:
            try:
                gv = GroupVersion.parse(rl.group_version)
            except ValueError as parse_err:
                log.error(parse_err, "Failed to parse GroupVersion, skipping", groupVersion=rl.group_version)
                continue
            for res in rl.resources:
                gvr = GroupVersionResource(gv.group, gv.version, res.name)
                if "delete" not in res.verbs and log.v(6).enabled():
                    log.v(6).info("Skipping resource because it cannot be deleted", resource=str(gvr))
                for operation in (LIST, DELETE_COLLECTION):
                    if operation not in res.verbs:
                        self.op_cache.set_not_supported(operation, gvr)

    async def _discover(self) -> tuple[list[APIResourceList], BaseException | None]:
        try:
            found = await self.discover()
        except (ApiError, TransportError) as err:
            return [], err
        return found.resources, found.error

    # -- the namespace itself ------------------------------------------------------------------------

    async def delete(self, name: str) -> None:
        """One deletion pass. Raises ResourcesRemaining to be called again later, other errors to
        be retried with backoff; returns once the finalizer is released (or nothing is to do)."""
        try:
            namespace = await self.client.get(NAMESPACES, name)
        except NotFound:
            return
        if not _deletion_timestamp(namespace):
            return
        self.log.v(5).info("Namespace controller - syncNamespace", namespace=name, finalizerToken=self.finalizer_token)
        try:
            namespace = await self._retry_on_conflict(namespace, self._mark_terminating)
        except NotFound:
            return
        if not _deletion_timestamp(namespace):
            return
        finalizers = namespace.get("spec", {}).get("finalizers")
        if not finalizers:
            return  # finalized already; the API server removes it once metadata finalizers are gone
        # With another spec finalizer left, KCM runs this whole pass again on every sync, as pykcm
        # does; only the pass that removes our token says so.
        removes_token = self.finalizer_token in finalizers
        estimate = await self.delete_all_content(namespace)
        if estimate > 0:
            raise ResourcesRemaining(estimate)
        try:
            # KCM finalizes the copy it wrote conditions from, so after a condition update this
            # first PUT conflicts and the retry works from a fresh GET; pykcm keeps that sequence.
            await self._retry_on_conflict(namespace, self._finalize)
        except NotFound:
            return  # another controller sharing the token finished first
        if removes_token:  # not KCM's (it says nothing here): kept at V(4) to tell the last pass
            self.log.v(4).info("Namespace content deleted, finalizer removed", namespace=name,
                               finalizer=self.finalizer_token)

    async def _retry_on_conflict(self, namespace: Obj, update: Callable[[Obj], Awaitable[Obj]]) -> Obj:
        latest = namespace
        while True:
            try:
                return await update(latest)
            except Conflict:
                previous = latest
                latest = await self.client.get(NAMESPACES, previous["metadata"]["name"])
                if previous["metadata"].get("uid") != latest["metadata"].get("uid"):
                    raise RuntimeError("namespace uid has changed across retries") from None

    async def _mark_terminating(self, namespace: Obj) -> Obj:
        if not _deletion_timestamp(namespace) or namespace.get("status", {}).get("phase") == "Terminating":
            return namespace
        updated = {**namespace, "status": {**namespace.get("status", {}), "phase": "Terminating"}}
        return await self.client.update(NAMESPACES, updated, subresource="status")

    async def _finalize(self, namespace: Obj) -> Obj:
        remaining = sorted({f for f in namespace.get("spec", {}).get("finalizers") or [] if f != self.finalizer_token})
        body = {**namespace, "spec": {**namespace.get("spec", {}), "finalizers": remaining}}
        try:
            return await self.client.update(NAMESPACES, body, subresource="finalize")
        except NotFound:
            return namespace  # removed already, so life is good

    # -- content -------------------------------------------------------------------------------------

    async def delete_all_content(self, namespace: Obj) -> int:
        """Delete everything in the namespace that can be deleted; return the seconds to wait for
        what remains (0: nothing remains). Errors of single types are collected and raised
        together at the end, after the conditions are written."""
        name = namespace["metadata"]["name"]
        deleted_at = _deletion_timestamp(namespace)
        errors: list[BaseException] = []
        conditions = ConditionUpdater()
        self.log.v(4).info("namespace controller - deleteAllContent", namespace=name)

        resources, err = await self._discover()
        if err is not None:
            # Not fatal for this pass: delete what was discovered, but do not finalize.
            errors.append(err)
            conditions.discovery_failed(err)
        deletable = filtered_by(lambda _gv, r: r.supports("delete"), resources)
        try:
            gvrs = list(group_version_resources(deletable))
        except ValueError as parse_err:
            gvrs = []
            errors.append(parse_err)
            conditions.group_version_parsing_failed(parse_err)

        estimate = 0
        totals = ContentTotals()
        if PODS_GVR in gvrs:
            # Pods go first so that no workload outlives the policies, secrets and volumes it uses.
            result, pods_err = await self._delete_gvr(PODS_GVR, name, deleted_at)
            if pods_err is not None:
                errors.append(RuntimeError(f"failed to delete pods for namespace: {name}, err: {pods_err}"))
                conditions.content_deletion_failed(pods_err)
            estimate = max(estimate, result.estimate)
            totals.add(PODS_GVR, result)
            if totals.remaining.get(PODS_GVR):
                # KCM reports no content totals here, so the remaining-content conditions read "ok".
                self.log.v(5).info("Namespace controller - pods still remain, delaying deletion of other resources",
                                   namespace=name)
                await self._write_conditions(namespace, conditions)
                _raise_if_any(errors)
                return estimate

        for gvr in gvrs:
            if gvr == PODS_GVR:
                continue
            result, gvr_err = await self._delete_gvr(gvr, name, deleted_at)
            if gvr_err is not None:
                errors.append(gvr_err)
                conditions.content_deletion_failed(gvr_err)
            estimate = max(estimate, result.estimate)
            totals.add(gvr, result)
        conditions.content_totals(totals)
        # Always computed: a condition that failed before must be reported as recovered.
        await self._write_conditions(namespace, conditions)
        self.log.v(4).info("namespace controller - deleteAllContent", namespace=name, estimate=estimate,
                           err=str(AggregateError(errors)) if errors else None)
        _raise_if_any(errors)
        return estimate

    async def _write_conditions(self, namespace: Obj, conditions: ConditionUpdater) -> None:
        if not conditions.update(namespace):
            return
        try:
            await self.client.update(NAMESPACES, namespace, subresource="status")
        except (ApiError, TransportError) as err:
            name = namespace["metadata"]["name"]
            self.log.error(err, "Couldn't update status condition for namespace", namespace=name)

    def _trace(self, msg: str, namespace: str, gvr: GroupVersionResource, **kv: Any) -> None:
        """KCM's V(5) lines for one resource type: the type and any error are formatted only when on."""
        trace = self.log.v(5)
        if trace.enabled():
            if "err" in kv:
                kv["err"] = one_line(kv["err"])
            trace.info(msg, namespace=namespace, resource=str(gvr), **kv)

    async def _delete_gvr(
        self, gvr: GroupVersionResource, namespace: str, deleted_at: float
    ) -> tuple[GVRDeletion, BaseException | None]:
        """Delete every object of one type; report what is left and how long to wait for it."""
        step = "Namespace controller - deleteAllContentForGroupVersionResource"
        self._trace(step, namespace, gvr)
        try:
            estimate = await self._estimate_graceful_termination(gvr, namespace, deleted_at)
        except (ApiError, TransportError) as err:
            self._trace(f"{step} - unable to estimate", namespace, gvr, err=err)
            return GVRDeletion(), err
        self._trace(f"{step} - estimate", namespace, gvr, estimate=estimate)
        try:
            if not await self._delete_collection(gvr, namespace):
                await self._delete_each_item(gvr, namespace)
        except (ApiError, TransportError) as err:
            return GVRDeletion(estimate), err
        self._trace(f"{step} - checking for no more items in namespace", namespace, gvr)
        try:
            items, listed = await self._list_collection(gvr, namespace)
        except (ApiError, TransportError) as err:
            self._trace(f"{step} - error verifying no items in namespace", namespace, gvr, err=err)
            return GVRDeletion(estimate), err
        if not listed:
            return GVRDeletion(estimate), None
        self._trace(f"{step} - items remaining", namespace, gvr, items=len(items))
        if not items:
            return GVRDeletion(), None
        finalizers = Counter(f for item in items for f in item.get("metadata", {}).get("finalizers") or [])
        if estimate:
            self._trace(f"{step} - estimate is present", namespace, gvr, finalizers=dict(finalizers))
            return GVRDeletion(estimate, len(items), finalizers), None
        if finalizers:
            # Objects waiting for their finalizers are normal: give their owners time.
            self._trace(f"{step} - items remaining with finalizers", namespace, gvr, finalizers=dict(finalizers))
            return GVRDeletion(FINALIZER_ESTIMATE_SECONDS, len(items), finalizers), None
        return GVRDeletion(estimate, len(items)), UnexpectedItemsRemain(namespace, gvr)

    async def _delete_collection(self, gvr: GroupVersionResource, namespace: str) -> bool:
        """DELETECOLLECTION; False if the type does not support it."""
        self._trace("Namespace controller - deleteCollection", namespace, gvr)
        if not self.op_cache.is_supported(DELETE_COLLECTION, gvr):
            self._trace("Namespace controller - deleteCollection ignored since not supported", namespace, gvr)
            return False
        try:
            await self.client.delete_collection(
                gvr.as_resource(), namespace=namespace, body=BACKGROUND, accept=PARTIAL_METADATA_LIST
            )
        except (MethodNotSupported, NotFound):
            # Some types are listed in discovery but serve no collection verbs and answer 404.
            self._trace("Namespace controller - deleteCollection not supported", namespace, gvr)
            return False
        except (ApiError, TransportError) as err:
            self._trace("Namespace controller - deleteCollection unexpected error", namespace, gvr, err=err)
            raise
        return True

    async def _list_collection(self, gvr: GroupVersionResource, namespace: str) -> tuple[list[Obj], bool]:
        """Object metadata of one type; (_, False) if the type cannot be listed."""
        self._trace("Namespace controller - listCollection", namespace, gvr)
        if not self.op_cache.is_supported(LIST, gvr):
            self._trace("Namespace controller - listCollection ignored since not supported", namespace, gvr)
            return [], False
        items: list[Obj] = []
        try:
            async for page in self._pages(gvr.as_resource(), namespace, accept=PARTIAL_METADATA_LIST):
                if page is RESTARTED:
                    items = []
                else:
                    items += page
        except (MethodNotSupported, NotFound):
            self._trace("Namespace controller - listCollection not supported", namespace, gvr)
            return [], False
        return items, True

    async def _pages(self, resource: Resource, namespace: str, **params: Any) -> AsyncIterator[list[Obj]]:
        """The items of a list, PAGE_SIZE at a time; where the continue token expired between pages (a
        list slower than etcd's compaction), RESTARTED and then the whole list in one piece, as KCM's."""
        token = ""
        while True:
            try:
                page = await self.client.list(resource, namespace=namespace, limit=PAGE_SIZE,
                                              **({"continue": token} if token else {}), **params)
            except Gone:
                if not token:
                    raise
                yield RESTARTED
                page = await self.client.list(resource, namespace=namespace, **params)
                token = ""
            if not isinstance(page, dict):
                return
            yield page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    async def _delete_each_item(self, gvr: GroupVersionResource, namespace: str) -> None:
        self._trace("Namespace controller - deleteEachItem", namespace, gvr)
        items, listed = await self._list_collection(gvr, namespace)
        if not listed:
            return
        for item in items:
            try:
                await self.client.delete(gvr.as_resource(), item.get("metadata", {}).get("name", ""), namespace,
                                         body=BACKGROUND, accept=PARTIAL_METADATA)
            except (NotFound, MethodNotSupported):
                continue

    async def _estimate_graceful_termination(
        self, gvr: GroupVersionResource, namespace: str, deleted_at: float
    ) -> int:
        """Pods' longest grace period, or 0 once that much time has passed since the deletion."""
        self.log.v(5).info("Namespace controller - estimateGracefulTermination", group=gvr.group, resource=gvr.resource)
        if (gvr.group, gvr.resource) != (PODS_GVR.group, PODS_GVR.resource):
            return 0
        self.log.v(5).info("Namespace controller - estimateGracefulTerminationForPods", namespace=namespace)
        estimate = 0
        async for page in self._pages(PODS, namespace):  # only one page of a large namespace is held
            for pod in page:
                if pod.get("status", {}).get("phase") not in TERMINAL_POD_PHASES:
                    estimate = max(estimate, int(pod.get("spec", {}).get("terminationGracePeriodSeconds") or 0))
        if time.time() - deleted_at >= estimate:
            return 0
        return estimate


def _deletion_timestamp(namespace: Obj) -> float | None:
    """The namespace's deletionTimestamp in Unix seconds; None when it is not being deleted."""
    stamp = namespace.get("metadata", {}).get("deletionTimestamp")
    if not stamp:
        return None
    deleted_at = parse_time(stamp)
    if deleted_at is None:
        return time.time()  # unparseable: act as if just deleted rather than crash
    return deleted_at


def _raise_if_any(errors: list[BaseException]) -> None:
    if errors:
        raise AggregateError(errors)
