"""Namespace controller: empties a deleted namespace, then releases its `kubernetes` finalizer.

When a namespace is deleted the API server only sets its deletionTimestamp; the namespace stays
until every entry of `spec.finalizers` is gone. This controller owns the `kubernetes` entry. For
each deleted namespace it

1. marks the namespace `Terminating` (status.phase),
2. discovers every namespaced resource type that supports `delete` (built-in, CRD, aggregated),
3. deletes pods first and everything else only once no pods remain (ordered deletion, GA 1.34),
   with one DELETECOLLECTION per type, or LIST + DELETE per object where that is not supported,
4. records progress and failures in five status conditions,
5. removes `kubernetes` through the `finalize` subresource once nothing is left; the API server
   then removes the namespace unless other finalizers remain.

While content is still going away the namespace is looked at again after half the estimated
time (pods' grace periods, 15 s for objects with finalizers), without error backoff. Any error,
including a group that failed discovery, is retried with backoff capped at a minute, and the
namespace is not finalized while it persists.

Source: kubernetes/kubernetes pkg/controller/namespace (namespace_controller.go,
deletion/namespaced_resources_deleter.go, deletion/status_condition_utils.go) at 1.36.
"""
from __future__ import annotations

from pykcm.client.discovery import (
    server_preferred_namespaced_resources,
)
from pykcm.client.resources import NAMESPACES
from pykcm.controller import KEY, Controller, ControllerContext, Line, LogLines, RequeueAfter, handle_error
from pykcm.controllers.namespace.deleter import NamespacedResourcesDeleter, ResourcesRemaining
from pykcm.informers.store import Obj, object_key
from pykcm.workqueue import RateLimiter, default_controller_rate_limiter

FINALIZER_KUBERNETES = "kubernetes"
# Wait before acting on a deletion so that every API server's lifecycle admission has seen it
# (no new objects) and late creates have reached etcd (they are then deleted too).
DELETION_GRACE_PERIOD = 5.0
RETRY_CAP = 60.0  # a failing namespace is retried at least once a minute


class NamespaceController(Controller):
    name = "namespace-controller"
    aliases = ("namespace",)
    client_name = "namespace-controller"
    queue_name = "namespace"
    workers = 10
    workers_option = "concurrent_namespace_syncs"
    log_lines = LogLines(  # KCM's (namespace_controller.go)
        start=Line("Starting namespace controller"),
        workers=Line("Starting workers of namespace controller"),
        stop=Line("Shutting down namespace controller"),
        failed=handle_error("Deletion of namespace failed", namespace=KEY),
        finished=Line("Finished syncing namespace", namespace=KEY),
    )

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx)
        self.namespaces = self.informers.informer(NAMESPACES)
        self.deleter = NamespacedResourcesDeleter(
            self.client, lambda: server_preferred_namespaced_resources(self.client), FINALIZER_KUBERNETES, self.log
        )
        # No delete handler: a namespace that is gone needs nothing. The resync re-checks every
        # terminating namespace periodically, whatever happened to its queue entry.
        self.namespaces.add_event_handler(
            on_add=self.namespace_changed,
            on_update=lambda _old, new: self.namespace_changed(new),
            resync=self.options.namespace_sync_period,
        )

    def rate_limiter(self) -> RateLimiter:
        return default_controller_rate_limiter(cap=RETRY_CAP)

    @classmethod
    def client_limits(cls, qps: float, burst: int) -> tuple[float, int]:
        # Deletion issues a few requests per resource type per pass; KCM lifts its limits this much.
        return qps * 20, burst * 100

    def namespace_changed(self, namespace: Obj) -> None:
        if not namespace.get("metadata", {}).get("deletionTimestamp"):
            return  # only deleted namespaces concern this controller
        self.queue.add_after(object_key(namespace), DELETION_GRACE_PERIOD)

    async def run(self) -> None:
        await self.deleter.init_op_cache(self.named_log)
        await super().run()

    async def sync(self, key: str) -> None:
        if self.namespaces.indexer.get(key) is None:
            self.log.info("Namespace has been deleted", namespace=key)
            return
        try:
            await self.deleter.delete(key)
        except ResourcesRemaining as remaining:
            wait = remaining.estimate // 2 + 1
            self.log.v(4).info("Content remaining in namespace", namespace=key, waitSeconds=wait)
            raise RequeueAfter(wait) from None
