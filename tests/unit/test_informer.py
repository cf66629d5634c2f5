"""Informer delta processing without an API server: handlers, relist tombstones, late handlers, resync."""

import asyncio

from pykcm.client.resources import CONFIGMAPS
from pykcm.informers.delta_queue import Delta, DeltaType
from pykcm.informers.informer import SharedInformer
from pykcm.informers.store import DeletedFinalStateUnknown
from tests.support import LoopTurns


def cm(name: str, rv: str) -> dict:
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def add(self, o):
        self.events.append(("add", o["metadata"]["name"]))

    def update(self, old, new):
        self.events.append(("update", new["metadata"]["name"], old is new))

    def delete(self, o):
        tomb = isinstance(o, DeletedFinalStateUnknown)
        name = (o.obj if tomb else o)["metadata"]["name"]
        self.events.append(("delete", name, tomb))


def informer_with(recorder: Recorder, resync: float = 0) -> SharedInformer:
    informer = SharedInformer(client=None, resource=CONFIGMAPS)  # type: ignore[arg-type]  # no reflector runs
    informer.add_event_handler(recorder.add, recorder.update, recorder.delete, resync=resync)
    return informer


def test_watch_deltas_reach_cache_and_handlers_in_order():
    rec = Recorder()
    informer = informer_with(rec)
    informer._apply(Delta(DeltaType.REPLACED, [cm("a", "1")]))
    informer._apply(Delta(DeltaType.ADDED, cm("b", "2")))
    informer._apply(Delta(DeltaType.UPDATED, cm("a", "3")))
    informer._apply(Delta(DeltaType.DELETED, cm("b", "4")))
    assert informer.has_synced()
    assert rec.events == [("add", "a"), ("add", "b"), ("update", "a", False), ("delete", "b", False)]
    assert informer.indexer.keys() == ["ns/a"]
    assert informer.indexer.get("ns/a")["metadata"]["resourceVersion"] == "3"


def test_last_sync_resource_version_moves_with_lists_events_and_bookmarks_after_handlers_ran():
    seen_by_handler: list[str] = []
    informer = SharedInformer(client=None, resource=CONFIGMAPS)  # type: ignore[arg-type]
    informer.add_event_handler(on_add=lambda o: seen_by_handler.append(informer.last_sync_resource_version()))
    assert informer.last_sync_resource_version() == ""
    informer._apply(Delta(DeltaType.REPLACED, [cm("a", "3")], "10"))
    assert informer.last_sync_resource_version() == "10"  # the list's version, not the newest item's
    informer._apply(Delta(DeltaType.BOOKMARK, None, "25"))
    assert informer.last_sync_resource_version() == "25" and len(informer.indexer) == 1
    informer._apply(Delta(DeltaType.ADDED, cm("b", "26"), "26"))
    assert informer.last_sync_resource_version() == "26"
    assert seen_by_handler == ["", "25"]  # a handler never sees the version of what it is handling


def test_relist_delivers_tombstones_with_last_known_state_and_updates_every_cached_object():
    """As client-go's Replaced deltas: an unchanged object is an update too (KCM's ReplicaSet
    handler re-enqueues on it, so a ReplicaSet in a long error backoff is synced after a relist)."""
    rec = Recorder()
    informer = informer_with(rec)
    informer._apply(Delta(DeltaType.REPLACED, [cm("keep", "1"), cm("change", "1"), cm("vanish", "7")]))
    rec.events.clear()
    informer._apply(Delta(DeltaType.REPLACED, [cm("keep", "1"), cm("change", "9"), cm("new", "9")]))
    assert ("delete", "vanish", True) in rec.events
    assert ("update", "change", False) in rec.events
    assert ("add", "new") in rec.events
    assert ("update", "keep", False) in rec.events  # same resourceVersion: an update all the same
    assert sorted(informer.indexer.keys()) == ["ns/change", "ns/keep", "ns/new"]


def test_relisted_object_at_the_cached_resource_version_is_the_cached_object():
    """A relist keeps what the cache holds when nothing changed, so the relisted copy can be freed
    at once (memory returns to its level) and is not projected again."""
    informer = informer_with(Recorder())
    informer.keep({"metadata": {"name": True, "namespace": True, "resourceVersion": True}, "data": True})
    informer._apply(Delta(DeltaType.REPLACED, [informer._transform(cm("a", "1")), informer._transform(cm("b", "1"))]))
    cached_a, cached_b = informer.indexer.get("ns/a"), informer.indexer.get("ns/b")
    relisted_a, relisted_b = cm("a", "1"), {**cm("b", "2"), "data": {"k": "v"}}
    assert informer._transform(relisted_a) is cached_a
    changed = informer._transform(relisted_b)
    assert changed is not cached_b and changed["data"] == {"k": "v"} and "kind" not in changed  # projected anew
    unversioned = {"metadata": {"name": "a", "namespace": "ns"}}
    assert informer._transform(unversioned) is not cached_a  # no resourceVersion: nothing to compare


