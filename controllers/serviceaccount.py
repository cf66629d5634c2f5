"""ServiceAccount controller: every Active namespace has a ServiceAccount named `default`.

This is the example to copy when writing a controller. The shape is always the same:

1. Declare the controller. Only `name` is required; every other class attribute below is
   optional, with its default in its comment (`log_lines`, KCM's lines, is for built-ins: a plugin
   leaves it out and gets generic lines naming the controller; `enabled_by_default`, unset here,
   is True: the controller runs under a plain `pykcm run`).
2. In __init__, ask the shared informer factory for the caches you read and register event
   handlers that turn changes into *keys* on the work queue. Handlers only enqueue.
3. Write sync(key): read the latest state from the cache, compare it with what should be,
   act through the API, and raise to be retried with backoff. Syncs are level-triggered: the
   key says *what* to look at, never *what changed*, so a missed or repeated event is harmless.
4. Register the class under the `pykcm.controllers` entry-point group in pyproject.toml.
"""

from __future__ import annotations

from pykcm.client.errors import NAMESPACE_TERMINATING_CAUSE, AlreadyExists, ApiError
from pykcm.client.resources import NAMESPACES, SERVICEACCOUNTS
from pykcm.controller import KEY, Controller, ControllerContext, Line, LogLines, handle_error
from pykcm.informers.store import DeletedFinalStateUnknown, Obj, unwrap_tombstone

DEFAULT_SERVICE_ACCOUNT = "default"


class ServiceAccountController(Controller):
    name = "serviceaccount-controller"  # required: --controllers, metrics, Events, log lines' `controller=` name it so
    aliases = ("serviceaccount",)  # default (): other words --controllers accepts
    # Default `name`. The user agent and, with --use-service-account-credentials, the ServiceAccount it
    # runs as (RBAC binds that name): KCM's account for this controller is spelt differently from `name`.
    client_name = "service-account-controller"
    queue_name = "serviceaccount"  # default: the first alias, else `name`; the workqueue metrics label
    workers = 1  # default 1; KCM has no flag for this one (`workers_option` names one of pykcm's flags)
    # Default: generic lines. KCM's (serviceaccounts_controller.go); KEY is the work-queue key, here a namespace.
    log_lines = LogLines(
        start=Line("Starting service account controller"),
        stop=Line("Shutting down service account controller"),
        failed=handle_error("Service account work item failed", item=KEY),
        finished=Line("Finished syncing namespace", namespace=KEY),
    )

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx)
        self.namespaces = self.informers.informer(NAMESPACES)
        self.service_accounts = self.informers.informer(SERVICEACCOUNTS)
        # Keys are namespace names. Any namespace add/update re-checks it. resync=0: no periodic replay of
        # the cache as updates (the default, --min-resync-period, replays it every 12-24 h); off as in KCM.
        self.namespaces.add_event_handler(
            on_add=self.enqueue,
            on_update=lambda _old, new: self.enqueue(new),
            resync=0,
        )
        # Only a deletion can make `default` go missing in an existing namespace.
        self.service_accounts.add_event_handler(on_delete=self.service_account_deleted, resync=0)

    def service_account_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        # A tombstone carries the last known object when the delete itself was missed.
        self.queue.add(unwrap_tombstone(obj)["metadata"]["namespace"])

    async def sync(self, key: str) -> None:
        namespace = self.namespaces.indexer.get(key)
        if namespace is None:
            return  # deleted since it was queued; nothing to do
        if namespace.get("status", {}).get("phase") != "Active":
            return  # a terminating namespace rejects new objects anyway
        if self.service_accounts.indexer.get_by(key, DEFAULT_SERVICE_ACCOUNT) is not None:
            return  # present, in whatever shape the user left it: we never update it
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": DEFAULT_SERVICE_ACCOUNT}}
        try:
            await self.client.create(SERVICEACCOUNTS, body, namespace=key)
        except AlreadyExists:
            return  # our cache was behind; the account is there, which is all we want
        except ApiError as err:
            if err.has_cause(NAMESPACE_TERMINATING_CAUSE):
                return  # the namespace started terminating after our cache saw it Active
            raise
        # Not one of KCM's lines (it logs nothing on a create): debug detail, at V(4) as its "Finished syncing".
        self.log.v(4).info("Created service account", serviceAccount=f"{key}/{DEFAULT_SERVICE_ACCOUNT}")
