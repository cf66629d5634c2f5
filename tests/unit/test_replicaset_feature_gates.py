"""The ReplicaSet controller with KCM's feature gates turned off (`--feature-gates`), against the
in-memory API and hand-fed caches of replicaset_harness.py: DeploymentReplicaSetTerminatingReplicas,
StaleControllerConsistencyReplicaSet and PodDeletionCost, each beta and on by default in KCM v1.36.3."""

from __future__ import annotations

import time

import pytest

from pykcm.client.resources import Resource
from pykcm.controller import RequeueAfter
from pykcm.controllers.replicaset.metrics import stale_sync_skips
from pykcm.informers.delta_queue import Delta, DeltaType
from pykcm.util.apitime import format_time
from tests.unit.replicaset_harness import Harness, make_pod, make_rs, ready_status

TERMINATING_OFF = {"DeploymentReplicaSetTerminatingReplicas": False}
CONSISTENCY_OFF = {"StaleControllerConsistencyReplicaSet": False}
STEADY = {"replicas": 1, "fullyLabeledReplicas": 1, "readyReplicas": 1, "availableReplicas": 1, "observedGeneration": 1}


def _terminating_pod(name: str, owner: dict) -> dict:
    return make_pod(name, owner=owner, meta={"deletionTimestamp": format_time(time.time())})


async def test_terminating_replicas_gate_off_leaves_the_field_out_of_the_status() -> None:
    h = Harness(TERMINATING_OFF)
    rs = h.add_rs(make_rs(replicas=2))
    h.add_pod(make_pod("ok", owner=rs))
    h.add_pod(_terminating_pod("leaving", rs))
    await h.sync()
    assert len(h.api.verbs("create")) == 1  # the terminating pod is replaced all the same
    status = h.last_status()
    assert status["replicas"] == 1 and "terminatingReplicas" not in status


async def test_terminating_replicas_gate_off_clears_a_count_written_before() -> None:
    # KCM's new status is nil there, and ptr.Equal(3, nil) is a change: the stale count goes.
    h = Harness(TERMINATING_OFF)
    rs = make_rs(replicas=1)
    rs["status"] = {**STEADY, "terminatingReplicas": 3}
    h.add_pod(make_pod("p", owner=h.add_rs(rs), status=ready_status()))
    await h.sync()
    assert h.last_status() == {**STEADY}


async def test_terminating_replicas_gate_off_an_unchanged_status_is_not_rewritten() -> None:
    # An apiserver with the gate off drops the field: the status it answers has none. With a
    # terminating pod among the ReplicaSet's, the count once made every sync a write.
    h = Harness(TERMINATING_OFF)
    rs = make_rs(replicas=1)
    rs["status"] = dict(STEADY)
    h.add_rs(rs)
    h.add_pod(make_pod("p", owner=rs, status=ready_status()))
    h.add_pod(_terminating_pod("leaving", rs))
    for _ in range(3):
        await h.sync()
    assert h.api.calls == []


async def test_terminating_replicas_gate_off_steady_after_its_own_write() -> None:
    # The differential run's case: the apiserver's gate off too, it drops the field from every write.
    h = Harness(TERMINATING_OFF)
    update = h.api.update

    async def update_dropping_the_field(res: Resource, body: dict, subresource: str | None = None) -> dict:
        body["status"].pop("terminatingReplicas", None)
        return await update(res, body, subresource)

    h.api.update = update_dropping_the_field  # type: ignore[method-assign]
    rs = h.add_rs(make_rs(replicas=1))
    h.add_pod(make_pod("p", owner=rs, status=ready_status()))
    h.add_pod(_terminating_pod("leaving", rs))
    await h.sync()
    assert len(h.api.verbs("update", "replicasets")) == 1
    for _ in range(3):
        h.refresh_rs()  # the watch brings our write back
        await h.sync()
    assert len(h.api.verbs("update", "replicasets")) == 1


async def test_consistency_gate_off_a_sync_after_our_own_write_is_not_skipped() -> None:
    h = Harness(CONSISTENCY_OFF)
    h.add_rs(make_rs(replicas=2))
    h.ctrl.pods._apply(Delta(DeltaType.BOOKMARK, None, "1"))  # the caches have seen something, not our writes
    rv = h.ctrl.replica_sets.indexer.get("ns/web")["metadata"]["resourceVersion"]
    h.ctrl.replica_sets._apply(Delta(DeltaType.BOOKMARK, None, rv))
    skips = [stale_sync_skips.labels(g, r)._value.get() for g, r in (("apps", "replicasets"), ("", "pods"))]
    await h.sync()  # creates 2 pods and writes status, newer than both caches
    assert len(h.api.verbs("create")) == 2
    assert h.ctrl.consistency.written("ns/web") == {} and len(h.ctrl.consistency) == 0  # nothing recorded
    await h.sync()  # with the gate on: RequeueAfter (test_replicaset_sync_status.py)
    assert [stale_sync_skips.labels(g, r)._value.get() for g, r in (("apps", "replicasets"), ("", "pods"))] == skips
    assert len(h.api.verbs("create")) == 2  # the expectations still hold the creates back


async def test_consistency_gate_on_by_default_skips_that_sync() -> None:
    h = Harness()
    h.add_rs(make_rs(replicas=0))
    rv = h.ctrl.replica_sets.indexer.get("ns/web")["metadata"]["resourceVersion"]
    h.ctrl.replica_sets._apply(Delta(DeltaType.BOOKMARK, None, rv))
    await h.sync()
    assert h.ctrl.consistency.written("ns/web")
    with pytest.raises(RequeueAfter):
        await h.sync()


@pytest.mark.parametrize(("gates", "deleted"), [({}, ["cheap"]), ({"PodDeletionCost": False}, ["recent"])])
async def test_pod_deletion_cost_gate(gates: dict[str, bool], deleted: list[str]) -> None:
    h = Harness(gates)
    rs = h.add_rs(make_rs(replicas=1))
    for name, cost, ready_for in (("cheap", "-10", 3600), ("recent", "100", 10)):
        h.add_pod(make_pod(name, owner=rs, status=ready_status(ready_for),
                           meta={"annotations": {"controller.kubernetes.io/pod-deletion-cost": cost}}))
    await h.sync()
    assert h.api.verbs("delete") == deleted  # without the cost, the pod ready for less time goes first


async def test_all_beta_false_turns_every_gate_off_a_named_gate_wins() -> None:
    h = Harness({"AllBeta": False, "StaleControllerConsistencyReplicaSet": True, "AtomicFIFO": True})
    assert not h.ctrl.count_terminating and not h.ctrl.use_deletion_cost
    rs = h.add_rs(make_rs(replicas=0))
    rv = h.ctrl.replica_sets.indexer.get("ns/web")["metadata"]["resourceVersion"]
    h.ctrl.replica_sets._apply(Delta(DeltaType.BOOKMARK, None, rv))
    h.add_pod(_terminating_pod("leaving", rs))
    await h.sync()
    assert "terminatingReplicas" not in h.last_status()
    with pytest.raises(RequeueAfter):  # the consistency check, named on, still runs
        await h.sync()
