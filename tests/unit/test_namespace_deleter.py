"""Unit tests for the namespace deleter and controller wiring, against an in-memory API.

The fake API keeps namespaces and namespaced objects, honours resourceVersion on namespace
updates, and models deletion the way the API server does for these tests: an object with
finalizers (or a pod bound to a node) gets a deletionTimestamp and stays, anything else goes.
"""

from __future__ import annotations

import copy
import itertools
import logging
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pykcm.app.options import Options
from pykcm.client.discovery import (
    APIResource,
    APIResourceList,
    DiscoveryResult,
    GroupDiscoveryFailed,
    GroupVersion,
    StaleGroupVersion,
)
from pykcm.client.errors import ApiError, Conflict, Gone, MethodNotSupported, NotFound
from pykcm.client.events import EventRecorder
from pykcm.client.resources import Resource
from pykcm.controller import ControllerContext, RequeueAfter
from pykcm.controllers.namespace.conditions import (
    CONTENT_FAILURE,
    CONTENT_REMAINING,
    DISCOVERY_FAILURE,
    FINALIZERS_REMAINING,
)
from pykcm.controllers.namespace.controller import DELETION_GRACE_PERIOD, NamespaceController
from pykcm.controllers.namespace.deleter import (
    BACKGROUND,
    NamespacedResourcesDeleter,
    NoResourcesDiscovered,
    ResourcesRemaining,
    _deletion_timestamp,
)
from pykcm.informers.factory import SharedInformerFactory
from pykcm.util.errors import AggregateError
from pykcm.util.log import get_logger

ALL = frozenset({"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"})
NS = "doomed"


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeApi:
    def __init__(self) -> None:
        self.namespaces: dict[str, dict] = {}
        self.objects: dict[tuple[str, str], dict[str, dict]] = {}  # (resource name, namespace) -> by name
        self.calls: list[tuple[str, str]] = []
        self.errors: dict[tuple[str, str], ApiError] = {}  # (verb, resource name) -> raised every time
        self._rv = itertools.count(100)

    # -- set-up helpers

    def add_namespace(self, name: str = NS, finalizers: tuple[str, ...] = ("kubernetes",),
                      deleted_ago: float | None = 10.0, phase: str = "Active") -> dict:
        meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "resourceVersion": str(next(self._rv))}
        if deleted_ago is not None:
            meta["deletionTimestamp"] = iso(datetime.now(UTC) - timedelta(seconds=deleted_ago))
        self.namespaces[name] = {"metadata": meta, "spec": {"finalizers": list(finalizers)}, "status": {"phase": phase}}
        return self.namespaces[name]

    def add(self, res: str, name: str, namespace: str = NS, **fields: Any) -> None:
        obj = {"metadata": {"name": name, "namespace": namespace, **fields.pop("metadata", {})}, **fields}
        self.objects.setdefault((res, namespace), {})[name] = obj

    def items(self, res: str, namespace: str = NS) -> dict[str, dict]:
        return self.objects.get((res, namespace), {})

    def verbs(self, res: str) -> list[str]:
        return [verb for verb, name in self.calls if name == res]

    # -- the client surface the deleter uses

    def _record(self, verb: str, res: Resource, subresource: str | None = None) -> None:
        name = f"{res.name}/{subresource}" if subresource else res.name
        self.calls.append((verb, name))
        if (verb, name) in self.errors:
            raise self.errors[(verb, name)]

    async def get(self, res: Resource, name: str, namespace: str | None = None, subresource: str | None = None) -> dict:
        self._record("get", res)
        if name not in self.namespaces:
            raise NotFound(404, "NotFound", f'namespaces "{name}" not found')
        return copy.deepcopy(self.namespaces[name])

    async def update(self, res: Resource, body: dict, subresource: str | None = None) -> dict:
        self._record("update", res, subresource)
        name = body["metadata"]["name"]
        current = self.namespaces.get(name)
        if current is None:
            raise NotFound(404, "NotFound", f'namespaces "{name}" not found')
        if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        current = copy.deepcopy(current)
        if subresource == "status":
            current["status"] = copy.deepcopy(body["status"])
        elif subresource == "finalize":
            current["spec"]["finalizers"] = list(body["spec"]["finalizers"])
        current["metadata"]["resourceVersion"] = str(next(self._rv))
        if subresource == "finalize" and not current["spec"]["finalizers"]:
            del self.namespaces[name]  # the registry removes a finalized, deleted namespace
        else:
            self.namespaces[name] = current
        return copy.deepcopy(current)

    async def list(self, res: Resource, namespace: str | None = None, accept: str = "", limit: int = 0,
                   **params: Any) -> dict:
        """Pages of `limit` items when asked, the continue token being the next item's index."""
        self._record("list", res)
        items = copy.deepcopy(list(self.items(res.name, namespace or "").values()))
        start = int(params.get("continue") or 0)
        end = start + limit if limit else len(items)
        return {"items": items[start:end], "metadata": {"continue": str(end)} if end < len(items) else {}}

    async def delete_collection(self, res: Resource, namespace: str | None = None, body: dict | None = None,
                                accept: str = "", **_: Any) -> None:
        self._record("deletecollection", res)
        assert body == BACKGROUND
        for name in list(self.items(res.name, namespace or "")):
            self._delete_one(res.name, namespace or "", name)

    async def delete(self, res: Resource, name: str, namespace: str | None = None, body: dict | None = None,
                     accept: str = "") -> None:
        self._record("delete", res)
        assert body == BACKGROUND
        if name not in self.items(res.name, namespace or ""):
            raise NotFound(404, "NotFound", "gone")
        self._delete_one(res.name, namespace or "", name)

    def _delete_one(self, res: str, namespace: str, name: str) -> None:
        obj = self.objects[(res, namespace)][name]
        if obj["metadata"].get("finalizers") or obj.get("spec", {}).get("nodeName"):
            obj["metadata"].setdefault("deletionTimestamp", iso(datetime.now(UTC)))
        else:
            del self.objects[(res, namespace)][name]


