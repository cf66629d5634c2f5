"""Pure logic behind the ReplicaSet controller: slow-start batches, the deletion ranking,
availability and status (the shared controller helpers are in test_controller_helpers.py)."""

from __future__ import annotations

import asyncio
import random

import pytest

from pykcm.controller.podutil import (
    deletion_cost,
    is_pod_available,
    min_next_availability_check,
    sort_for_deletion,
)
from pykcm.controllers.replicaset.scaling import (
    pods_to_delete,
    ranks_by_colocated_related_pods,
    slow_start_batch,
    slow_start_batch_sizes,
)
from pykcm.controllers.replicaset.status import calculate_status, status_unchanged
from pykcm.util.apitime import format_time

NOW = 1_700_000_000.0


def pod(
    name: str,
    *,
    node: str = "node-a",
    phase: str = "Running",
    ready: bool = True,
    ready_since: float | None = NOW - 3600,
    created: float = NOW - 7200,
    cost: str | None = None,
    restarts: int = 0,
    uid: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict:
    annotations = {"controller.kubernetes.io/pod-deletion-cost": cost} if cost is not None else {}
    conditions = []
    if ready is not None:
        cond = {"type": "Ready", "status": "True" if ready else "False"}
        if ready_since is not None:
            cond["lastTransitionTime"] = format_time(ready_since)
        conditions.append(cond)
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{name}",
            "labels": labels if labels is not None else {"app": "web"},
            "annotations": annotations,
            "creationTimestamp": format_time(created),
        },
        "spec": {"nodeName": node},
        "status": {
            "phase": phase,
            "conditions": conditions,
            "containerStatuses": [{"name": "c", "restartCount": restarts}],
        },
    }


# -- slow start -------------------------------------------------------------------------------------


def test_scenario_02_slow_start_batch_sizes() -> None:
    assert slow_start_batch_sizes(500) == [1, 2, 4, 8, 16, 32, 64, 128, 245]
    assert slow_start_batch_sizes(10) == [1, 2, 4, 3]
    assert slow_start_batch_sizes(0) == []


async def test_scenario_02_slow_start_runs_each_batch_concurrently() -> None:
    completed = 0
    started_after: list[int] = []

    async def create() -> None:
        nonlocal completed
        started_after.append(completed)
        await asyncio.sleep(0)
        completed += 1

    successes, error = await slow_start_batch(500, create)
    assert (successes, error) == (500, None)
    batches: dict[int, int] = {}
    for mark in started_after:
        batches[mark] = batches.get(mark, 0) + 1
    assert list(batches.values()) == [1, 2, 4, 8, 16, 32, 64, 128, 245]


async def test_scenario_14_slow_start_stops_after_failing_batch() -> None:
    calls = 0

    async def create() -> None:
        nonlocal calls
        calls += 1
        if calls >= 3:
            raise RuntimeError("quota")

    successes, error = await slow_start_batch(10, create)
    # Batch 1 ok, batch 2 (calls 2 and 3) has a failure: stop; 4+ never started.
    assert calls == 3 and successes == 2 and str(error) == "quota"


# -- deletion ranking -------------------------------------------------------------------------------


async def test_scenario_11_unscheduled_pending_not_ready_go_first() -> None:
    pods = [
        pod("ready-1", ready_since=NOW - 100),
        pod("running-not-ready", ready=False),
        pod("ready-2", ready_since=NOW - 200),
        pod("pending", phase="Pending", ready=False),
        pod("unscheduled", node="", phase="Pending", ready=False),
    ]
    victims = await pods_to_delete(pods, pods, 3, now=NOW)
    assert [p["metadata"]["name"] for p in victims] == ["unscheduled", "pending", "running-not-ready"]


async def test_phase_order_pending_unknown_running() -> None:
    pods = [pod("run", phase="Running"), pod("unk", phase="Unknown"), pod("pend", phase="Pending")]
    ordered = await sort_for_deletion(pods, [0, 0, 0], NOW)
    assert [p["metadata"]["name"] for p in ordered] == ["pend", "unk", "run"]


async def test_scenario_12_lower_pod_deletion_cost_goes_first() -> None:
    pods = [pod("expensive", cost="100"), pod("cheap", cost="-10")]
    assert [p["metadata"]["name"] for p in await pods_to_delete(pods, pods, 1, now=NOW)] == ["cheap"]


@pytest.mark.parametrize(
    ("value", "cost"),
    [("5", 5), ("-3", -3), ("0", 0), ("+5", 0), ("007", 0), ("1_0", 0), ("x", 0), ("2147483648", 0), (None, 0),
     ("1\u0661", 0)],  # a digit of another script: Go's ParseInt refuses it
)
def test_deletion_cost_parsing(value: str | None, cost: int) -> None:
    assert deletion_cost(pod("p", cost=value)) == cost


