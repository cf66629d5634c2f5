"""syncReplicaSet and the event handlers against an in-memory API and hand-fed caches.

The caches are filled directly (no watch), so each test decides exactly what the controller
"has seen"; `deliver_created` plays the watch for pods the fake API created.
"""

from __future__ import annotations

import copy
import itertools
import time
from typing import Any

import pytest

from pykcm.app.options import Options
from pykcm.client.errors import Conflict, Forbidden, Invalid, NotFound, error_from_status
from pykcm.client.resources import PODS, Resource
from pykcm.controller import ControllerContext, RequeueAfter
from pykcm.controller.consistency import StaleCacheError
from pykcm.controllers.replicaset import ReplicaSetController
from pykcm.controllers.replicaset.controller import STALE_CACHE_RETRY
from pykcm.controllers.replicaset.metrics import stale_sync_skips
from pykcm.informers.delta_queue import Delta, DeltaType
from pykcm.informers.factory import SharedInformerFactory
from pykcm.informers.store import DeletedFinalStateUnknown
from pykcm.util.apitime import format_time

NS = "ns"


class FakeEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, obj: dict, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]


class FakeApi:
    """The few RestClient calls the controller makes, over an in-memory object map."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, Any]] = []
        self.objects: dict[tuple[str, str, str], dict] = {}
        self._rv = itertools.count(1000)
        self._names = itertools.count(1)
        self.fail: dict[str, Exception | None] = {}  # verb -> error to raise (once if in fail_once)
        self.fail_once: set[str] = set()

    def _maybe_fail(self, verb: str) -> None:
        err = self.fail.get(verb)
        if err is not None:
            if verb in self.fail_once:
                self.fail[verb] = None
            raise err

    def verbs(self, verb: str, plural: str = "pods") -> list[Any]:
        return [c[3] for c in self.calls if c[0] == verb and c[1] == plural]

    def put(self, plural: str, obj: dict) -> dict:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[(plural, obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return copy.deepcopy(obj)

    async def create(self, res: Resource, body: dict, namespace: str | None = None) -> dict:
        self.calls.append(("create", res.plural, namespace or "", body))
        self._maybe_fail("create")
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        meta.setdefault("name", f"{meta.pop('generateName', 'x-')}{next(self._names):05d}")
        meta.update(namespace=namespace, uid=f"uid-{meta['name']}", creationTimestamp=format_time(time.time()))
        return self.put(res.plural, obj)

    async def delete(self, res: Resource, name: str, namespace: str | None = None, **_: Any) -> dict:
        self.calls.append(("delete", res.plural, namespace or "", name))
        self._maybe_fail("delete")
        obj = self.objects.pop((res.plural, namespace or "", name), None)
        if obj is None:
            raise NotFound(404, "NotFound", f'{res.plural} "{name}" not found')
        return obj

    async def patch(self, res: Resource, name: str, body: dict, namespace: str | None = None, **_: Any) -> dict:
        self.calls.append(("patch", res.plural, namespace or "", body))
        self._maybe_fail("patch")
        obj = self.objects.get((res.plural, namespace or "", name))
        if obj is None:
            raise NotFound(404, "NotFound", f'{res.plural} "{name}" not found')
        refs = obj["metadata"].setdefault("ownerReferences", [])
        for ref in body["metadata"]["ownerReferences"]:
            if ref.get("$patch") == "delete":
                refs[:] = [r for r in refs if r["uid"] != ref["uid"]]
            elif ref.get("controller") and any(r.get("controller") for r in refs):
                raise Invalid(422, "Invalid", "Only one reference can have Controller set to true")
            else:
                refs.append(ref)
        return self.put(res.plural, obj)

    async def update(self, res: Resource, body: dict, subresource: str | None = None) -> dict:
        self.calls.append(("update", res.plural, subresource or "", copy.deepcopy(body)))
        self._maybe_fail("update")
        return self.put(res.plural, copy.deepcopy(body))

    async def get(self, res: Resource, name: str, namespace: str | None = None, subresource: str | None = None) -> dict:
        self.calls.append(("get", res.plural, namespace or "", name))
        obj = self.objects.get((res.plural, namespace or "", name))
        if obj is None:
            raise NotFound(404, "NotFound", f'{res.plural} "{name}" not found')
        return copy.deepcopy(obj)


def make_rs(name: str = "web", replicas: int = 2, uid: str | None = None, **spec: Any) -> dict:
    rs = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": NS, "uid": uid or f"uid-{name}", "generation": 1,
                     "resourceVersion": "1"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
            **spec,
        },
        "status": {"replicas": 0},
    }
    return rs


def make_pod(name: str, labels: dict | None = None, owner: dict | None = None, **extra: Any) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "5",
                            "labels": labels if labels is not None else {"app": "web"},
                            "creationTimestamp": format_time(time.time() - 100)}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    meta.update(extra.pop("meta", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": extra.pop("spec", {"nodeName": "n1"}),
            "status": extra.pop("status", {"phase": "Running"})}


def ready_status(seconds_ago: float = 3600) -> dict:
    since = format_time(time.time() - seconds_ago)
    return {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": since}]}


class Harness:
    def __init__(self) -> None:
        self.api = FakeApi()
        self.events = FakeEvents()
        ctx = ControllerContext(client=self.api, informers=SharedInformerFactory(self.api),  # type: ignore[arg-type]
                                options=Options(), events=self.events)  # type: ignore[arg-type]
        self.ctrl = ReplicaSetController(ctx)
        self.after: list[tuple[str, float]] = []
        original = self.ctrl.queue.add_after
        self.ctrl.queue.add_after = lambda key, delay: (self.after.append((key, delay)), original(key, delay))[1]

    def add_rs(self, rs: dict) -> dict:
        self.api.put("replicasets", copy.deepcopy(rs))
        self.ctrl.replica_sets.indexer.upsert(rs)
        return rs

    def add_pod(self, pod: dict) -> dict:
        self.api.objects[("pods", NS, pod["metadata"]["name"])] = copy.deepcopy(pod)
        self.ctrl.pods.indexer.upsert(pod)
        return pod

    def deliver_created(self) -> int:
        """Play the watch: every pod the API has but the cache doesn't, as an add event."""
        n = 0
        for (plural, _, _), obj in list(self.api.objects.items()):
            if plural == "pods" and self.ctrl.pods.indexer.get_by(NS, obj["metadata"]["name"]) is None:
                pod = copy.deepcopy(obj)
                self.ctrl.pods._apply(Delta(DeltaType.ADDED, pod, pod["metadata"]["resourceVersion"]))
                n += 1
        return n

    def refresh_rs(self, name: str = "web") -> dict:
        """Play the watch for the ReplicaSet: cache = what the API has now."""
        rs = copy.deepcopy(self.api.objects[("replicasets", NS, name)])
        self.ctrl.replica_sets._apply(Delta(DeltaType.UPDATED, rs, rs["metadata"]["resourceVersion"]))
        return rs

    async def sync(self, name: str = "web") -> None:
        await self.ctrl.sync(f"{NS}/{name}")

    def last_status(self) -> dict:
        return self.api.verbs("update", "replicasets")[-1]["status"]