def discovery(*lists: APIResourceList, failed: dict | None = None) -> Any:
    async def discover() -> DiscoveryResult:
        return DiscoveryResult(list(lists), GroupDiscoveryFailed(failed) if failed else None)

    return discover


CORE = APIResourceList("v1", [
    APIResource("configmaps", "ConfigMap", True, ALL),
    APIResource("pods", "Pod", True, ALL),
    APIResource("bindings", "Binding", True, frozenset({"create"})),
])
CRDS = APIResourceList("example.com/v1", [APIResource("widgets", "Widget", True, ALL)])


def make_deleter(api: FakeApi, *lists: APIResourceList, failed: dict | None = None) -> NamespacedResourcesDeleter:
    return NamespacedResourcesDeleter(
        api,  # type: ignore[arg-type]
        discovery(*(lists or (CORE, CRDS)), failed=failed),
        "kubernetes",
        get_logger("namespace-test"),
    )


def conditions(api: FakeApi, name: str = NS) -> dict[str, dict]:
    return {c["type"]: c for c in api.namespaces[name]["status"].get("conditions", [])}


async def test_clean_namespace_is_emptied_and_finalized() -> None:
    api = FakeApi()
    api.add_namespace()
    api.add("configmaps", "cm")
    api.add("pods", "p", spec={"terminationGracePeriodSeconds": 30})
    api.add("widgets.example.com", "w")
    deleter = make_deleter(api)
    await deleter.init_op_cache()
    await deleter.delete(NS)
    assert NS not in api.namespaces
    assert not any(api.objects.values())
    # Pods first; bindings (no delete verb) never touched.
    deletes = [name for verb, name in api.calls if verb == "deletecollection"]
    assert deletes[0] == "pods" and set(deletes) == {"pods", "configmaps", "widgets.example.com"}
    # Phase, then conditions, then finalize (conflicting once on the pre-conditions copy, as KCM's does).
    assert [c for c in api.calls if c[1].startswith("namespaces")] == [
        ("get", "namespaces"), ("update", "namespaces/status"), ("update", "namespaces/status"),
        ("update", "namespaces/finalize"), ("get", "namespaces"), ("update", "namespaces/finalize"),
    ]


