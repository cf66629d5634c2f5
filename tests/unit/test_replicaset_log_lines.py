"""The ReplicaSet controller's lines as KCM 1.36 writes them: its event handlers log through the
logger KCM hands its constructor, named "replicaset-controller" (logger= first), its syncs through
the manager's unnamed one; the messages, keys and value forms are KCM's."""

from __future__ import annotations

import copy
import logging

import pytest

from pykcm.client.errors import ServiceUnavailable
from pykcm.controllers.replicaset.controller import STALE_CACHE_RETRY
from pykcm.informers.delta_queue import Delta, DeltaType
from pykcm.util.log import NIL_STRINGER, JsonFormatter, KlogFormatter, kref
from tests.unit.replicaset_harness import NS, Harness, make_pod, make_rs

NAMED = {"logger": "replicaset-controller"}


@pytest.fixture
def h() -> Harness:
    return Harness()


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, dict]]:
    return [(r.getMessage(), r.kv) for r in caplog.records]  # type: ignore[attr-defined]


def text(record: logging.LogRecord) -> str:
    return KlogFormatter().format(record).partition("] ")[2]


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_the_replica_set_handlers_log_through_the_named_logger(
    h: Harness, verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    rs = make_rs(replicas=1)
    scaled = {**rs, "spec": {**rs["spec"], "replicas": 3}}
    with caplog.at_level(logging.INFO, logger="pykcm"):
        h.ctrl.rs_added(rs)
        h.ctrl.rs_updated(rs, scaled)
        h.ctrl.rs_deleted(scaled)
    assert lines(caplog) == [
        ("Adding", {**NAMED, "replicaSet": kref(NS, "web")}),
        ("replicaSet updated. Desired pod count change.",
         {**NAMED, "replicaSet": kref(NS, "web"), "oldReplicas": 1, "newReplicas": 3}),
        ("Deleting", {**NAMED, "replicaSet": kref(NS, "web")}),
    ]
    assert text(caplog.records[0]) == '"Adding" logger="replicaset-controller" replicaSet="ns/web"'
    entry = JsonFormatter().format(caplog.records[0])
    assert entry.startswith('{"ts":') and '"logger":"replicaset-controller","caller":' in entry


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_the_pod_handlers_log_kcms_keys_and_their_expectations_through_the_named_logger(
    h: Harness, verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    # KCM's "Pod created" also has detail=<%v of the pod> and "Pod deleted" delete_by=<Go caller>:
    # neither can be the same here, so both are left out.
    rs = h.add_rs(make_rs(replicas=2))
    h.ctrl.expectations.expect_creations("ns/web", 1)
    pod = make_pod("p0", owner=rs)
    updated = copy.deepcopy(pod)
    updated["metadata"]["resourceVersion"] = "6"
    deleting = copy.deepcopy(updated)
    deleting["metadata"].update(resourceVersion="7", deletionTimestamp="2026-11-27T23:53:45Z")
    with caplog.at_level(logging.INFO, logger="pykcm"):
        h.ctrl.pod_added(pod)
        h.ctrl.pod_updated(pod, updated)
        h.ctrl.expectations.expect_deletions("ns/web", ["ns/p0"])  # a sync's: unnamed
        h.ctrl.pod_updated(updated, deleting)
        h.ctrl.pod_deleted(deleting)
        h.ctrl.pod_deleted(make_pod("p1", owner=rs))  # gone without a deletionTimestamp
    deleted_at = "2026-11-27 23:53:45 +0000 UTC"  # Go's %v of a metav1.Time
    assert lines(caplog) == [
        ("Pod created", {**NAMED, "pod": kref(NS, "p0")}),
        ("Lowered expectations", {**NAMED, "expectations": {}}),
        ("Pod objectMeta updated.", {**NAMED, "pod": kref(NS, "p0")}),
        ("Controller waiting on deletions", {"controller": "ns/web", "keys": ["ns/p0"]}),
        ("Setting expectations", {"expectations": {}}),
        ("Pod deleted", {**NAMED, "deletion_timestamp": deleted_at, "pod": kref(NS, "p0")}),
        ("Controller received delete for pod", {**NAMED, "controller": "ns/web", "key": "ns/p0"}),
        ("Lowered expectations", {**NAMED, "expectations": {}}),
        ("Pod deleted", {**NAMED, "deletion_timestamp": deleted_at, "pod": kref(NS, "p0")}),
        ("Pod deleted", {**NAMED, "deletion_timestamp": NIL_STRINGER, "pod": kref(NS, "p1")}),
    ]
    assert text(caplog.records[5]) == (
        '"Pod deleted" logger="replicaset-controller" deletion_timestamp="2026-11-27 23:53:45 +0000 UTC" pod="ns/p0"')


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_an_orphans_label_change_that_a_replica_set_matches_is_logged(
    h: Harness, verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    h.add_rs(make_rs())
    old = make_pod("o", labels={"app": "nope"})
    new = copy.deepcopy(old)
    new["metadata"].update(labels={"app": "web"}, resourceVersion="6")
    unmatched = copy.deepcopy(old)
    unmatched["metadata"].update(labels={"app": "other"}, resourceVersion="7")
    with caplog.at_level(logging.INFO, logger="pykcm"):
        h.ctrl.pod_updated(old, new)
        h.ctrl.pod_updated(old, unmatched)  # nobody to wake: no line
    assert lines(caplog) == [("Orphan Pod objectMeta updated.", {**NAMED, "pod": kref(NS, "o")})]


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_a_syncs_lines_are_unnamed_and_the_status_update_is_kcms_one_message(
    h: Harness, verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    h.add_rs(make_rs(replicas=2))
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await h.sync()
    assert all("logger" not in r.kv for r in caplog.records)  # type: ignore[attr-defined]
    assert [m for m, _ in lines(caplog)][:3] == [
        "Controller either never recorded expectations, or the ttl expired", "Setting expectations", "Too few replicas"]
    # replica_set_utils.go: one Sprintf'd message; "for %v" is rs.Kind, empty on a typed client's objects.
    assert lines(caplog)[-1] == (
        "Updating status for : ns/web, replicas 0->0 (need 2), fullyLabeledReplicas 0->0, readyReplicas 0->0, "
        "availableReplicas 0->0, terminatingReplicas nil->0, sequence No: 0->1", {})


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_without_terminating_replicas_the_status_message_leaves_them_out(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(feature_gates={"DeploymentReplicaSetTerminatingReplicas": False})
    h.add_rs(make_rs(replicas=0))
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await h.sync()
    assert lines(caplog)[-1][0] == (
        "Updating status for : ns/web, replicas 0->0 (need 0), fullyLabeledReplicas 0->0, readyReplicas 0->0, "
        "availableReplicas 0->0, sequence No: 0->1")


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_a_stale_cache_skip_is_kcms_unhandled_error_after_finished_syncing_without_backoff(
    h: Harness, verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    h.add_rs(make_rs(replicas=0))
    rv = h.ctrl.replica_sets.indexer.get("ns/web")["metadata"]["resourceVersion"]
    h.ctrl.replica_sets._apply(Delta(DeltaType.BOOKMARK, None, rv))
    await h.sync()  # writes status at a newer resourceVersion than the cache has seen
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await h.ctrl._process("ns/web")
    (finished, _), (failed, kv) = lines(caplog)
    assert (finished, failed, kv["logger"]) == ("Finished syncing", "Unhandled Error", "UnhandledError")
    assert kv["err"].startswith('sync "ns/web" failed with read version: 1 is not as new as written version: ')
    assert kv["err"].endswith(" for group resource replicasets.apps")
    assert caplog.records[1].levelno == logging.ERROR
    assert h.after[-1] == ("ns/web", STALE_CACHE_RETRY) and h.ctrl.queue.num_requeues("ns/web") == 0


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_a_slow_start_failure_lowers_the_expectations_once_per_skipped_pod(
    h: Harness, verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    # KCM calls CreationObserved for each pod it skips: a "Lowered expectations" line each.
    h.add_rs(make_rs(replicas=3))
    h.api.fail["create"] = ServiceUnavailable(503, "ServiceUnavailable", "etcd is down")
    with caplog.at_level(logging.INFO, logger="pykcm"), pytest.raises(ServiceUnavailable):
        await h.sync()
    messages = [m for m, _ in lines(caplog)]
    skipped = messages.index("Slow-start failure. Skipping creation of pods, decrementing expectations")
    assert messages[skipped + 1:skipped + 4] == ["Lowered expectations"] * 3
    assert h.ctrl.expectations.satisfied("ns/web")


@pytest.mark.parametrize("verbosity", [2], indirect=True)
async def test_a_release_names_the_controllers_group_version_kind_as_kcm(
    h: Harness, verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    rs = h.add_rs(make_rs(replicas=0))
    h.add_pod(make_pod("p0", labels={"app": "other"}, owner=rs))
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await h.sync()
    [record] = [r for r in caplog.records if r.getMessage() == "Patching pod to remove its controllerRef"]
    assert record.kv == {"pod": kref(NS, "p0"), "gvk": "apps/v1, Kind=ReplicaSet", "controller": "web"}  # type: ignore[attr-defined]
