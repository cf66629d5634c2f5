"""KCM's controller helpers (pykcm/controller/): label selectors, expectations, controller
refs, pods from templates and the stale-cache check."""

from __future__ import annotations

import logging

import pytest

from pykcm.client.resources import PODS, REPLICASETS
from pykcm.controller.consistency import ConsistencyStore, StaleCacheError, compare_resource_versions
from pykcm.controller.controllerref import adopt_patch, get_controller_of, pod_controller_index, release_patch
from pykcm.controller.expectations import EXPECTATIONS_TIMEOUT, ControllerExpectations
from pykcm.controller.podcontrol import pod_from_template, pod_name_prefix
from pykcm.controller.selectors import (
    EVERYTHING,
    NOTHING,
    SelectorError,
    selector_from_label_selector,
    selector_from_set,
)
from pykcm.util.log import KlogFormatter, get_logger

# -- selectors --------------------------------------------------------------------------------------


def test_selector_match_labels_and_expressions() -> None:
    sel = selector_from_label_selector(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "team", "operator": "Exists"},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        }
    )
    assert sel.matches({"app": "web", "tier": "a", "team": "x"})
    assert sel.matches({"app": "web", "tier": "b", "team": "x", "env": "dev"})
    assert not sel.matches({"app": "web", "tier": "c", "team": "x"})
    assert not sel.matches({"app": "web", "tier": "a", "team": "x", "env": "prod"})
    assert not sel.matches({"app": "web", "tier": "a"})
    assert not sel.matches({"app": "web", "tier": "a", "team": "x", "legacy": ""})
    assert not sel.matches(None)


def test_selector_nil_matches_nothing_and_empty_matches_everything() -> None:
    assert selector_from_label_selector(None) is NOTHING
    assert not NOTHING.matches({"a": "b"}) and not NOTHING.empty()
    assert selector_from_label_selector({}) is EVERYTHING
    assert EVERYTHING.matches({}) and EVERYTHING.empty()
    assert selector_from_set({"a": "b"}).matches({"a": "b", "c": "d"})