@pytest.fixture
def h() -> Harness:
    return Harness()


async def test_scenario_01_pod_of_another_controller_is_ignored(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=2))
    other = {"metadata": {"name": "web", "uid": "someone-else"}}
    h.add_pod(make_pod("foreign", owner=other))
    await h.sync()
    assert h.api.verbs("patch") == []
    assert len(h.api.verbs("create")) == 2
    assert h.last_status()["replicas"] == 0
    assert h.ctrl.expectations.get("ns/web").add == 2
    del rs


async def test_scenario_02_600_replicas_500_per_sync_rest_after_observed(h: Harness) -> None:
    h.add_rs(make_rs(replicas=600))
    await h.sync()
    assert len(h.api.verbs("create")) == 500
    await h.sync()  # re-enqueued (e.g. status update) before the pods are seen
    assert len(h.api.verbs("create")) == 500
    assert h.deliver_created() == 500
    assert h.ctrl.expectations.satisfied("ns/web")
    await h.sync()
    assert len(h.api.verbs("create")) == 600


async def test_scenario_03_deleted_pod_replaced_with_event(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=3))
    pods = [h.add_pod(make_pod(f"p{i}", owner=rs)) for i in range(3)]
    await h.sync()
    assert h.api.verbs("create") == []
    gone = h.ctrl.pods.indexer.delete("ns/p0")
    h.ctrl.pod_deleted(gone)
    await h.sync()
    (created,) = h.api.verbs("create")
    assert created["metadata"]["generateName"] == "web-"
    name = next(n for (p, _, n) in h.api.objects if p == "pods" and n.startswith("web-"))
    assert ("Normal", "SuccessfulCreate", f"Created pod: {name}") in h.events.events
    del pods


