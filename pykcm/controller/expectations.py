"""Controller expectations: don't act again until our own creates and deletes are observed.

The informer cache lags behind the API writes a controller makes. Without expectations a
second sync, triggered before the watch delivers the pods just created, would count too few
pods and create them again. KCM's `ControllerExpectations` plus
`UIDTrackingControllerExpectations` (pkg/controller/controller_utils.go), in one class:

- per controller key a record of outstanding `add` and `del` counts and when it was set;
  `expect_creations` / `expect_deletions` *replace* the record (timestamp reset);
- deletions are expected by pod key (`namespace/name`): `deletion_observed` counts a key once,
  so "deletionTimestamp set" followed by the real delete is one observation;
- a key is satisfied when it has no record, its counts are <= 0, or the record is older than
  five minutes: the safety valve against a lost watch event. Counts may go negative.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pykcm.util.log import get_logger

EXPECTATIONS_TIMEOUT = 5 * 60.0  # KCM's ExpectationsTimeout

log = get_logger("expectations")


@dataclass
class ControlleeExpectations:
    add: int
    delete: int
    timestamp: float

    def fulfilled(self) -> bool:
        return self.add <= 0 and self.delete <= 0

    def expired(self, now: float) -> bool:
        return now - self.timestamp > EXPECTATIONS_TIMEOUT


@dataclass
class ControllerExpectations:
    clock: Callable[[], float] = time.monotonic
    _records: dict[str, ControlleeExpectations] = field(default_factory=dict)
    _pending_deletes: dict[str, set[str]] = field(default_factory=dict)  # the UID-tracking store

    def get(self, key: str) -> ControlleeExpectations | None:
        return self._records.get(key)

    def satisfied(self, key: str) -> bool:
        record = self._records.get(key)
        if record is None:
            return True  # never set, or deleted: a new controller starts clean
        if record.fulfilled():
            return True
        if record.expired(self.clock()):
            log.v(4).info("Controller expectations expired", controller=key, add=record.add, delete=record.delete)
            return True
        log.v(4).info("Controller still waiting on expectations", controller=key, add=record.add, delete=record.delete)
        return False

    def expect_creations(self, key: str, count: int) -> None:
        self._set(key, count, 0)

    def expect_deletions(self, key: str, pod_keys: Iterable[str]) -> None:
        expected = set(pod_keys)
        if self._pending_deletes.get(key):
            log.error(None, "Clobbering existing delete keys", controller=key, keys=sorted(self._pending_deletes[key]))
        self._pending_deletes[key] = expected
        self._set(key, 0, len(expected))

    def creation_observed(self, key: str) -> None:
        self.lower(key, 1, 0)

    def deletion_observed(self, key: str, pod_key: str) -> None:
        """Count `pod_key`'s deletion once, and only if we were waiting for it."""
        pending = self._pending_deletes.get(key)
        if pending is not None and pod_key in pending:
            pending.discard(pod_key)
            self.lower(key, 0, 1)

    def lower(self, key: str, add: int, delete: int) -> None:
        record = self._records.get(key)
        if record is not None:
            record.add -= add
            record.delete -= delete

    def delete(self, key: str) -> None:
        """Forget everything about `key` (its controller was deleted or recreated)."""
        self._records.pop(key, None)
        self._pending_deletes.pop(key, None)

    def _set(self, key: str, add: int, delete: int) -> None:
        self._records[key] = ControlleeExpectations(add, delete, self.clock())
        log.v(4).info("Setting expectations", controller=key, add=add, delete=delete)
