"""Thread-free indexer cache: objects by `namespace/name` key plus secondary indices."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
IndexFunc = Callable[[Obj], Iterable[str]]

NAMESPACE_INDEX = "namespace"


def object_key(obj: Obj) -> str:
    """`namespace/name`, or `name` for cluster-scoped objects (client-go MetaNamespaceKeyFunc)."""
    if isinstance(obj, DeletedFinalStateUnknown):
        return obj.key
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else meta["name"]


def split_key(key: str) -> tuple[str, str]:
    """(namespace, name); namespace is "" for cluster-scoped keys."""
    namespace, _, name = key.rpartition("/")
    return namespace, name


@dataclass(frozen=True)
class DeletedFinalStateUnknown:
    """Handed to delete handlers when a relist no longer has an object: its last known state."""

    key: str
    obj: Obj


def unwrap_tombstone(obj: Obj | DeletedFinalStateUnknown) -> Obj:
    return obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj


def namespace_index(obj: Obj) -> list[str]:
    namespace = obj["metadata"].get("namespace")
    return [namespace] if namespace else []


class Indexer:
    def __init__(self, indexers: dict[str, IndexFunc] | None = None) -> None:
        self._items: dict[str, Obj] = {}
        self._indexers: dict[str, IndexFunc] = {NAMESPACE_INDEX: namespace_index}
        self._indices: dict[str, dict[str, set[str]]] = {NAMESPACE_INDEX: {}}
        if indexers:
            self.add_indexers(indexers)

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        """Register extra indices; existing items are indexed straight away."""
        for name, func in indexers.items():
            if name in self._indexers:
                if self._indexers[name] is not func:
                    raise ValueError(f"indexer {name!r} already registered with a different function")
                continue
            self._indexers[name] = func
            self._indices[name] = {}
            for key, obj in self._items.items():
                self._index_one(name, key, obj)

    # -- writes ---------------------------------------------------------------------------------------

    def upsert(self, obj: Obj) -> Obj | None:
        """Add or replace; returns the previous object, if any."""
        key = object_key(obj)
        old = self._items.get(key)
        if old is not None:
            self._unindex(key, old)
        self._items[key] = obj
        for name in self._indexers:
            self._index_one(name, key, obj)
        return old

    def delete(self, key: str) -> Obj | None:
        old = self._items.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def empty_copy(self) -> Indexer:
        """An empty indexer with the same index functions, to build a replacement in."""
        return Indexer({name: func for name, func in self._indexers.items() if name != NAMESPACE_INDEX})

    def swap(self, other: Indexer) -> dict[str, Obj]:
        """Take `other`'s contents at once (it is left empty); returns the items held until now."""
        if other._indexers.keys() != self._indexers.keys():
            raise ValueError("swap needs an indexer with the same indices")
        old = self._items
        self._items, self._indices = other._items, other._indices
        other._items, other._indices = {}, {name: {} for name in other._indexers}
        return old

    # -- reads ----------------------------------------------------------------------------------------

    def get(self, key: str) -> Obj | None:
        return self._items.get(key)

    def get_by(self, namespace: str | None, name: str) -> Obj | None:
        return self._items.get(f"{namespace}/{name}" if namespace else name)

    # `list` is client-go's List; inside this class the name is the method, so annotations say builtins.list.
    def list(self) -> builtins.list[Obj]:
        return list(self._items.values())

    def keys(self) -> builtins.list[str]:
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def by_index(self, index: str, value: str) -> builtins.list[Obj]:
        keys = self._indices[index].get(value, ())
        return [self._items[k] for k in keys]

    def index_keys(self, index: str, value: str) -> builtins.list[str]:
        return list(self._indices[index].get(value, ()))

    def in_namespace(self, namespace: str) -> builtins.list[Obj]:
        return self.by_index(NAMESPACE_INDEX, namespace)

    # -- internals ------------------------------------------------------------------------------------

    def _index_one(self, name: str, key: str, obj: Obj) -> None:
        index = self._indices[name]
        for value in self._indexers[name](obj):
            index.setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: Obj) -> None:
        for name, func in self._indexers.items():
            index = self._indices[name]
            for value in func(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]
