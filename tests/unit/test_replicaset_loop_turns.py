"""A sync of a 10,000-pod ReplicaSet hands the event loop back as it goes.

KCM syncs on a goroutine while its informers keep running; here the sync shares the one event
loop, and its loops over the pods (the filters, the claim, the status count, the deletion ranking,
the availability recheck) held it 0.1-0.3 s in one stretch. SLICE 0 makes every pod end a slice,
so the turns another task gets are counted without timing anything.
"""

from __future__ import annotations

import time

import pytest

import pykcm.controller.podutil as podutil
import pykcm.util.timeslice as timeslice
from pykcm.controller.controllerref import PodControllerRefManager, filter_claimed_pods
from pykcm.controller.podutil import filter_pods, is_pod_active, min_next_availability_check, sort_for_deletion
from pykcm.controller.selectors import selector_from_set
from pykcm.controllers.replicaset.scaling import pods_to_delete, ranks_by_colocated_related_pods
from pykcm.controllers.replicaset.status import calculate_status
from pykcm.util.timeslice import TimeSlice
from tests.support import LoopTurns
from tests.unit.replicaset_harness import Harness, make_pod, make_rs, ready_status

N = 10_000
SMALL = 50  # pods for the one-function tests


@pytest.fixture(autouse=True)
def every_pod_a_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeslice, "SLICE", 0.0)


def steady_status(replicas: int) -> dict:
    counts = ("replicas", "fullyLabeledReplicas", "readyReplicas", "availableReplicas")
    return {**dict.fromkeys(counts, replicas), "terminatingReplicas": 0, "observedGeneration": 1}


def owned_pods(rs: dict, n: int) -> list[dict]:
    return [make_pod(f"web-{i:05d}", owner=rs, status=ready_status()) for i in range(n)]


async def test_a_steady_sync_of_10000_pods_gives_other_tasks_turns() -> None:
    h = Harness()
    rs = make_rs(replicas=N)
    rs["status"] = steady_status(N)
    h.add_rs(rs)
    for pod in owned_pods(rs, N):
        h.ctrl.pods.indexer.upsert(pod)  # the cache alone: a steady sync calls no API
    async with LoopTurns() as turns:
        await h.sync()
    assert turns.count >= N
    assert h.api.calls == []  # nothing to do, as before: no claim patch, no status write


