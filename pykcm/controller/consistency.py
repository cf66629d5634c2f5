"""Stale-cache protection: don't sync an owner until the caches show our own last writes.

KCM 1.36's `pkg/controller/util/consistency` (feature gates StaleControllerConsistency*, beta
and on by default). A controller records the resourceVersion of each write it makes for an
owner (the owner's status update, the pods it created or patched). A later sync of that owner
first checks that every informer involved has progressed to at least that resourceVersion;
if not, the sync is skipped with `StaleCacheError` and retried. Once the caches caught up the
record is dropped.

With the controller's gate off (KCM's StaleControllerConsistencyReplicaSet=false) the controller
uses `NoopConsistencyStore`, as KCM's NewNoopConsistencyStore: nothing recorded, never stale.

"Progressed" is the informer's `last_sync_resource_version()`: moved by list, event and bookmark
resourceVersions once the cache and every handler have applied them, so it never runs ahead of
the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pykcm.client.resources import Resource


class StaleCacheError(Exception):
    def __init__(self, resource: Resource, read_rv: str, wrote_rv: str) -> None:
        super().__init__(
            f"read version: {read_rv} is not as new as written version: {wrote_rv} for group resource {resource.name}"
        )
        self.resource = resource
        self.read_rv = read_rv
        self.wrote_rv = wrote_rv


def _well_formed(rv: str) -> bool:
    # A positive integer in ASCII digits without leading zeros ("0" means "any" in lists and watches).
    return rv[:1] in _NONZERO and rv.isascii() and rv.isdigit()


_NONZERO = frozenset("123456789")


def compare_resource_versions(a: str, b: str) -> int | None:
    """-1/0/1 for resourceVersions as apimachinery's CompareResourceVersion; None if either is malformed."""
    if not (_well_formed(a) and _well_formed(b)):
        return None
    x, y = (len(a), a), (len(b), b)  # no leading zeros: the longer is greater, equal lengths compare as text
    return (x > y) - (x < y)


@dataclass
class _OwnerRecord:
    uid: str
    versions: dict[Resource, str] = field(default_factory=dict)  # resource -> newest RV we wrote

    def wrote_at(self, resource: Resource, rv: str) -> None:
        current = self.versions.get(resource)
        order = None if current is None else compare_resource_versions(current, rv)
        if order is None or order < 0:  # a version that does not compare replaces the one kept, as in KCM
            self.versions[resource] = rv


class ConsistencyStore:
    def __init__(self, readers: dict[Resource, Callable[[], str]]) -> None:
        self._readers = readers  # resource -> newest resourceVersion its cache has
        self._writes: dict[str, _OwnerRecord] = {}

    def wrote_at(self, owner_key: str, owner_uid: str, resource: Resource, rv: str) -> None:
        if not rv:
            return
        record = self._writes.get(owner_key)
        if record is None or record.uid != owner_uid:
            record = self._writes[owner_key] = _OwnerRecord(owner_uid)
        record.wrote_at(resource, rv)

    def clear(self, owner_key: str, owner_uid: str = "") -> None:
        """Forget the owner's writes; with a uid, only if the record is for that incarnation."""
        record = self._writes.get(owner_key)
        if record is not None and (not owner_uid or record.uid == owner_uid):
            del self._writes[owner_key]

    def ensure_ready(self, owner_key: str) -> None:
        """Raise StaleCacheError unless every cache has seen what we wrote for this owner."""
        record = self._writes.get(owner_key)
        if record is None:
            return
        for resource, wrote in record.versions.items():
            reader = self._readers.get(resource)
            read = reader() if reader else ""
            if not read:
                continue
            if (compare_resource_versions(wrote, read) or 0) > 0:
                raise StaleCacheError(resource, read, wrote)
        self.clear(owner_key, record.uid)

    def written(self, owner_key: str) -> dict[Resource, str]:
        """What we wrote for the owner and still wait to see, by resource (for logs and tests)."""
        record = self._writes.get(owner_key)
        return dict(record.versions) if record else {}

    def __len__(self) -> int:
        return len(self._writes)


class NoopConsistencyStore(ConsistencyStore):
    """A store that records nothing and is always ready: the controller's feature gate is off."""

    def __init__(self) -> None:
        super().__init__({})

    def wrote_at(self, owner_key: str, owner_uid: str, resource: Resource, rv: str) -> None:
        return