async def test_scenario_04_unmatched_owned_pod_is_released(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=1))
    h.add_pod(make_pod("relabelled", labels={"app": "other"}, owner=rs))
    await h.sync()
    assert h.api.verbs("patch") == [
        {"metadata": {"uid": "uid-relabelled", "ownerReferences": [{"$patch": "delete", "uid": "uid-web"}]}}
    ]
    assert len(h.api.verbs("create")) == 1
    assert h.api.verbs("delete") == []


async def test_scenario_05_orphan_adopted_nothing_created(h: Harness) -> None:
    h.add_rs(make_rs(replicas=1))
    h.add_pod(make_pod("orphan"))
    await h.sync()
    assert h.api.verbs("get", "replicasets") == ["web"]  # the uncached recheck, once
    assert h.api.verbs("patch") == [{"metadata": {"ownerReferences": [{
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "uid-web",
        "controller": True, "blockOwnerDeletion": True}], "uid": "uid-orphan"}}]
    assert h.api.verbs("create") == []
    assert h.last_status()["replicas"] == 1


async def test_can_adopt_checked_once_per_sync(h: Harness) -> None:
    h.add_rs(make_rs(replicas=3))
    for i in range(3):
        h.add_pod(make_pod(f"orphan{i}"))
    await h.sync()
    assert len(h.api.verbs("get", "replicasets")) == 1
    assert len(h.api.verbs("patch")) == 3


async def test_scenario_06_terminating_orphan_not_adopted(h: Harness) -> None:
    h.add_rs(make_rs(replicas=1))
    h.add_pod(make_pod("dying", meta={"deletionTimestamp": format_time(time.time())}))
    await h.sync()
    assert h.api.verbs("patch") == []
    assert len(h.api.verbs("create")) == 1
    assert h.last_status()["replicas"] == 0


async def test_scenario_07_deleting_rs_only_writes_status(h: Harness) -> None:
    rs = make_rs(replicas=3)
    rs["metadata"]["deletionTimestamp"] = format_time(time.time())
    h.add_rs(rs)
    h.add_pod(make_pod("orphan"))
    h.add_pod(make_pod("relabelled", labels={"app": "x"}, owner=rs))
    await h.sync()
    assert [c[0] for c in h.api.calls] == ["update"]
    assert h.last_status()["replicas"] == 0


async def test_scenario_08_recreated_rs_detected_by_live_get(h: Harness) -> None:
    h.add_rs(make_rs(replicas=1))
    h.add_pod(make_pod("orphan"))
    h.api.objects[("replicasets", NS, "web")]["metadata"]["uid"] = "new-uid"  # deleted + recreated
    with pytest.raises(Exception, match="is gone: got uid new-uid, wanted uid-web"):
        await h.sync()
    assert h.api.verbs("patch") == []
    assert h.api.verbs("update", "replicasets") == []  # claim errors skip the status write


async def test_adoption_refused_while_rs_is_being_deleted_live(h: Harness) -> None:
    h.add_rs(make_rs(replicas=1))
    h.add_pod(make_pod("orphan"))
    h.api.objects[("replicasets", NS, "web")]["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    with pytest.raises(Exception, match="has just been deleted"):
        await h.sync()
    assert h.api.verbs("patch") == []


async def test_scenario_09_terminating_pod_replaced_and_counted_as_terminating(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=2))
    h.add_pod(make_pod("ok", owner=rs))
    h.add_pod(make_pod("leaving", owner=rs, meta={"deletionTimestamp": format_time(time.time())}))
    await h.sync()
    assert len(h.api.verbs("create")) == 1
    status = h.last_status()
    assert status["replicas"] == 1 and status["terminatingReplicas"] == 1