def test_tombstone_carries_last_state():
    seen = []
    informer = SharedInformer(client=None, resource=CONFIGMAPS)  # type: ignore[arg-type]
    informer.add_event_handler(on_delete=seen.append)
    informer._apply(Delta(DeltaType.REPLACED, [cm("x", "5")]))
    informer._apply(Delta(DeltaType.REPLACED, []))
    assert seen[0].key == "ns/x" and seen[0].obj["metadata"]["resourceVersion"] == "5"


def test_late_handler_hears_about_existing_objects():
    informer = informer_with(Recorder())
    informer._apply(Delta(DeltaType.REPLACED, [cm("a", "1"), cm("b", "1")]))
    late = Recorder()
    reg = informer.add_event_handler(late.add, late.update, late.delete)
    assert sorted(late.events) == [("add", "a"), ("add", "b")]
    assert reg.has_synced()


def test_failing_handler_does_not_stop_the_others():
    rec = Recorder()
    informer = SharedInformer(client=None, resource=CONFIGMAPS)  # type: ignore[arg-type]
    informer.add_event_handler(on_add=lambda o: 1 / 0)
    informer.add_event_handler(on_add=rec.add)
    informer._apply(Delta(DeltaType.ADDED, cm("a", "1")))
    assert rec.events == [("add", "a")]


async def test_resync_replays_cache_as_updates_without_listing():
    rec = Recorder()
    informer = informer_with(rec, resync=1.0)  # 1 s is the floor client-go enforces
    informer._apply(Delta(DeltaType.REPLACED, [cm("a", "1")]))
    task = asyncio.create_task(informer._resync_loop())
    try:
        for _ in range(40):
            if ("update", "a", True) in rec.events:
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
    assert ("update", "a", True) in rec.events  # old is new: a resync, not a change


async def test_a_list_the_cache_cannot_take_is_the_reason_it_has_not_synced():
    informer = SharedInformer(client=None, resource=CONFIGMAPS)  # type: ignore[arg-type]

    def broken_index(obj: dict) -> list[str]:
        if obj["metadata"]["name"] == "bad":
            raise KeyError("owner")
        return []

    informer.add_indexers({"broken": broken_index})
    await informer._apply_logged(Delta(DeltaType.REPLACED, [cm("a", "1"), cm("bad", "2")], "2"))
    assert not informer.has_synced()
    assert informer.sync_error() == "applying the list failed: 'owner'"  # on /healthz, not only in the log
    await informer._apply_logged(Delta(DeltaType.REPLACED, [cm("a", "3")], "3"))
    assert informer.has_synced() and informer.sync_error() is None


def test_a_failing_handler_is_logged_with_its_type_and_place_and_the_others_still_run(caplog):
    rec = Recorder()
    informer = informer_with(rec)

    def broken_handler(obj):
        return obj["spec"]  # a ConfigMap has none: a bug in the handler

    informer.add_event_handler(on_add=broken_handler)
    with caplog.at_level("INFO", logger="pykcm"):
        informer._apply(Delta(DeltaType.ADDED, cm("a", "1")))
    assert rec.events == [("add", "a")]
    [record] = [r for r in caplog.records if r.getMessage() == "Event handler failed"]
    assert record.kv["err"].startswith("KeyError: 'spec' (at test_informer.py:")  # type: ignore[attr-defined]
    assert record.kv["err"].endswith(" in broken_handler)")  # type: ignore[attr-defined]


async def test_a_burst_of_watch_events_hands_the_loop_back_when_its_handlers_take_a_slice(monkeypatch):
    # Handlers' cost per event varies (an orphan pod against 2,000 ReplicaSets): a burst of queued
    # events must not hold the loop for all of them at once, whatever their count.
    import pykcm.util.timeslice as timeslice

    monkeypatch.setattr(timeslice, "SLICE", 0.0)  # every event takes a whole slice
    informer = informer_with(Recorder())
    for i in range(10):
        informer._deltas.push(DeltaType.ADDED, cm(f"c{i}", str(i + 1)))
    async with LoopTurns() as turns:
        processing = asyncio.create_task(informer._process())
        while len(informer.indexer) < 10:
            await asyncio.sleep(0)
        processing.cancel()
        await asyncio.gather(processing, return_exceptions=True)
    assert turns.count >= 10  # the loop turned between the events, not once before and once after


async def test_a_burst_after_a_wait_is_applied_in_one_turn():
    # The stale-cache check of the ReplicaSet controller reads the informer between two loop turns: a
    # short burst (our own status write behind another event) must not be split because the slice
    # of the last burst, long ago, ran out meanwhile.
    informer = informer_with(Recorder())
    processing = asyncio.create_task(informer._process())
    await asyncio.sleep(0.05)  # idle
    for i in range(5):
        informer._deltas.push(DeltaType.ADDED, cm(f"c{i}", str(i + 1)))
    await asyncio.sleep(0)  # the informer's one turn
    applied = len(informer.indexer)
    processing.cancel()
    await asyncio.gather(processing, return_exceptions=True)
    assert applied == 5