@pytest.mark.parametrize(
    "bad",
    [
        {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
        {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
        {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
        {"matchLabels": {"bad key!": "x"}},
        {"matchLabels": {"a": "not a valid value"}},
        {"matchLabels": {"UPPER.example.com/a": "x"}},
        {"matchLabels": {"a/b/c": "x"}},
        {"matchLabels": {"app\n": "x"}},  # Go's $ is the end of the text, Python's also before a "\n"
        {"matchLabels": {"app": "x\n"}},
        {"matchLabels": {"example.com\n/app": "x"}},
    ],
)
def test_selector_invalid_raises(bad: dict) -> None:
    with pytest.raises(SelectorError):
        selector_from_label_selector(bad)


def test_selector_accepts_prefixed_keys() -> None:
    assert selector_from_label_selector({"matchLabels": {"app.kubernetes.io/name": "web"}}).matches(
        {"app.kubernetes.io/name": "web"}
    )


# -- expectations -----------------------------------------------------------------------------------


def test_scenario_17_expectations_block_until_creations_observed_or_expired() -> None:
    clock = [0.0]
    exp = ControllerExpectations(clock=lambda: clock[0])
    assert exp.satisfied("ns/web")  # no record
    exp.expect_creations("ns/web", 3)
    assert not exp.satisfied("ns/web")
    exp.creation_observed("ns/web")
    exp.creation_observed("ns/web")
    assert not exp.satisfied("ns/web")
    exp.creation_observed("ns/web")
    assert exp.satisfied("ns/web")
    # Lagging watch: nothing observed, but the record expires after 5 minutes.
    exp.expect_creations("ns/web", 3)
    clock[0] += EXPECTATIONS_TIMEOUT
    assert not exp.satisfied("ns/web")
    clock[0] += 0.001
    assert exp.satisfied("ns/web")


def test_scenario_18_deletion_counted_once_per_pod_key() -> None:
    exp = ControllerExpectations()
    exp.expect_deletions("ns/web", ["ns/a", "ns/b"])
    assert not exp.satisfied("ns/web")
    exp.deletion_observed("ns/web", "ns/a")  # update with deletionTimestamp
    exp.deletion_observed("ns/web", "ns/a")  # the real delete: no double count
    assert exp.get("ns/web").delete == 1
    assert not exp.satisfied("ns/web")
    exp.deletion_observed("ns/web", "ns/unrelated")
    assert exp.get("ns/web").delete == 1
    exp.deletion_observed("ns/web", "ns/b")
    assert exp.satisfied("ns/web")


def test_scenario_19_deleted_expectations_start_clean() -> None:
    exp = ControllerExpectations()
    exp.expect_creations("ns/web", 5)
    exp.delete("ns/web")
    assert exp.satisfied("ns/web")
    assert exp.get("ns/web") is None


def test_expectations_can_go_negative_and_replace_resets() -> None:
    exp = ControllerExpectations()
    exp.expect_creations("k", 1)
    exp.creation_observed("k")
    exp.creation_observed("k")
    assert exp.get("k").add == -1 and exp.satisfied("k")
    exp.expect_creations("k", 2)
    assert exp.get("k").add == 2


@pytest.mark.parametrize("verbosity", [4], indirect=True)
def test_expectations_log_kcms_lines_through_the_logger_given(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    # controller_utils.go: the record is logged as expectations={} (Go's JSON of a struct with only
    # unexported fields); an event handler passes the controller's named logger, a sync its own.
    clock = [0.0]
    exp = ControllerExpectations(clock=lambda: clock[0])
    handlers = get_logger("replicaset").named("replicaset-controller")
    with caplog.at_level(logging.INFO, logger="pykcm"):
        exp.satisfied("ns/web")
        exp.expect_creations("ns/web", 1)
        exp.satisfied("ns/web")
        exp.creation_observed("ns/web", handlers)
        exp.satisfied("ns/web")
        exp.expect_deletions("ns/web", ["ns/b", "ns/a"])
        exp.deletion_observed("ns/web", "ns/unrelated", handlers)  # not waited for: no line
        exp.deletion_observed("ns/web", "ns/b", handlers)
        clock[0] += EXPECTATIONS_TIMEOUT + 1
        exp.satisfied("ns/web")
        exp.expect_deletions("ns/web", ["ns/c"])  # ns/a still pending: clobbered
        exp.lower("ns/gone", 1, 0)  # no record: no line
    named = {"logger": "replicaset-controller"}
    assert [(r.getMessage(), r.kv) for r in caplog.records] == [  # type: ignore[attr-defined]
        ("Controller either never recorded expectations, or the ttl expired", {"controller": "ns/web"}),
        ("Setting expectations", {"expectations": {}}),
        ("Controller still waiting on expectations", {"expectations": {}}),
        ("Lowered expectations", {**named, "expectations": {}}),
        ("Controller expectations fulfilled", {"expectations": {}}),
        ("Controller waiting on deletions", {"controller": "ns/web", "keys": ["ns/b", "ns/a"]}),
        ("Setting expectations", {"expectations": {}}),
        ("Controller received delete for pod", {**named, "controller": "ns/web", "key": "ns/b"}),
        ("Lowered expectations", {**named, "expectations": {}}),
        ("Controller expectations expired", {"expectations": {}}),
        ("Controller waiting on deletions", {"controller": "ns/web", "keys": ["ns/c"]}),
        ("Clobbering existing delete keys", {"keys": {"ns/a": {}}}),
        ("Setting expectations", {"expectations": {}}),
    ]
    text = [KlogFormatter().format(r).partition("] ")[2] for r in caplog.records]
    assert text[3] == '"Lowered expectations" logger="replicaset-controller" expectations={}'
    assert text[11] == '"Clobbering existing delete keys" keys={"ns/a":{}}'  # a sets.String, Go's JSON of a map
    assert caplog.records[11].levelno == logging.ERROR


def test_expectations_log_nothing_below_v4(caplog: pytest.LogCaptureFixture) -> None:
    exp = ControllerExpectations()
    with caplog.at_level(logging.INFO, logger="pykcm"):
        exp.expect_deletions("ns/web", ["ns/a"])
        exp.deletion_observed("ns/web", "ns/a")
        assert exp.satisfied("ns/web")
    assert caplog.records == []


# -- controller refs --------------------------------------------------------------------------------


def test_controller_ref_patches_match_kcm() -> None:
    owner = {"metadata": {"name": "web", "uid": "rs-uid"}}
    assert adopt_patch(owner, "apps/v1", "ReplicaSet", "pod-uid") == {
        "metadata": {
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web",
                    "uid": "rs-uid",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "uid": "pod-uid",
        }
    }
    assert release_patch("pod-uid", ["rs-uid"]) == {
        "metadata": {"uid": "pod-uid", "ownerReferences": [{"$patch": "delete", "uid": "rs-uid"}]}
    }


def test_pod_controller_index_keys() -> None:
    owned = {"metadata": {"namespace": "ns", "ownerReferences": [
        {"kind": "Other", "name": "x", "uid": "1"},
        {"kind": "ReplicaSet", "name": "web", "uid": "2", "controller": True},
    ]}}
    assert get_controller_of(owned)["uid"] == "2"
    assert pod_controller_index(owned) == ["ns/ReplicaSet/web/2"]
    assert pod_controller_index({"metadata": {"namespace": "ns"}}) == ["ns"]


# -- pods from the template -------------------------------------------------------------------------


def test_scenario_23_pod_from_template_copies_metadata() -> None:
    template = {
        "metadata": {"labels": {"app": "web"}, "annotations": {"a": "1"}, "finalizers": ["x/y"], "name": "ignored"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u", "controller": True,
           "blockOwnerDeletion": True}
    p = pod_from_template(template, "web", ref)
    assert p["metadata"] == {
        "generateName": "web-",
        "labels": {"app": "web"},
        "annotations": {"a": "1"},
        "finalizers": ["x/y"],
        "ownerReferences": [ref],
    }
    assert p["spec"] == template["spec"] and p["spec"] is not template["spec"]
    assert pod_name_prefix("x" * 253) == "x" * 253 + "-"  # the built KCM's generateName for such a name
    assert pod_name_prefix("x" * 254) == "x" * 254


# -- stale cache ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b", "order"), [
    ("9", "10", -1), ("10", "9", 1), ("123", "123", 0), ("99999999999999999999", "100000000000000000000", -1),
    ("0", "5", None), ("0123", "124", None), ("", "1", None), ("\u0661\u0662", "5", None), ("\u00b2", "1", None),
    ("1 ", "1", None), ("+1", "1", None),
])
def test_resource_versions_compare_as_apimachinery_compares_them(a: str, b: str, order: int | None) -> None:
    assert compare_resource_versions(a, b) == order


def test_a_written_version_that_does_not_compare_replaces_the_one_kept() -> None:
    store = ConsistencyStore({PODS: lambda: "20"})
    store.wrote_at("ns/web", "u1", PODS, "30")
    store.wrote_at("ns/web", "u1", PODS, "00x")  # as KCM's WroteAt: an error in the comparison overwrites
    store.ensure_ready("ns/web")  # and a malformed version never blocks a sync
    assert len(store) == 0


def test_consistency_store_waits_for_informers_to_see_our_writes() -> None:
    cache_at = {REPLICASETS: "10", PODS: "12"}
    store = ConsistencyStore({REPLICASETS: lambda: cache_at[REPLICASETS], PODS: lambda: cache_at[PODS]})
    store.wrote_at("ns/web", "u1", REPLICASETS, "15")
    store.wrote_at("ns/web", "u1", PODS, "11")
    with pytest.raises(StaleCacheError, match=r"replicasets\.apps"):
        store.ensure_ready("ns/web")
    cache_at[REPLICASETS] = "15"
    store.ensure_ready("ns/web")
    assert len(store) == 0  # caught up: record dropped
    store.wrote_at("ns/web", "u1", REPLICASETS, "99")
    store.clear("ns/web", "other-uid")
    assert len(store) == 1
    store.clear("ns/web", "u1")
    assert len(store) == 0