async def test_scenario_10_finished_pods_not_counted_nor_deleted(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=2))
    h.add_pod(make_pod("done", owner=rs, status={"phase": "Succeeded"}))
    h.add_pod(make_pod("crashed", owner=rs, status={"phase": "Failed"}))
    await h.sync()
    assert len(h.api.verbs("create")) == 2
    assert h.api.verbs("delete") == []
    assert h.last_status()["replicas"] == 0
    assert h.last_status()["terminatingReplicas"] == 0


async def test_scenario_11_scale_down_deletes_least_ready(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=2))
    h.add_pod(make_pod("r1", owner=rs, status=ready_status(100)))
    h.add_pod(make_pod("r2", owner=rs, status=ready_status(200)))
    h.add_pod(make_pod("not-ready", owner=rs, status={"phase": "Running"}))
    h.add_pod(make_pod("pending", owner=rs, status={"phase": "Pending"}))
    h.add_pod(make_pod("unscheduled", owner=rs, spec={}, status={"phase": "Pending"}))
    await h.sync()
    assert sorted(h.api.verbs("delete")) == ["not-ready", "pending", "unscheduled"]
    assert h.ctrl.expectations.get("ns/web").delete == 3
    assert {r for _, r, _ in h.events.events} == {"SuccessfulDelete"}


async def test_scenario_12_deletion_cost_decides(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=1))
    for name, cost in (("keep", "100"), ("drop", "-10")):
        h.add_pod(make_pod(name, owner=rs, status=ready_status(),
                           meta={"annotations": {"controller.kubernetes.io/pod-deletion-cost": cost}}))
    await h.sync()
    assert h.api.verbs("delete") == ["drop"]


async def test_scenario_13_colocated_pod_deleted_first(h: Harness) -> None:
    # Ranks count pods of ReplicaSets sharing our controller (e.g. a Deployment's).
    deployment_ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "dep-uid", "controller": True}
    rs = make_rs(replicas=2)
    rs["metadata"]["ownerReferences"] = [deployment_ref]
    h.add_rs(rs)
    for name, node in (("a1", "node-a"), ("a2", "node-a"), ("b1", "node-b")):
        h.add_pod(make_pod(name, owner=rs, spec={"nodeName": node}, status=ready_status()))
    await h.sync()
    (victim,) = h.api.verbs("delete")
    assert victim in ("a1", "a2")


async def test_scenario_14_15_quota_rejection_one_attempt_event_condition_retry_then_cleared(h: Harness) -> None:
    h.add_rs(make_rs(replicas=10))
    quota = Forbidden(403, "Forbidden", 'pods "web-x" is forbidden: exceeded quota: q, requested: pods=1')
    h.api.fail["create"] = quota
    with pytest.raises(Forbidden):
        await h.sync()
    assert len(h.api.verbs("create")) == 1
    assert h.events.events == [("Warning", "FailedCreate", f"Error creating: {quota.message}")]
    (cond,) = h.last_status()["conditions"]
    assert (cond["type"], cond["status"], cond["reason"], cond["message"]) == (
        "ReplicaFailure", "True", "FailedCreate", quota.message)
    assert h.ctrl.expectations.satisfied("ns/web")  # the 9 skipped + 1 failed were un-expected
    # Scenario 15: quota raised; the next sync succeeds and clears the condition.
    h.api.fail["create"] = None
    h.refresh_rs()
    await h.sync()
    assert len(h.api.verbs("create")) == 11
    assert "conditions" not in h.last_status()


async def test_scenario_16_namespace_terminating_is_silent(h: Harness) -> None:
    h.add_rs(make_rs(replicas=3))
    h.api.fail["create"] = error_from_status(403, {
        "kind": "Status", "reason": "Forbidden", "message": "namespace ns is being terminated",
        "details": {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]}})
    await h.sync()  # no error, so no backoff retry either
    assert h.events.events == []
    assert "conditions" not in h.last_status()


async def test_scenario_17_no_new_creates_while_watch_lags(h: Harness) -> None:
    h.add_rs(make_rs(replicas=3))
    await h.sync()
    assert len(h.api.verbs("create")) == 3
    h.refresh_rs()  # our own status update comes back and re-enqueues
    await h.sync()
    assert len(h.api.verbs("create")) == 3
    h.deliver_created()
    h.refresh_rs()
    await h.sync()
    assert len(h.api.verbs("create")) == 3
    assert h.last_status()["replicas"] == 3


