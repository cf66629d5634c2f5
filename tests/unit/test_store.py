"""Indexer cache: keys, the namespace index, extra indexers, replace."""

from pykcm.informers.store import (
    DeletedFinalStateUnknown,
    Indexer,
    object_key,
    split_key,
    unwrap_tombstone,
)


def obj(name: str, namespace: str | None = "ns", **labels: str) -> dict:
    meta = {"name": name, "labels": labels}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta}


def by_app(o: dict) -> list[str]:
    app = o["metadata"].get("labels", {}).get("app")
    return [app] if app else []


def test_keys_for_namespaced_and_cluster_scoped_objects():
    assert object_key(obj("a")) == "ns/a"
    assert object_key(obj("node-1", namespace=None)) == "node-1"
    assert split_key("ns/a") == ("ns", "a")
    assert split_key("node-1") == ("", "node-1")


def test_tombstone_key_and_unwrap():
    last = obj("gone")
    tomb = DeletedFinalStateUnknown("ns/gone", last)
    assert object_key(tomb) == "ns/gone"
    assert unwrap_tombstone(tomb) is last
    assert unwrap_tombstone(last) is last


def test_namespace_index_follows_adds_updates_and_deletes():
    store = Indexer()
    store.upsert(obj("a", "x"))
    store.upsert(obj("b", "x"))
    store.upsert(obj("c", "y"))
    assert sorted(o["metadata"]["name"] for o in store.in_namespace("x")) == ["a", "b"]
    store.delete("x/a")
    assert [o["metadata"]["name"] for o in store.in_namespace("x")] == ["b"]
    assert store.in_namespace("nope") == []
    assert len(store) == 2 and "y/c" in store


def test_extra_indexer_reindexes_on_update_and_existing_items():
    store = Indexer()
    store.upsert(obj("a", app="web"))
    store.add_indexers({"app": by_app})  # added after items exist: they are indexed at once
    assert store.index_keys("app", "web") == ["ns/a"]
    old = store.upsert(obj("a", app="db"))
    assert old["metadata"]["labels"] == {"app": "web"}
    assert store.index_keys("app", "web") == []
    assert store.index_keys("app", "db") == ["ns/a"]


def test_swap_takes_a_staged_copys_contents_and_indices():
    store = Indexer({"app": by_app})
    store.upsert(obj("a", app="web"))
    staged = store.empty_copy()  # as a relist builds the new cache aside
    staged.upsert(obj("b", app="db"))
    old = store.swap(staged)
    assert store.keys() == ["ns/b"] and list(old) == ["ns/a"]
    assert store.by_index("app", "web") == [] and store.index_keys("app", "db") == ["ns/b"]
    assert store.get_by("ns", "b")["metadata"]["name"] == "b"
    assert len(staged) == 0  # emptied, not shared


def test_registering_a_different_function_under_a_taken_name_fails():
    store = Indexer({"app": by_app})
    store.add_indexers({"app": by_app})  # same function: fine (two controllers, one informer)
    try:
        store.add_indexers({"app": lambda o: []})
    except ValueError:
        return
    raise AssertionError("expected ValueError")
