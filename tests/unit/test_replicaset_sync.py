"""syncReplicaSet and the event handlers against an in-memory API and hand-fed caches (see
replicaset_harness.py), scenarios 1-13: ownership, adoption, replacement and which pods go first.
"""

from __future__ import annotations

import logging
import time

import pytest

from pykcm.controllers.replicaset import controller as rs_controller
from pykcm.controllers.replicaset.scaling import related_pods
from pykcm.util.apitime import format_time
from pykcm.util.log import kobj, kobj_slice, kref
from tests.support import LoopTurns
from tests.unit.replicaset_harness import NS, Harness, make_pod, make_rs, ready_status


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
    with pytest.raises(Exception, match=r"has just been deleted at 2024-01-01 00:00:00 \+0000 UTC$"):  # as Go prints it
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


async def test_the_namespace_scan_for_related_pods_hands_the_loop_back(h: Harness,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # KCM scans the namespace's pods for each sibling of a scaled-down ReplicaSet too, on its own
    # goroutine; here the scan shares the loop: 10,000 pods took ~0.1 s in one step.
    import pykcm.util.timeslice as timeslice

    monkeypatch.setattr(timeslice, "SLICE", 0.0)  # every pod is a slice
    rs = make_rs(replicas=1)
    rs["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "dep-uid", "controller": True}]
    h.add_rs(rs)
    for i in range(20):
        h.add_pod(make_pod(f"p{i}", owner=rs, status=ready_status()))
    async with LoopTurns() as turns:
        related = await related_pods(h.ctrl.replica_sets_with_same_controller(rs), h.ctrl.selector_of,
                                     h.ctrl.pods.indexer.in_namespace)
    assert len(related) == 20 and turns.count >= 20


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


DEPLOYMENT_REF = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "dep-uid", "controller": True}


def lines(caplog: pytest.LogCaptureFixture, *messages: str) -> list[tuple[str, dict]]:
    return [(r.getMessage(), r.kv) for r in caplog.records if r.getMessage() in messages]  # type: ignore[attr-defined]


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_a_scale_down_names_the_related_replica_sets_and_pods_as_kcm(
    h: Harness, verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    # getReplicaSetsWithSameController's V(2) line and getIndirectlyRelatedPods' V(4) one, as KObjSlices.
    rs, old = make_rs(replicas=1), make_rs("old", replicas=0)
    for obj in (rs, old):
        obj["metadata"]["ownerReferences"] = [DEPLOYMENT_REF]
        h.add_rs(obj)
    pods = [h.add_pod(make_pod(f"p{i}", owner=rs, status=ready_status())) for i in range(2)]
    pods.append(h.add_pod(make_pod("old-1", labels={"app": "old"}, owner=old)))
    h.add_pod(make_pod("stranger", labels={"app": "other"}))
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await h.sync()
    [(_, found_rs)], [(_, found_pods)] = lines(caplog, "Found related ReplicaSets"), lines(caplog, "Found related pods")
    assert found_rs["replicaSet"] == kref(NS, "web")
    assert sorted(map(str, found_rs["relatedReplicaSets"].refs)) == ["ns/old", "ns/web"]
    assert (found_pods["kind"], found_pods["replicaSet"]) == ("ReplicaSet", kref(NS, "web"))
    assert sorted(found_pods["pods"].refs, key=str) == sorted(map(kobj, pods), key=str)  # not the stranger


async def test_the_related_lines_build_no_slices_below_their_verbosity(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A KObjSlice of 10,000 pods is costly: KCM builds the ReplicaSets' only when V(2) is on.
    monkeypatch.setattr(rs_controller, "kobj_slice", lambda objs: pytest.fail("built at -v=0"))
    rs = make_rs(replicas=1)
    rs["metadata"]["ownerReferences"] = [DEPLOYMENT_REF]
    h.add_rs(rs)
    for i in range(2):
        h.add_pod(make_pod(f"p{i}", owner=rs, status=ready_status()))
    await h.sync()
    assert len(h.api.verbs("delete")) == 1


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_a_replica_set_without_controller_is_kcms_unhandled_error_on_scale_down(
    h: Harness, verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    rs = h.add_rs(make_rs(replicas=1))
    for i in range(2):
        h.add_pod(make_pod(f"p{i}", owner=rs, status=ready_status()))
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await h.sync()
    [record] = [r for r in caplog.records if "no controller" in r.getMessage() + str(r.kv)]  # type: ignore[attr-defined]
    assert record.levelno == logging.ERROR and record.getMessage() == "Unhandled Error"
    assert record.kv == {"logger": "UnhandledError", "err": "ReplicaSet has no controller: ns/web"}  # type: ignore[attr-defined]
    assert lines(caplog, "Found related ReplicaSets") == []  # KCM returns before it
    [(_, found_pods)] = lines(caplog, "Found related pods")
    assert found_pods["pods"] == kobj_slice([])


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_an_orphan_pod_added_is_logged_only_when_a_replica_set_matches_it(
    h: Harness, verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    h.add_rs(make_rs())
    with caplog.at_level(logging.INFO, logger="pykcm"):
        h.ctrl.pod_added(make_pod("stray", labels={"app": "other"}))
        h.ctrl.pod_added(make_pod("orphan"))
    assert lines(caplog, "Orphan Pod created") == [
        ("Orphan Pod created", {"logger": "replicaset-controller", "pod": kref(NS, "orphan")})]  # a handler's: named