async def test_remaining_pods_hold_back_everything_else() -> None:
    api = FakeApi()
    api.add_namespace(deleted_ago=1)
    api.add("pods", "running", spec={"nodeName": "n1", "terminationGracePeriodSeconds": 30},
            status={"phase": "Running"})
    api.add("configmaps", "cm")
    deleter = make_deleter(api)
    await deleter.init_op_cache()
    with pytest.raises(ResourcesRemaining) as remaining:
        await deleter.delete(NS)
    assert remaining.value.estimate == 30
    assert "cm" in api.items("configmaps") and api.verbs("configmaps") == []
    assert api.namespaces[NS]["status"]["phase"] == "Terminating"
    # KCM reports no content totals on this early return: the remaining-content conditions read ok.
    assert conditions(api)[CONTENT_REMAINING]["status"] == "False"


async def test_terminal_pods_do_not_count_for_the_estimate() -> None:
    api = FakeApi()
    api.add_namespace(deleted_ago=1)
    api.add("pods", "done", spec={"nodeName": "n1", "terminationGracePeriodSeconds": 300},
            status={"phase": "Succeeded"}, metadata={"finalizers": ["x.io/keep"]})
    deleter = make_deleter(api)
    with pytest.raises(ResourcesRemaining) as remaining:
        await deleter.delete(NS)
    assert remaining.value.estimate == 15  # the finalizer default, not the 300 s grace period


async def test_the_estimate_is_the_longest_grace_period_over_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    # KCM lists the pods in one piece; pykcm pages, and a later page's shorter grace must not win.
    monkeypatch.setattr(sys.modules[NamespacedResourcesDeleter.__module__], "PAGE_SIZE", 1)
    api = FakeApi()
    api.add_namespace(deleted_ago=10)
    for name, grace in (("slow", 300), ("quick", 5), ("none", None)):
        api.add("pods", name, spec={"nodeName": "n1", "terminationGracePeriodSeconds": grace},
                status={"phase": "Running"})
    deleter = make_deleter(api)
    with pytest.raises(ResourcesRemaining) as remaining:
        await deleter.delete(NS)
    assert remaining.value.estimate == 300  # not 5: that much time has passed, and "slow" is still going
    assert api.verbs("pods").count("list") >= 3


async def test_grace_period_elapsed_with_pods_left_is_an_error() -> None:
    api = FakeApi()
    api.add_namespace(deleted_ago=60)
    api.add("pods", "stuck", spec={"nodeName": "n1", "terminationGracePeriodSeconds": 30})
    deleter = make_deleter(api)
    with pytest.raises(AggregateError, match="failed to delete pods for namespace: doomed, err: unexpected items"):
        await deleter.delete(NS)
    failure = conditions(api)[CONTENT_FAILURE]
    assert failure["message"] == (
        "Failed to delete all resource types, 1 remaining: "
        "unexpected items still remain in namespace: doomed for gvr: /v1, Resource=pods"
    )


async def test_objects_with_finalizers_keep_the_namespace_and_are_reported() -> None:
    api = FakeApi()
    api.add_namespace()
    api.add("widgets.example.com", "w", metadata={"finalizers": ["example.com/hold"]})
    deleter = make_deleter(api)
    with pytest.raises(ResourcesRemaining) as remaining:
        await deleter.delete(NS)
    assert remaining.value.estimate == 15
    current = conditions(api)
    assert current[CONTENT_REMAINING]["message"] == (
        "Some resources are remaining: widgets.example.com has 1 resource instances"
    )
    assert current[FINALIZERS_REMAINING]["message"] == (
        "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances"
    )
    assert api.namespaces[NS]["spec"]["finalizers"] == ["kubernetes"]