async def test_scenario_13_colocated_pods_go_first() -> None:
    pods = [pod("b1", node="node-b"), pod("a1", node="node-a"), pod("a2", node="node-a")]
    assert await ranks_by_colocated_related_pods(pods, pods) == [1, 2, 2]
    victim = (await pods_to_delete(pods, pods, 1, now=NOW))[0]
    assert victim["spec"]["nodeName"] == "node-a"
    # Without related pods (a ReplicaSet with no controller) every rank is 0.
    assert await ranks_by_colocated_related_pods(pods, []) == [0, 0, 0]


async def test_ready_time_in_log2_buckets_with_uid_tiebreak() -> None:
    # 100 s and 110 s ago share floor(log2(ns)) -> tie broken by UID, not by exact time.
    older = pod("older", ready_since=NOW - 110, uid="a")
    newer = pod("newer", ready_since=NOW - 100, uid="b")
    assert [p["metadata"]["name"] for p in await sort_for_deletion([newer, older], [0, 0], NOW)] == ["older", "newer"]
    # Far apart buckets: the more recently Ready one goes first whatever the UIDs.
    recent = pod("recent", ready_since=NOW - 10, uid="z")
    assert (await sort_for_deletion([older, recent], [0, 0], NOW))[0]["metadata"]["name"] == "recent"
    # Without `now` exact times decide.
    assert (await sort_for_deletion([older, newer], [0, 0], None))[0]["metadata"]["name"] == "newer"


async def test_ages_past_gos_largest_duration_share_one_bucket() -> None:
    # time.Sub saturates at about 292 years: Ready since 1000 and 1500 tie, and the UID decides (probe 5).
    year = 365.25 * 86400
    ancient = pod("ancient", ready_since=NOW - 1026 * year, uid="a")
    old = pod("old", ready_since=NOW - 526 * year, uid="b")
    assert [p["metadata"]["name"] for p in await sort_for_deletion([old, ancient], [0, 0], NOW)] == ["ancient", "old"]


async def test_restarts_then_creation_time() -> None:
    calm = pod("calm", restarts=0)
    crashy = pod("crashy", restarts=5)
    assert (await sort_for_deletion([calm, crashy], [0, 0], NOW))[0]["metadata"]["name"] == "crashy"
    old = pod("old", created=NOW - 100_000, uid="a")
    young = pod("young", created=NOW - 10, uid="b")
    assert (await sort_for_deletion([old, young], [0, 0], NOW))[0]["metadata"]["name"] == "young"


async def test_rank_beats_ready_time_but_cost_beats_rank() -> None:
    lonely_recent = pod("lonely", node="b", ready_since=NOW - 1)
    crowded_old = pod("crowded", node="a", ready_since=NOW - 10_000)
    ordered = await sort_for_deletion([lonely_recent, crowded_old], [1, 3], NOW)
    assert ordered[0]["metadata"]["name"] == "crowded"
    costly = pod("crowded", node="a", cost="5")
    ordered = await sort_for_deletion([costly, lonely_recent], [3, 1], NOW)
    assert ordered[0]["metadata"]["name"] == "lonely"


async def test_tied_pods_are_chosen_at_random_as_kcms() -> None:
    """KCM's indexer hands pods out in Go's map order, so ties are broken anew on every sync: a
    delete refused for some tied pods does not keep the others from being tried."""
    pods = [pod(n, node="", phase="Pending", ready=False, uid="same") for n in ("x", "y", "z")]
    chosen = {p["metadata"]["name"] for _ in range(60) for p in await pods_to_delete(pods, pods, 2, now=NOW)}
    assert chosen == {"x", "y", "z"}


async def test_delete_all_skips_sorting() -> None:
    pods = [pod("x"), pod("y", node="")]
    assert await pods_to_delete(pods, pods, 2, now=NOW) == pods


# -- availability -----------------------------------------------------------------------------------


async def test_scenario_22_availability_after_min_ready_seconds() -> None:
    ready_at = NOW - 4
    p = pod("p", ready_since=ready_at)
    assert not is_pod_available(p, 10, NOW)
    assert is_pod_available(p, 10, ready_at + 10)  # inclusive, as IsPodAvailable
    assert is_pod_available(p, 0, NOW)
    assert await min_next_availability_check([p], 10, NOW, lambda: NOW) == pytest.approx(6)
    # If it became due between status evaluation and now: look again at once.
    assert await min_next_availability_check([p], 10, NOW, lambda: NOW + 7) == 0.0
    assert await min_next_availability_check([pod("nr", ready=False)], 10, NOW, lambda: NOW) is None


# -- status -----------------------------------------------------------------------------------------