async def test_scenario_18_graceful_delete_counted_once(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=1))
    for i in range(3):
        h.add_pod(make_pod(f"p{i}", owner=rs, status=ready_status(100 * (i + 1))))
    await h.sync()
    victims = h.api.verbs("delete")
    assert len(victims) == 2
    for name in victims:
        old = h.ctrl.pods.indexer.get(f"ns/{name}")
        terminating = copy.deepcopy(old)
        terminating["metadata"].update(deletionTimestamp=format_time(time.time()), resourceVersion="99")
        h.ctrl.pods.indexer.upsert(terminating)
        h.ctrl.pod_updated(old, terminating)
        h.ctrl.pods.indexer.delete(f"ns/{name}")
        h.ctrl.pod_deleted(terminating)
    exp = h.ctrl.expectations.get("ns/web")
    assert (exp.add, exp.delete) == (0, 0)


async def test_scenario_19_recreated_rs_not_blocked_by_old_expectations(h: Harness) -> None:
    old = h.add_rs(make_rs(replicas=3))
    await h.sync()
    assert not h.ctrl.expectations.satisfied("ns/web")
    new = make_rs(replicas=3, uid="uid-web-2")
    h.ctrl.replica_sets.indexer.upsert(new)
    h.api.put("replicasets", copy.deepcopy(new))
    h.ctrl.rs_updated(old, new)  # delete + create seen as one update
    assert h.ctrl.expectations.satisfied("ns/web")
    await h.sync()
    assert len(h.api.verbs("create")) == 6


async def test_rs_delete_tombstone_clears_expectations(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=3))
    await h.sync()
    h.ctrl.replica_sets.indexer.delete("ns/web")
    h.ctrl.rs_deleted(DeletedFinalStateUnknown("ns/web", rs))
    assert h.ctrl.expectations.get("ns/web") is None
    await h.sync()  # NotFound in cache: nothing to do
    assert len(h.api.verbs("create")) == 3


async def test_scenario_20_steady_state_writes_nothing(h: Harness) -> None:
    rs = make_rs(replicas=1)
    rs["status"] = {"replicas": 1, "fullyLabeledReplicas": 1, "readyReplicas": 1, "availableReplicas": 1,
                    "terminatingReplicas": 0, "observedGeneration": 1}
    h.add_rs(rs)
    h.add_pod(make_pod("p", labels={"app": "web"}, owner=rs, status=ready_status()))
    await h.sync()
    assert h.api.calls == []


async def test_scenario_21_generation_bump_writes_observed_generation(h: Harness) -> None:
    rs = make_rs(replicas=0)
    rs["metadata"]["generation"] = 2
    rs["status"] = {"replicas": 0, "terminatingReplicas": 0, "observedGeneration": 1}
    h.add_rs(rs)
    await h.sync()
    assert h.last_status()["observedGeneration"] == 2


async def test_status_conflict_retried_once_after_fresh_get(h: Harness) -> None:
    h.add_rs(make_rs(replicas=0))
    h.api.fail["update"] = Conflict(409, "Conflict", "the object has been modified")
    h.api.fail_once.add("update")
    await h.sync()
    assert [c[0] for c in h.api.calls] == ["update", "get", "update"]


async def test_status_write_failing_twice_raises(h: Harness) -> None:
    h.add_rs(make_rs(replicas=0))
    h.api.fail["update"] = Conflict(409, "Conflict", "the object has been modified")
    with pytest.raises(Conflict):
        await h.sync()
    assert [c[0] for c in h.api.calls] == ["update", "get", "update"]


async def test_scenario_22_requeued_when_next_pod_becomes_available(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=1, minReadySeconds=10))
    h.add_pod(make_pod("p", owner=rs, status=ready_status(4)))
    await h.sync()
    status = h.last_status()
    assert (status["readyReplicas"], status["availableReplicas"]) == (1, 0)
    ((key, delay),) = h.after
    assert key == "ns/web" and 4 <= delay <= 7


