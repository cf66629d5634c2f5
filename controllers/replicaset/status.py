"""ReplicaSet status: computed from the claimed pods, written only when something changed.

From KCM's replica_set_utils.go: `calculate_status` counts the active pods (replicas), those
carrying every template label (fullyLabeledReplicas), Ready ones, available ones (Ready for
minReadySeconds) and terminating ones, and sets or clears the `ReplicaFailure` condition after
a failed or successful manageReplicas. `update_status` skips the write when nothing changed
and the generation was already observed; otherwise it PUTs `/status` and retries once after a
fresh GET. With KCM's DeploymentReplicaSetTerminatingReplicas gate off, terminating pods are not
counted: terminatingReplicas is left unset, and an apiserver with that gate off, which drops the
field, keeps answering a status the comparison finds unchanged (unset on both sides, as KCM's
ptr.Equal of two nil pointers). The count reads every active pod (10,000 for a large ReplicaSet)
and hands the event loop back as it goes.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from pykcm.client.resources import REPLICASETS
from pykcm.client.rest import RestClient
from pykcm.controller.podutil import is_pod_available, is_pod_ready
from pykcm.controller.selectors import selector_from_set
from pykcm.informers.store import Obj
from pykcm.util import apitime
from pykcm.util.log import Logger
from pykcm.util.timeslice import TimeSlice

REPLICA_FAILURE = "ReplicaFailure"
STATUS_UPDATE_RETRIES = 1
_COUNTS = ("replicas", "fullyLabeledReplicas", "readyReplicas", "availableReplicas")

Status = dict[str, Any]


def spec_replicas(rs: Obj) -> int:
    replicas = (rs.get("spec") or {}).get("replicas")
    return 1 if replicas is None else int(replicas)  # the API defaults it to 1


def min_ready_seconds(rs: Obj) -> int:
    return int((rs.get("spec") or {}).get("minReadySeconds") or 0)


def get_condition(status: Status, cond_type: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or () if c.get("type") == cond_type), None)


def failure_reason(active_count: int, desired: int) -> str:
    """Which way manageReplicas was going when it failed."""
    if active_count < desired:
        return "FailedCreate"
    if active_count > desired:
        return "FailedDelete"
    return ""


async def calculate_status(
    rs: Obj,
    active_pods: Sequence[Obj],
    terminating_pods: Sequence[Obj] | None,
    manage_error: BaseException | None,
    now: float,
) -> Status:
    """The new status. `terminating_pods` None leaves terminatingReplicas unset (gate off)."""
    status: Status = copy.deepcopy(rs.get("status") or {})
    template_labels = selector_from_set(((rs["spec"].get("template") or {}).get("metadata") or {}).get("labels"))
    min_ready = min_ready_seconds(rs)
    fully_labeled = ready = available = 0
    time_slice = TimeSlice()
    for pod in active_pods:
        if template_labels.matches(pod["metadata"].get("labels")):
            fully_labeled += 1
        if is_pod_ready(pod):
            ready += 1
            if is_pod_available(pod, min_ready, now):
                available += 1
        if time_slice.over():
            await time_slice.pause()
    status["replicas"] = len(active_pods)
    status["fullyLabeledReplicas"] = fully_labeled
    status["readyReplicas"] = ready
    status["availableReplicas"] = available
    if terminating_pods is None:
        status.pop("terminatingReplicas", None)
    else:
        status["terminatingReplicas"] = len(terminating_pods)
    _update_failure_condition(status, rs, len(active_pods), manage_error)
    return status


def _update_failure_condition(status: Status, rs: Obj, active_count: int, manage_error: BaseException | None) -> None:
    existing = get_condition(status, REPLICA_FAILURE)
    if manage_error is not None and existing is None:
        condition = {
            "type": REPLICA_FAILURE,
            "status": "True",
            "lastTransitionTime": apitime.now(),
            "reason": failure_reason(active_count, spec_replicas(rs)),
            "message": str(manage_error),
        }
        status["conditions"] = [*(status.get("conditions") or []), condition]
    elif manage_error is None and existing is not None:
        remaining = [c for c in status.get("conditions") or () if c.get("type") != REPLICA_FAILURE]
        if remaining:
            status["conditions"] = remaining
        else:
            status.pop("conditions", None)


def status_unchanged(rs: Obj, new: Status) -> bool:
    """The steady state: counts and conditions equal and the current generation observed."""
    old = rs.get("status") or {}
    return (
        all(old.get(k, 0) == new.get(k, 0) for k in _COUNTS)
        and old.get("terminatingReplicas") == new.get("terminatingReplicas")
        and rs["metadata"].get("generation", 0) == old.get("observedGeneration", 0)
        and (old.get("conditions") or []) == (new.get("conditions") or [])
    )


async def update_status(client: RestClient, rs: Obj, new: Status, log: Logger) -> Obj:
    """Write `new` unless unchanged; returns the ReplicaSet as the server (or cache) has it."""
    if status_unchanged(rs, new):
        return rs
    # The generation we acted on, kept on retry so we never claim to have seen a newer spec.
    new = {**new, "observedGeneration": rs["metadata"].get("generation", 0)}
    current = rs
    attempt = 0
    while True:
        body = {**current, "status": new}
        _log_status_change(log, current, new)
        try:
            return await client.update(REPLICASETS, body, subresource="status")
        except Exception:
            if attempt >= STATUS_UPDATE_RETRIES:
                raise
        attempt += 1
        meta = current["metadata"]
        # A GET failure is more interesting than the failed update: it propagates.
        current = await client.get(REPLICASETS, meta["name"], meta["namespace"])


def _log_status_change(log: Logger, rs: Obj, new: Status) -> None:
    """KCM's one Sprintf'd message (replica_set_utils.go). Its "for %v" is rs.Kind, which a typed
    client's objects (cached or read back) leave empty: "Updating status for : ns/web, ..."."""
    logger = log.v(4)
    if not logger.enabled():
        return
    old = rs.get("status") or {}
    meta = rs["metadata"]
    terminating = ""
    if "terminatingReplicas" in new:  # counted: DeploymentReplicaSetTerminatingReplicas on, as KCM logs it
        before = old.get("terminatingReplicas")
        terminating = f"terminatingReplicas {'nil' if before is None else before}->{new['terminatingReplicas']}, "
    logger.info(
        f"Updating status for : {meta['namespace']}/{meta['name']}, "
        f"replicas {old.get('replicas', 0)}->{new.get('replicas', 0)} (need {spec_replicas(rs)}), "
        f"fullyLabeledReplicas {old.get('fullyLabeledReplicas', 0)}->{new.get('fullyLabeledReplicas', 0)}, "
        f"readyReplicas {old.get('readyReplicas', 0)}->{new.get('readyReplicas', 0)}, "
        f"availableReplicas {old.get('availableReplicas', 0)}->{new.get('availableReplicas', 0)}, "
        f"{terminating}sequence No: {old.get('observedGeneration', 0)}->{new.get('observedGeneration', 0)}"
    )
