"""Field projections: what an informer keeps of each object, and the union over its users."""

import pytest

from pykcm.client.resources import PODS
from pykcm.informers.delta_queue import Delta, DeltaType
from pykcm.informers.factory import SharedInformerFactory
from pykcm.informers.projection import FULL, covers, project, union

POD = {
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7", "labels": {"app": "web"},
                 "annotations": {"big": "x" * 1000, "controller.kubernetes.io/pod-deletion-cost": "5"},
                 "managedFields": [{"manager": "kubectl"}]},
    "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i", "env": [{"name": "A"}]}]},
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "message": "long"}],
               "containerStatuses": [{"name": "c", "restartCount": 2, "state": {"running": {}}}]},
}


def test_project_keeps_named_fields_applies_to_list_elements_and_map_keys():
    kept = project(POD, {
        "metadata": {"name": True, "labels": True, "annotations": {"controller.kubernetes.io/pod-deletion-cost": True}},
        "spec": {"nodeName": True},
        "status": {"conditions": {"type": True, "status": True}, "containerStatuses": {"restartCount": True}},
    })
    assert kept == {
        "metadata": {"name": "p", "labels": {"app": "web"},
                     "annotations": {"controller.kubernetes.io/pod-deletion-cost": "5"}},
        "spec": {"nodeName": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": [{"restartCount": 2}]},
    }
    assert POD["spec"]["containers"]  # the input is left alone


def test_project_interns_short_strings():
    a = project({"metadata": {"labels": {"app": "".join(["we", "b"])}}}, {"metadata": True})
    b = project({"metadata": {"labels": {"app": "".join(["w", "eb"])}}}, {"metadata": True})
    assert a["metadata"]["labels"]["app"] is b["metadata"]["labels"]["app"]


def test_union_and_covers():
    a = {"metadata": {"name": True}, "spec": {"nodeName": True}}
    b = {"metadata": {"labels": True}, "spec": True}
    both = union(a, b)
    assert both == {"metadata": {"name": True, "labels": True}, "spec": True}
    assert covers(both, a) and covers(both, b) and not covers(a, both)
    assert union(a, FULL) is FULL and covers(FULL, a) and not covers(a, FULL)


def test_shared_informer_keeps_the_union_and_a_full_request_wins():
    factory = SharedInformerFactory(client=None)  # type: ignore[arg-type]  # nothing is started
    informer = factory.informer(PODS, fields={"metadata": {"name": True, "namespace": True}})
    factory.informer(PODS, fields={"spec": {"nodeName": True}})
    assert informer._transform(dict(POD)) == {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}}
    factory.informer(PODS)  # a plugin that reads whole pods
    full = informer._transform({**POD, "metadata": dict(POD["metadata"])})
    assert full["spec"]["containers"] and "managedFields" not in full["metadata"]


def test_a_projection_keeping_metadata_whole_leaves_out_managed_fields_as_whole_objects_do():
    factory = SharedInformerFactory(client=None)  # type: ignore[arg-type]
    informer = factory.informer(PODS, fields={"metadata": True})  # a plugin's
    kept = informer._transform({**POD, "metadata": dict(POD["metadata"])})
    assert kept["metadata"]["labels"] == {"app": "web"} and "managedFields" not in kept["metadata"]


def test_an_informer_that_runs_refuses_to_keep_more_fields():
    factory = SharedInformerFactory(client=None)  # type: ignore[arg-type]
    informer = factory.informer(PODS, fields={"metadata": {"name": True}})
    informer._tasks = [object()]  # type: ignore[list-item]  # as if started
    informer.keep({"metadata": {"name": True}})  # nothing new: fine
    with pytest.raises(RuntimeError):
        informer.keep({"spec": True})


def test_a_relist_frees_the_old_cache_a_chunk_at_a_time(monkeypatch):
    # 150,000 changed pods took 0.3 s to free: one step of the loop when dropped at once.
    import pykcm.informers.informer as informer_module
    import pykcm.util.timeslice as timeslice

    monkeypatch.setattr(informer_module, "CHUNK", 2)
    monkeypatch.setattr(timeslice, "SLICE", 3600.0)  # count the CHUNK steps alone
    informer = SharedInformerFactory(client=None).informer(PODS)  # type: ignore[arg-type]
    pods = [{"metadata": {"name": f"p{i}", "namespace": "ns", "resourceVersion": "1"}} for i in range(5)]
    informer._apply(Delta(DeltaType.REPLACED, pods))
    fresh = [{"metadata": {"name": f"q{i}", "namespace": "ns", "resourceVersion": "2"}} for i in range(5)]
    # 2 steps building the new cache, 2 telling of the deleted, 2 of the added, 2 freeing the old.
    assert len(list(informer._steps(Delta(DeltaType.REPLACED, fresh)))) == 8


def test_relist_swaps_the_whole_cache_at_once_and_yields_between_chunks(monkeypatch):
    import pykcm.informers.informer as informer_module

    monkeypatch.setattr(informer_module, "CHUNK", 2)
    factory = SharedInformerFactory(client=None)  # type: ignore[arg-type]
    informer = factory.informer(PODS)
    pods = [{"metadata": {"name": f"p{i}", "namespace": "ns", "resourceVersion": "1"}} for i in range(5)]
    informer._apply(Delta(DeltaType.REPLACED, pods))
    seen: list[tuple[str, int]] = []
    informer.add_event_handler(on_delete=lambda o: seen.append(("delete", len(informer.indexer))),
                               on_add=lambda o: seen.append(("add", len(informer.indexer))))
    seen.clear()
    fresh = [{"metadata": {"name": f"q{i}", "namespace": "ns", "resourceVersion": "2"}} for i in range(5)]
    steps = informer._steps(Delta(DeltaType.REPLACED, fresh))
    next(steps)
    assert sorted(informer.indexer.keys()) == [f"ns/p{i}" for i in range(5)]  # still the old list
    for _ in steps:
        pass
    assert sorted(informer.indexer.keys()) == [f"ns/q{i}" for i in range(5)]
    # Handlers heard of every change with the new cache already in place.
    assert seen == [("delete", 5)] * 5 + [("add", 5)] * 5