async def test_manage_error_returns_before_the_availability_recheck_as_1_36_does(h: Harness) -> None:
    """kubernetes v1.36.3 replica_set.go syncReplicaSet: `if manageReplicasErr != nil { return
    manageReplicasErr }` comes before the minReadySeconds AddAfter. The rate-limited retry of
    the error re-evaluates availability itself, so no delayed recheck is planned on top."""
    rs = h.add_rs(make_rs(replicas=2, minReadySeconds=10))
    h.add_pod(make_pod("p", owner=rs, status=ready_status(4)))
    h.api.fail["create"] = Forbidden(403, "Forbidden", "exceeded quota")
    with pytest.raises(Forbidden):
        await h.sync()
    status = h.last_status()  # status is still written first
    assert (status["readyReplicas"], status["availableReplicas"]) == (1, 0)
    assert h.after == []


async def test_scenario_22_pod_turning_ready_requeues_after_min_ready(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=1, minReadySeconds=10))
    old = h.add_pod(make_pod("p", owner=rs, status={"phase": "Running"}))
    new = copy.deepcopy(old)
    new["status"] = ready_status(0)
    new["metadata"]["resourceVersion"] = "6"
    h.ctrl.pod_updated(old, new)
    assert h.after == [("ns/web", 10)]


async def test_scenario_23_created_pod_matches_template(h: Harness) -> None:
    rs = make_rs(replicas=1)
    rs["spec"]["template"]["metadata"].update(annotations={"note": "x"}, finalizers=["example.com/f"])
    h.add_rs(rs)
    await h.sync()
    (body,) = h.api.verbs("create")
    assert body["metadata"]["generateName"] == "web-"
    assert body["metadata"]["labels"] == {"app": "web"}
    assert body["metadata"]["annotations"] == {"note": "x"}
    assert body["metadata"]["finalizers"] == ["example.com/f"]
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                                                    "uid": "uid-web", "controller": True, "blockOwnerDeletion": True}]


async def test_scenario_24_overlapping_selectors_one_owner(h: Harness) -> None:
    for name in ("a", "b"):
        rs = make_rs(name=name, replicas=1)
        rs["spec"]["selector"] = {"matchLabels": {"app": "shared"}}
        rs["spec"]["template"]["metadata"]["labels"] = {"app": "shared"}
        h.add_rs(rs)
    orphan = h.add_pod(make_pod("orphan", labels={"app": "shared"}))
    enqueued = []
    h.ctrl.enqueue = lambda obj: enqueued.append(obj["metadata"]["name"])  # type: ignore[method-assign]
    h.ctrl.pod_added(orphan)
    assert sorted(enqueued) == ["a", "b"]
    await h.sync("a")
    h.add_pod(copy.deepcopy(h.api.objects[("pods", NS, "orphan")]))  # watch delivers the adoption
    await h.sync("b")
    statuses = {c[3]["metadata"]["name"]: c[3]["status"]["replicas"] for c in h.api.calls if c[0] == "update"}
    assert statuses == {"a": 1, "b": 0}


async def test_scenario_24_concurrent_adoption_loser_gets_invalid(h: Harness) -> None:
    rs = make_rs(name="b", replicas=1)
    rs["spec"]["selector"] = {"matchLabels": {"app": "shared"}}
    h.add_rs(rs)
    cached_orphan = make_pod("orphan", labels={"app": "shared"})
    h.add_pod(cached_orphan)
    winner = {"metadata": {"name": "a", "uid": "uid-a"}}
    h.api.objects[("pods", NS, "orphan")] = make_pod("orphan", labels={"app": "shared"}, owner=winner)
    with pytest.raises(Invalid):
        await h.sync("b")  # our cache still shows an orphan; the apiserver refuses a second controller
    assert h.api.verbs("create") == []


async def test_scenario_25_same_name_different_uid_ignored(h: Harness) -> None:
    h.add_rs(make_rs(replicas=1))
    impostor = make_pod("impostor", owner={"metadata": {"name": "web", "uid": "stale-uid"}})
    h.add_pod(impostor)
    h.ctrl.expectations.expect_creations("ns/web", 1)
    h.ctrl.pod_added(impostor)
    assert h.ctrl.expectations.get("ns/web").add == 1  # not a creation of ours
    assert len(h.ctrl.queue) == 0
    h.ctrl.expectations.delete("ns/web")
    await h.sync()
    assert h.api.verbs("patch") == []
    assert len(h.api.verbs("create")) == 1


