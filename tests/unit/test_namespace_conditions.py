"""Unit tests for the namespace deletion conditions: types, reasons, messages, transition times."""

from __future__ import annotations

from collections import Counter

from pykcm.client.discovery import GroupDiscoveryFailed, GroupVersion, GroupVersionResource, StaleGroupVersion
from pykcm.controllers.namespace.conditions import (
    CONDITION_TYPES,
    CONTENT_FAILURE,
    CONTENT_REMAINING,
    DISCOVERY_FAILURE,
    FINALIZERS_REMAINING,
    GV_PARSING_FAILURE,
    ConditionUpdater,
    ContentTotals,
)

OLD_TIME = "2020-01-01T00:00:00Z"


def by_type(namespace: dict) -> dict[str, dict]:
    return {c["type"]: c for c in namespace["status"]["conditions"]}


def test_clean_pass_writes_all_five_ok_conditions() -> None:
    namespace: dict = {"metadata": {"name": "ns"}}
    assert ConditionUpdater().update(namespace) is True
    conditions = by_type(namespace)
    assert list(conditions) == list(CONDITION_TYPES)
    assert {t: (c["status"], c["reason"]) for t, c in conditions.items()} == {
        DISCOVERY_FAILURE: ("False", "ResourcesDiscovered"),
        GV_PARSING_FAILURE: ("False", "ParsedGroupVersions"),
        CONTENT_FAILURE: ("False", "ContentDeleted"),
        CONTENT_REMAINING: ("False", "ContentRemoved"),
        FINALIZERS_REMAINING: ("False", "ContentHasNoFinalizers"),
    }
    assert conditions[FINALIZERS_REMAINING]["message"] == "All content-preserving finalizers finished"
    assert conditions[DISCOVERY_FAILURE]["lastTransitionTime"].endswith("Z")


def test_unchanged_conditions_are_not_rewritten() -> None:
    namespace: dict = {"metadata": {"name": "ns"}}
    ConditionUpdater().update(namespace)
    assert ConditionUpdater().update(namespace) is False


def test_discovery_failure_message_counts_failed_groups() -> None:
    gv = GroupVersion("metrics.example.com", "v1")
    updater = ConditionUpdater()
    updater.discovery_failed(GroupDiscoveryFailed({gv: StaleGroupVersion(gv)}))
    namespace: dict = {}
    updater.update(namespace)
    condition = by_type(namespace)[DISCOVERY_FAILURE]
    assert (condition["status"], condition["reason"]) == ("True", "DiscoveryFailed")
    assert condition["message"] == (
        "Discovery failed for some groups, 1 failing: unable to retrieve the complete list of server APIs: "
        "metrics.example.com/v1: stale GroupVersion discovery: metrics.example.com/v1"
    )


def test_other_discovery_errors_are_reported_verbatim() -> None:
    updater = ConditionUpdater()
    updater.discovery_failed(RuntimeError("connection refused"))
    namespace: dict = {}
    updater.update(namespace)
    assert by_type(namespace)[DISCOVERY_FAILURE]["message"] == "connection refused"


def test_content_totals_messages_are_sorted_and_name_the_group() -> None:
    updater = ConditionUpdater()
    totals = ContentTotals()
    totals.remaining = {GroupVersionResource("", "v1", "pods"): 3, GroupVersionResource("x.io", "v1", "things"): 1}
    totals.finalizers = Counter({"z.io/f": 1, "a.io/f": 3})
    updater.content_totals(totals)
    namespace: dict = {}
    updater.update(namespace)
    conditions = by_type(namespace)
    assert conditions[CONTENT_REMAINING]["reason"] == "SomeResourcesRemain"
    assert conditions[CONTENT_REMAINING]["message"] == (
        "Some resources are remaining: pods. has 3 resource instances, things.x.io has 1 resource instances"
    )
    assert conditions[FINALIZERS_REMAINING]["reason"] == "SomeFinalizersRemain"
    assert conditions[FINALIZERS_REMAINING]["message"] == (
        "Some content in the namespace has finalizers remaining: a.io/f in 3 resource instances, "
        "z.io/f in 1 resource instances"
    )


def test_content_failure_lists_sorted_errors() -> None:
    updater = ConditionUpdater()
    updater.content_deletion_failed(RuntimeError("zeta failed"))
    updater.content_deletion_failed(RuntimeError("alpha failed"))
    namespace: dict = {}
    updater.update(namespace)
    condition = by_type(namespace)[CONTENT_FAILURE]
    assert (condition["status"], condition["reason"]) == ("True", "ContentDeletionFailed")
    assert condition["message"] == "Failed to delete all resource types, 2 remaining: alpha failed, zeta failed"


def test_transition_time_moves_only_when_status_flips() -> None:
    namespace: dict = {"status": {"conditions": [
        {"type": CONTENT_REMAINING, "status": "True", "lastTransitionTime": OLD_TIME,
         "reason": "SomeResourcesRemain", "message": "Some resources are remaining: pods. has 2 resource instances"},
        {"type": DISCOVERY_FAILURE, "status": "False", "lastTransitionTime": OLD_TIME,
         "reason": "ResourcesDiscovered", "message": "All resources successfully discovered"},
        {"type": "SomethingElse", "status": "True", "lastTransitionTime": OLD_TIME, "reason": "X", "message": "y"},
    ]}}
    updater = ConditionUpdater()
    totals = ContentTotals()
    totals.remaining = {GroupVersionResource("", "v1", "pods"): 1}
    updater.content_totals(totals)
    assert updater.update(namespace) is True
    conditions = by_type(namespace)
    # Message changed, status did not: the time stays.
    assert conditions[CONTENT_REMAINING]["message"].endswith("pods. has 1 resource instances")
    assert conditions[CONTENT_REMAINING]["lastTransitionTime"] == OLD_TIME
    assert conditions[DISCOVERY_FAILURE]["lastTransitionTime"] == OLD_TIME
    assert conditions["SomethingElse"]["reason"] == "X"  # conditions of other owners are kept

    # Now the content is gone: the status flips and the time moves.
    assert ConditionUpdater().update(namespace) is True
    flipped = by_type(namespace)[CONTENT_REMAINING]
    assert (flipped["status"], flipped["reason"]) == ("False", "ContentRemoved")
    assert flipped["lastTransitionTime"] != OLD_TIME