async def test_what_remains_is_counted_over_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    # KCM lists what remains in one piece; pykcm pages (a large namespace's list is one step of the
    # loop to decode), and every page counts.
    monkeypatch.setattr(sys.modules[NamespacedResourcesDeleter.__module__], "PAGE_SIZE", 1)
    api = FakeApi()
    api.add_namespace()
    for name in ("a", "b", "c"):
        api.add("widgets.example.com", name, metadata={"finalizers": ["example.com/hold"]})
    deleter = make_deleter(api)
    with pytest.raises(ResourcesRemaining):
        await deleter.delete(NS)
    current = conditions(api)
    assert current[CONTENT_REMAINING]["message"] == (
        "Some resources are remaining: widgets.example.com has 3 resource instances"
    )
    assert current[FINALIZERS_REMAINING]["message"] == (
        "Some content in the namespace has finalizers remaining: example.com/hold in 3 resource instances"
    )
    assert api.verbs("widgets.example.com").count("list") >= 3


async def test_an_expired_continue_token_lists_what_remains_again_in_one_piece(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Pages slower than etcd's compaction: 410 for the token; the count starts over, as KCM's one list.
    monkeypatch.setattr(sys.modules[NamespacedResourcesDeleter.__module__], "PAGE_SIZE", 1)
    api = FakeApi()
    api.add_namespace()
    for name in ("a", "b", "c"):
        api.add("widgets.example.com", name, metadata={"finalizers": ["example.com/hold"]})
    paged = api.list
    expired: list[str] = []

    async def list_expiring_once(res: Resource, namespace: str | None = None, accept: str = "", limit: int = 0,
                                 **params: Any) -> dict:
        if params.get("continue") and not expired:
            expired.append(params["continue"])
            raise Gone(410, "Expired", "The provided continue parameter is too old")
        return await paged(res, namespace, accept, limit, **params)

    monkeypatch.setattr(api, "list", list_expiring_once)
    deleter = make_deleter(api)
    with pytest.raises(ResourcesRemaining):
        await deleter.delete(NS)
    assert expired
    assert conditions(api)[CONTENT_REMAINING]["message"] == (
        "Some resources are remaining: widgets.example.com has 3 resource instances"
    )


async def test_type_without_deletecollection_in_discovery_is_deleted_item_by_item() -> None:
    api = FakeApi()
    api.add_namespace()
    for name in ("a", "b"):
        api.add("configmaps", name)
    no_collection = APIResourceList("v1", [APIResource("configmaps", "ConfigMap", True, ALL - {"deletecollection"})])
    deleter = make_deleter(api, no_collection)
    await deleter.init_op_cache()
    await deleter.delete(NS)
    assert api.verbs("configmaps") == ["list", "delete", "delete", "list"]
    assert NS not in api.namespaces


async def test_method_not_allowed_falls_back_for_this_call_only() -> None:
    api = FakeApi()
    api.add_namespace()
    api.add("configmaps", "a")
    api.errors[("deletecollection", "configmaps")] = MethodNotSupported(405, "MethodNotAllowed", "nope")
    deleter = make_deleter(api, APIResourceList("v1", [APIResource("configmaps", "ConfigMap", True, ALL)]))
    await deleter.init_op_cache()
    await deleter.delete(NS)
    assert api.verbs("configmaps") == ["deletecollection", "list", "delete", "list"]
    # Not remembered (KCM 1.36 only trusts discovery for the cache): the next pass tries again.
    api.add_namespace("again")
    api.add("configmaps", "b", namespace="again")
    await deleter.delete("again")
    assert api.verbs("configmaps")[4] == "deletecollection"


async def test_discovery_failure_deletes_what_it_can_but_does_not_finalize() -> None:
    api = FakeApi()
    api.add_namespace()
    api.add("configmaps", "cm")
    gv = GroupVersion("metrics.example.com", "v1")
    deleter = make_deleter(api, CORE, failed={gv: StaleGroupVersion(gv)})
    with pytest.raises(AggregateError, match="unable to retrieve the complete list of server APIs"):
        await deleter.delete(NS)
    assert api.items("configmaps") == {}
    assert api.namespaces[NS]["spec"]["finalizers"] == ["kubernetes"]
    failure = conditions(api)[DISCOVERY_FAILURE]
    assert (failure["status"], failure["reason"]) == ("True", "DiscoveryFailed")
    assert failure["message"].startswith("Discovery failed for some groups, 1 failing: ")


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_only_the_kubernetes_finalizer_is_removed(verbosity: None, caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi()
    api.add_namespace(finalizers=("kubernetes", "z.io/x", "example.com/x", "z.io/x"))
    deleter = make_deleter(api)
    with caplog.at_level(logging.INFO):
        await deleter.delete(NS)
        assert api.namespaces[NS]["spec"]["finalizers"] == ["example.com/x", "z.io/x"]  # sorted, deduplicated
        await deleter.delete(NS)  # the other finalizers stay: KCM runs the pass again on every sync
    removed = [r for r in caplog.records if r.getMessage() == "Namespace content deleted, finalizer removed"]
    assert len(removed) == 1  # said by the pass that removed it, not by the ones after
    assert removed[0].v == 4  # type: ignore[attr-defined]  # KCM has no such line: none at the default verbosity


@pytest.mark.parametrize("verbosity", [6], indirect=True)
async def test_each_resource_step_is_traced_at_v5_with_kcms_messages(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    api = FakeApi()
    api.add_namespace()
    api.add("configmaps", "a", metadata={"finalizers": ["example.com/f"]})
    api.errors[("deletecollection", "configmaps")] = MethodNotSupported(405, "MethodNotAllowed", "nope")
    deleter = make_deleter(api, CORE)
    with caplog.at_level(logging.INFO):
        await deleter.init_op_cache()
        with pytest.raises(ResourcesRemaining):
            await deleter.delete(NS)
    lines = [(r.getMessage(), r.kv) for r in caplog.records]  # type: ignore[attr-defined]
    assert ("Skipping resource because it cannot be deleted", {"resource": "/v1, Resource=bindings"}) in lines
    gvr = {"namespace": NS, "resource": "/v1, Resource=configmaps"}
    step = "Namespace controller - deleteAllContentForGroupVersionResource"
    configmaps = [(msg, kv) for msg, kv in lines if kv.get("resource") in ("/v1, Resource=configmaps", "configmaps")]
    assert configmaps == [
        (step, gvr),
        ("Namespace controller - estimateGracefulTermination", {"group": "", "resource": "configmaps"}),
        (f"{step} - estimate", {**gvr, "estimate": 0}),
        ("Namespace controller - deleteCollection", gvr),
        ("Namespace controller - deleteCollection not supported", gvr),
        ("Namespace controller - deleteEachItem", gvr),
        ("Namespace controller - listCollection", gvr),
        (f"{step} - checking for no more items in namespace", gvr),
        ("Namespace controller - listCollection", gvr),
        (f"{step} - items remaining", {**gvr, "items": 1}),
        (f"{step} - items remaining with finalizers", {**gvr, "finalizers": {"example.com/f": 1}}),
    ]
    assert ("Namespace controller - estimateGracefulTerminationForPods", {"namespace": NS}) in lines


@pytest.mark.parametrize("verbosity", [5], indirect=True)
async def test_a_failed_delete_collection_is_traced_with_its_error(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    api = FakeApi()
    api.add_namespace()
    api.errors[("deletecollection", "configmaps")] = ApiError(403, "Forbidden", "configmaps is forbidden")
    deleter = make_deleter(api, CORE)
    with caplog.at_level(logging.INFO), pytest.raises(AggregateError):
        await deleter.delete(NS)
    unexpected = "Namespace controller - deleteCollection unexpected error"
    [failed] = [r for r in caplog.records if r.getMessage() == unexpected]
    assert failed.kv == {"namespace": NS, "resource": "/v1, Resource=configmaps",  # type: ignore[attr-defined]
                         "err": "configmaps is forbidden"}


async def test_already_finalized_namespace_needs_no_content_pass() -> None:
    api = FakeApi()
    api.add_namespace(finalizers=(), phase="Terminating")
    await make_deleter(api).delete(NS)
    assert api.calls == [("get", "namespaces")]


async def test_namespace_without_deletion_timestamp_is_left_alone() -> None:
    api = FakeApi()
    api.add_namespace(deleted_ago=None)
    await make_deleter(api).delete(NS)
    assert api.calls == [("get", "namespaces")]


async def test_uid_change_during_conflict_retry_aborts() -> None:
    api = FakeApi()
    stale = api.add_namespace()
    stale = copy.deepcopy(stale)
    api.add_namespace()  # same name, new resourceVersion...
    api.namespaces[NS]["metadata"]["uid"] = "a-new-namespace"  # ...and a different object
    deleter = make_deleter(api)
    with pytest.raises(RuntimeError, match="namespace uid has changed across retries"):
        await deleter._retry_on_conflict(stale, deleter._mark_terminating)


async def test_nothing_discovered_at_start_up_is_fatal() -> None:
    deleter = make_deleter(FakeApi(), APIResourceList("v1", []))
    deleter.discover = discovery()
    with pytest.raises(NoResourcesDiscovered):
        await deleter.init_op_cache()


# -- controller wiring ----------------------------------------------------------------------------


async def make_controller(api: FakeApi, **options: Any) -> NamespaceController:
    ctx = ControllerContext(
        client=api,  # type: ignore[arg-type]
        informers=SharedInformerFactory(api),  # type: ignore[arg-type]
        options=Options(**options),
        events=EventRecorder(api, "namespace-controller"),  # type: ignore[arg-type]
    )
    controller = NamespaceController(ctx)
    controller.deleter = make_deleter(api)
    return controller


async def test_controller_declaration_matches_kcm() -> None:
    controller = await make_controller(FakeApi(), concurrent_namespace_syncs=3)
    assert (controller.name, controller.aliases, controller.client_name, controller.queue_label()) == (
        "namespace-controller", ("namespace",), "namespace-controller", "namespace")
    assert controller.worker_count() == 3
    assert NamespaceController.client_limits(20, 30) == (400, 3000)
    registration = controller.namespaces._handlers[0]
    assert registration.resync == 300.0 and registration.on_delete is None
    # Own limiter: per-item backoff capped at a minute.
    for _ in range(30):
        delay = controller.queue.rate_limiter.when("ns")
    assert delay == 60.0


async def test_only_deleted_namespaces_are_queued_after_the_grace_period() -> None:
    controller = await make_controller(FakeApi())
    added: list[tuple[str, float]] = []
    controller.queue.add_after = lambda key, delay: added.append((key, delay))  # type: ignore[method-assign]
    controller.namespace_changed({"metadata": {"name": "alive"}})
    controller.namespace_changed({"metadata": {"name": "dying", "deletionTimestamp": "2024-01-01T00:00:00Z"}})
    assert added == [("dying", DELETION_GRACE_PERIOD)]


@pytest.mark.parametrize(("grace", "finalizer", "wait"), [(30, False, 16), (0, True, 8)])
async def test_remaining_content_requeues_after_half_the_estimate(grace: int, finalizer: bool, wait: int) -> None:
    api = FakeApi()
    api.add_namespace(deleted_ago=0)
    meta = {"finalizers": ["x.io/f"]} if finalizer else {}
    api.add("pods", "p", spec={"nodeName": "n", "terminationGracePeriodSeconds": grace}, metadata=meta)
    controller = await make_controller(api)
    controller.namespaces.indexer.upsert(copy.deepcopy(api.namespaces[NS]))
    with pytest.raises(RequeueAfter) as again:
        await controller.sync(NS)
    assert again.value.seconds == wait


async def test_namespace_missing_from_cache_is_done() -> None:
    api = FakeApi()
    api.add_namespace()
    controller = await make_controller(api)
    await controller.sync(NS)
    assert api.calls == []


def test_the_deletion_timestamp_is_read_as_unix_seconds_and_an_unreadable_one_as_now() -> None:
    assert _deletion_timestamp({"metadata": {}}) is None
    assert _deletion_timestamp({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}) == 1_704_067_200.0
    unreadable = _deletion_timestamp({"metadata": {"deletionTimestamp": "yesterday"}})
    assert unreadable is not None and abs(unreadable - time.time()) < 5  # as if just deleted