async def test_a_scale_down_sync_of_10000_pods_gives_other_tasks_turns_and_deletes_the_same_pods() -> None:
    h = Harness()
    rs = h.add_rs(make_rs(replicas=N // 2))
    pods = owned_pods(rs, N)
    unscheduled = {p["metadata"]["name"] for p in pods[:500]}  # ranked first: the burst takes exactly these
    for pod in pods[:500]:
        pod.update(spec={"nodeName": ""}, status={"phase": "Pending"})
    for pod in pods:
        h.ctrl.pods.indexer.upsert(pod)
    async with LoopTurns() as turns:
        await h.sync()
    assert turns.count >= N
    assert set(h.api.verbs("delete")) == unscheduled
    status = h.last_status()
    assert (status["replicas"], status["readyReplicas"], status["availableReplicas"]) == (N, N - 500, N - 500)


# -- each loop --------------------------------------------------------------------------------------


async def test_the_activity_filter_hands_the_loop_back() -> None:
    pods = owned_pods(make_rs(), SMALL)
    pods[0]["status"] = {"phase": "Succeeded"}
    async with LoopTurns() as turns:
        active = await filter_pods(pods, is_pod_active)
    assert active == pods[1:] and turns.count >= SMALL


async def test_the_claim_hands_the_loop_back() -> None:
    rs = make_rs()
    pods = owned_pods(rs, SMALL)

    async def no_write(*_: object) -> None:
        raise AssertionError("no adoption or release expected")

    manager = PodControllerRefManager(rs, selector_from_set({"app": "web"}), "apps/v1", "ReplicaSet",
                                      no_write, no_write)
    async with LoopTurns() as turns:
        claimed, error = await manager.claim_pods(pods)
    assert (claimed, error) == (pods, None) and turns.count >= SMALL


async def test_the_claimed_filter_hands_the_loop_back() -> None:
    rs = make_rs()
    pods = owned_pods(rs, SMALL)
    pods[0]["metadata"]["labels"] = {"app": "other"}
    async with LoopTurns() as turns:
        claimed = await filter_claimed_pods(rs, selector_from_set({"app": "web"}), pods)
    assert claimed == pods[1:] and turns.count >= SMALL


async def test_the_status_count_hands_the_loop_back() -> None:
    rs = make_rs(replicas=SMALL)
    pods = owned_pods(rs, SMALL)
    async with LoopTurns() as turns:
        status = await calculate_status(rs, pods, [], None, 0.0)
    assert status["readyReplicas"] == SMALL and turns.count >= SMALL


async def test_the_deletion_ranking_hands_the_loop_back() -> None:
    pods = owned_pods(make_rs(), SMALL)
    async with LoopTurns() as turns:
        ranks = await ranks_by_colocated_related_pods(pods, pods)
    assert ranks == [SMALL] * SMALL and turns.count >= SMALL
    async with LoopTurns() as turns:
        await sort_for_deletion(pods, ranks, None)
    assert turns.count >= SMALL
    # The ranks, the ranking and the age-ratio metric each read every pod.
    async with LoopTurns() as turns:
        victims = await pods_to_delete(pods, pods, 1)
    assert len(victims) == 1 and turns.count >= 3 * SMALL


async def test_the_deletion_sort_hands_the_loop_back_between_runs_and_within_merges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One sorted() call of 10,000 pods held the loop ~0.15 s: runs are sorted a turn each, then merged.
    monkeypatch.setattr(podutil, "_SORT_RUN", 8)
    items = [(i * 7919) % SMALL for i in range(SMALL)]
    async with LoopTurns() as turns:
        ordered = await podutil._sorted_handing_back(items, TimeSlice())  # type: ignore[arg-type]
    assert ordered == sorted(items) and turns.count >= SMALL


async def test_each_run_of_the_deletion_sort_is_sorted_on_a_turn_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeslice, "SLICE", 60.0)  # no slice ends by time: only the pause before each run
    monkeypatch.setattr(podutil, "_SORT_RUN", 8)
    turns_at_sort: list[int] = []

    def recording_sorted(items: list[int]) -> list[int]:
        turns_at_sort.append(turns.count)
        return sorted(items)

    monkeypatch.setattr(podutil, "sorted", recording_sorted, raising=False)
    async with LoopTurns() as turns:
        await podutil._sorted_handing_back(list(range(64, 0, -1)), TimeSlice())  # type: ignore[arg-type]
    assert len(turns_at_sort) == 8 and turns_at_sort == sorted(set(turns_at_sort))


class _Tied:
    """Ordered by `rank` alone: equal ranks are ties whose input order a stable sort keeps."""

    def __init__(self, rank: int, name: str) -> None:
        self.rank, self.name = rank, name

    def __lt__(self, other: _Tied) -> bool:
        return self.rank < other.rank


async def test_the_deletion_sorts_merge_keeps_tied_pods_in_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podutil, "_SORT_RUN", 7)
    items = [_Tied(i * 7 % 5, f"p{i}") for i in range(100)]
    ordered = await podutil._sorted_handing_back(items, TimeSlice())  # type: ignore[arg-type]
    assert [t.name for t in ordered] == [t.name for t in sorted(items)]


async def test_the_availability_recheck_hands_the_loop_back_then_reads_the_clock() -> None:
    # KCM picks the earliest pod as of the status evaluation, then reads its clock once more.
    pods = [make_pod(f"p{i}", status=ready_status(seconds_ago=i)) for i in range(1, SMALL + 1)]
    evaluated_at = time.time()
    read_at: list[int] = []
    async with LoopTurns() as turns:

        def clock() -> float:
            read_at.append(turns.count)
            return evaluated_at

        delay = await min_next_availability_check(pods, 3600, evaluated_at, clock)
    assert delay is not None and read_at[0] >= SMALL
