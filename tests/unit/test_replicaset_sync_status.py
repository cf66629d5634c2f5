"""syncReplicaSet and the event handlers against an in-memory API and hand-fed caches (see
replicaset_harness.py), scenarios 14-25 and the failure paths: quota and namespace errors,
expectations, status writes, availability, and caches that lag the API.
"""

from __future__ import annotations

import asyncio
import copy
import time

import pytest

from pykcm.client.errors import Conflict, Forbidden, Invalid, error_from_status
from pykcm.client.resources import PODS
from pykcm.controller import RequeueAfter
from pykcm.controller.consistency import StaleCacheError
from pykcm.controllers.replicaset.controller import STALE_CACHE_RETRY
from pykcm.controllers.replicaset.metrics import stale_sync_skips
from pykcm.informers.delta_queue import Delta, DeltaType
from pykcm.informers.store import DeletedFinalStateUnknown
from pykcm.util.apitime import format_time
from tests.unit.replicaset_harness import NS, Harness, make_pod, make_rs, ready_status


@pytest.fixture
def h() -> Harness:
    return Harness()


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


async def test_a_write_the_informer_is_about_to_apply_is_waited_for_not_skipped(h: Harness) -> None:
    # The informers share the workers' loop: one turn lets them apply an event already read
    # (here our own status write), where KCM's informer goroutine would have applied it meanwhile.
    h.add_rs(make_rs(replicas=0))
    rv = h.ctrl.replica_sets.indexer.get("ns/web")["metadata"]["resourceVersion"]
    h.ctrl.replica_sets._apply(Delta(DeltaType.BOOKMARK, None, rv))
    await h.sync()
    before = stale_sync_skips.labels("apps", "replicasets")._value.get()
    asyncio.get_running_loop().call_soon(h.refresh_rs)  # the watch event, due on the next turn
    await h.sync()
    assert stale_sync_skips.labels("apps", "replicasets")._value.get() == before


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
