"""The five namespace deletion conditions and what a deletion pass left behind
(KCM's deletion/status_condition_utils.go)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pykcm.client.discovery import (
    GroupDiscoveryFailed,
    GroupVersionResource,
)
from pykcm.informers.store import Obj
from pykcm.util import apitime


@dataclass
class GVRDeletion:
    """What one resource type left behind after a pass."""

    estimate: int = 0  # seconds to wait; 0 does not mean nothing remains
    remaining: int = 0
    finalizers: Counter[str] = field(default_factory=Counter)


@dataclass
class ContentTotals:
    remaining: dict[GroupVersionResource, int] = field(default_factory=dict)
    finalizers: Counter[str] = field(default_factory=Counter)

    def add(self, gvr: GroupVersionResource, result: GVRDeletion) -> None:
        if result.remaining > 0:
            self.remaining[gvr] = result.remaining
            self.finalizers.update(result.finalizers)


DISCOVERY_FAILURE = "NamespaceDeletionDiscoveryFailure"
GV_PARSING_FAILURE = "NamespaceDeletionGroupVersionParsingFailure"
CONTENT_FAILURE = "NamespaceDeletionContentFailure"
CONTENT_REMAINING = "NamespaceContentRemaining"
FINALIZERS_REMAINING = "NamespaceFinalizersRemaining"
CONDITION_TYPES = (DISCOVERY_FAILURE, GV_PARSING_FAILURE, CONTENT_FAILURE, CONTENT_REMAINING, FINALIZERS_REMAINING)
# The "ok" form of each condition: status False with this reason and message.
OK_CONDITIONS = {
    DISCOVERY_FAILURE: ("ResourcesDiscovered", "All resources successfully discovered"),
    GV_PARSING_FAILURE: ("ParsedGroupVersions", "All legacy kube types successfully parsed"),
    CONTENT_FAILURE: ("ContentDeleted", "All content successfully deleted, may be waiting on finalization"),
    CONTENT_REMAINING: ("ContentRemoved", "All content successfully removed"),
    FINALIZERS_REMAINING: ("ContentHasNoFinalizers", "All content-preserving finalizers finished"),
}



def _condition(ctype: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": ctype, "status": status, "lastTransitionTime": apitime.now(), "reason": reason, "message": message}


class ConditionUpdater:
    """Collects one pass's failures and turns them into the five deletion conditions."""

    def __init__(self) -> None:
        self.failures: dict[str, dict[str, Any]] = {}
        self.delete_content_errors: list[BaseException] = []

    def _fail(self, ctype: str, reason: str, message: str) -> None:
        self.failures.setdefault(ctype, _condition(ctype, "True", reason, message))

    def discovery_failed(self, err: BaseException) -> None:
        if isinstance(err, GroupDiscoveryFailed):
            message = f"Discovery failed for some groups, {len(err.groups)} failing: {err}"
        else:
            message = str(err)
        self._fail(DISCOVERY_FAILURE, "DiscoveryFailed", message)

    def group_version_parsing_failed(self, err: BaseException) -> None:
        self._fail(GV_PARSING_FAILURE, "GroupVersionParsingFailed", str(err))

    def content_deletion_failed(self, err: BaseException) -> None:
        self.delete_content_errors.append(err)

    def content_totals(self, totals: ContentTotals) -> None:
        if totals.remaining:
            remaining = sorted(
                f"{gvr.resource}.{gvr.group} has {count} resource instances"
                for gvr, count in totals.remaining.items()
                if count
            )
            message = f"Some resources are remaining: {', '.join(remaining)}"
            self._fail(CONTENT_REMAINING, "SomeResourcesRemain", message)
        if totals.finalizers:
            by_finalizer = sorted(
                f"{finalizer} in {count} resource instances" for finalizer, count in totals.finalizers.items() if count
            )
            self._fail(
                FINALIZERS_REMAINING,
                "SomeFinalizersRemain",
                f"Some content in the namespace has finalizers remaining: {', '.join(by_finalizer)}",
            )

    def update(self, namespace: Obj) -> bool:
        """Write the conditions into namespace.status; True if anything changed."""
        if self.delete_content_errors:
            messages = sorted(str(e) for e in self.delete_content_errors)
            self._fail(
                CONTENT_FAILURE,
                "ContentDeletionFailed",
                f"Failed to delete all resource types, {len(messages)} remaining: {', '.join(messages)}",
            )
        status = namespace.setdefault("status", {})
        conditions: list[dict[str, Any]] = status.get("conditions") or []
        status["conditions"] = conditions
        changed = False
        for ctype in CONDITION_TYPES:
            new = self.failures.get(ctype) or _condition(ctype, "False", *OK_CONDITIONS[ctype])
            old = next((c for c in conditions if c.get("type") == ctype), None)
            if old is None:
                conditions.append(new)
                changed = True
            elif any(old.get(k) != new[k] for k in ("status", "reason", "message")):
                if old.get("status") != new["status"]:
                    old["lastTransitionTime"] = new["lastTransitionTime"]  # only a flip moves the time
                old.update(status=new["status"], reason=new["reason"], message=new["message"])
                changed = True
        return changed