async def test_invalid_selector_logged_not_retried(h: Harness) -> None:
    rs = make_rs(replicas=1)
    rs["spec"]["selector"] = {"matchExpressions": [{"key": "app", "operator": "Bogus"}]}
    h.add_rs(rs)
    await h.sync()  # no exception: KCM does not retry a spec it cannot read
    assert h.api.calls == []


async def test_template_without_labels_fails_without_api_call(h: Harness) -> None:
    rs = make_rs(replicas=1)
    rs["spec"]["template"]["metadata"] = {}
    h.add_rs(rs)
    with pytest.raises(Exception, match="unable to create pods, no labels"):
        await h.sync()
    assert h.api.verbs("create") == []
    assert h.last_status()["conditions"][0]["message"] == "unable to create pods, no labels"


async def test_failed_delete_event_condition_and_expectation(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=0))
    h.add_pod(make_pod("p", owner=rs))
    h.api.fail["delete"] = Forbidden(403, "Forbidden", "nope")
    with pytest.raises(Exception, match="unable to delete pods: nope"):
        await h.sync()
    assert h.events.events == [("Warning", "FailedDelete", "Error deleting: nope")]
    assert h.last_status()["conditions"][0]["reason"] == "FailedDelete"
    assert h.ctrl.expectations.satisfied("ns/web")


async def test_delete_not_found_is_not_an_error(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=0))
    h.ctrl.pods.indexer.upsert(make_pod("ghost", owner=rs))  # cached, already gone from the API
    await h.sync()
    assert h.events.events == []
    assert h.ctrl.expectations.satisfied("ns/web")


async def test_stale_rs_cache_skips_sync(h: Harness) -> None:
    h.add_rs(make_rs(replicas=0))
    rv = h.ctrl.replica_sets.indexer.get("ns/web")["metadata"]["resourceVersion"]
    h.ctrl.replica_sets._apply(Delta(DeltaType.BOOKMARK, None, rv))
    before = stale_sync_skips.labels("apps", "replicasets")._value.get()
    await h.sync()  # writes status at a newer resourceVersion than the cache has seen
    with pytest.raises(RequeueAfter):
        await h.sync()
    assert stale_sync_skips.labels("apps", "replicasets")._value.get() == before + 1
    h.refresh_rs()  # the watch delivers our write
    await h.sync()


async def test_orphan_update_enqueues_matching_rs_only_on_label_change(h: Harness) -> None:
    h.add_rs(make_rs(replicas=1))
    old = make_pod("o", labels={"app": "nope"})
    new = copy.deepcopy(old)
    new["metadata"].update(labels={"app": "web"}, resourceVersion="6")
    h.ctrl.pod_updated(old, new)
    assert len(h.ctrl.queue) == 1
    same = copy.deepcopy(new)
    same["metadata"]["resourceVersion"] = "7"
    h.ctrl.queue = type(h.ctrl.queue)("t")
    h.ctrl.pod_updated(new, same)
    assert len(h.ctrl.queue) == 0


async def test_stale_pod_cache_skips_sync_until_created_pods_seen(h: Harness) -> None:
    h.add_rs(make_rs(replicas=2))
    h.ctrl.pods._apply(Delta(DeltaType.BOOKMARK, None, "1"))  # the pod cache has seen something
    await h.sync()
    assert len(h.api.verbs("create")) == 2
    h.refresh_rs()
    with pytest.raises(RequeueAfter) as skipped:
        await h.sync()  # our creates are newer than anything the pod cache has delivered
    assert isinstance(skipped.value.__cause__, StaleCacheError) and "pods" in str(skipped.value.__cause__)
    assert skipped.value.seconds == STALE_CACHE_RETRY  # a fixed look-again, not the error backoff
    h.deliver_created()
    await h.sync()
    assert len(h.api.verbs("create")) == 2


async def test_release_is_not_recorded_as_our_write(h: Harness) -> None:
    rs = h.add_rs(make_rs(replicas=0))
    h.add_pod(make_pod("moved", labels={"app": "other"}, owner=rs))
    await h.sync()
    assert len(h.api.verbs("patch")) == 1
    written = h.ctrl.consistency.written("ns/web")
    assert written and PODS not in written  # our status write only: a released pod is not ours