def rs(replicas: int = 2, generation: int = 1, status: dict | None = None, min_ready: int = 0) -> dict:
    return {
        "metadata": {"name": "web", "namespace": "ns", "uid": "rs-uid", "generation": generation},
        "spec": {
            "replicas": replicas,
            "minReadySeconds": min_ready,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web", "tier": "fe"}}},
        },
        "status": status or {},
    }


async def test_status_counts() -> None:
    pods = [
        pod("full", labels={"app": "web", "tier": "fe"}),
        pod("partial", labels={"app": "web"}, ready=False),
        pod("young", labels={"app": "web", "tier": "fe"}, ready_since=NOW - 1),
    ]
    status = await calculate_status(rs(min_ready=5), pods, [pod("t")], None, NOW)
    assert status == {
        "replicas": 3,
        "fullyLabeledReplicas": 2,
        "readyReplicas": 2,
        "availableReplicas": 1,
        "terminatingReplicas": 1,
    }
    assert "terminatingReplicas" not in await calculate_status(rs(), pods, None, None, NOW)


async def test_scenario_14_15_replica_failure_condition_set_then_cleared() -> None:
    failed = await calculate_status(rs(replicas=10), [], [], RuntimeError("exceeded quota"), NOW)
    (cond,) = failed["conditions"]
    assert (cond["type"], cond["status"], cond["reason"], cond["message"]) == (
        "ReplicaFailure", "True", "FailedCreate", "exceeded quota"
    )
    # A later error does not rewrite the existing condition.
    again = await calculate_status(rs(replicas=10, status=failed), [], [], RuntimeError("other"), NOW)
    assert again["conditions"] == [cond]
    cleared = await calculate_status(rs(replicas=10, status=failed), [], [], None, NOW)
    assert "conditions" not in cleared
    deleting = await calculate_status(rs(replicas=0), [pod("x")], [], RuntimeError("boom"), NOW)
    assert deleting["conditions"][0]["reason"] == "FailedDelete"


def test_scenario_20_21_status_unchanged_needs_observed_generation() -> None:
    steady = {"replicas": 2, "fullyLabeledReplicas": 2, "readyReplicas": 2, "availableReplicas": 2,
              "terminatingReplicas": 0, "observedGeneration": 1}
    new = {k: v for k, v in steady.items() if k != "observedGeneration"}
    assert status_unchanged(rs(status=steady), new)
    assert not status_unchanged(rs(generation=2, status=steady), new)  # 21: spec changed
    assert not status_unchanged(rs(status=steady), {**new, "readyReplicas": 1})
    assert not status_unchanged(rs(status={**steady, "terminatingReplicas": None}), new)


async def test_the_deletion_sort_in_runs_orders_pods_as_one_sort_would(monkeypatch: pytest.MonkeyPatch) -> None:
    # Sorted a run at a time and merged (to hand the loop back), pods come out in one sorted()
    # call's order wherever the ranking is consistent: here every pod's times differ.
    import pykcm.controller.podutil as podutil

    monkeypatch.setattr(podutil, "_SORT_RUN", 7)
    rng = random.Random(5)
    ages = rng.sample(range(1, 10**7), 2 * 300)
    pods = [
        pod(f"p{i}", node=rng.choice(("", "node-a")), phase=rng.choice(("Pending", "Running")),
            ready=rng.random() < 0.8, ready_since=NOW - ages[2 * i], created=NOW - ages[2 * i + 1],
            restarts=rng.randint(0, 2), cost=rng.choice((None, "5")), uid=f"{rng.getrandbits(32):08x}")
        for i in range(300)
    ]
    ranks = [rng.randint(0, 3) for _ in pods]
    for now in (NOW, None):
        one_sort = sorted(podutil._Ranked.of(p, rank, now, True) for p, rank in zip(pods, ranks, strict=True))
        ordered = await sort_for_deletion(pods, ranks, now)
        assert [p["metadata"]["name"] for p in ordered] == [r.pod["metadata"]["name"] for r in one_sort]


async def test_the_deletion_sort_reads_each_pods_times_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The sort runs on the event loop: a comparison that parsed both pods' timestamps made a
    # 10,000-pod scale down block the loop for over a second (n log n parses instead of 2n).
    import pykcm.controller.podutil as podutil

    parsed = 0
    real = podutil.parse_time

    def counting(value: str | None) -> float | None:
        nonlocal parsed
        parsed += 1
        return real(value)

    monkeypatch.setattr(podutil, "parse_time", counting)
    pods = [pod(f"p{i}", ready_since=NOW - 100 - i, created=NOW - 7200 - i, uid=f"{i:04d}") for i in range(200)]
    ordered = await sort_for_deletion(pods, [0] * len(pods), NOW)
    assert parsed == 2 * len(pods)  # its ready time and its creation time
    assert [p["metadata"]["name"] for p in ordered][:2] == ["p0", "p1"]  # ready the shortest, same bucket: UID
