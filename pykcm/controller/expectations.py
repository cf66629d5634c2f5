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

The lines are KCM's (at V(4); "Clobbering existing delete keys" an error), through the logger
the caller gives (KCM's take a logger): an event handler's is the controller's named one, a
sync's unnamed. A record is written `expectations={}`, as klog and zap write KCM's (Go's JSON of
a struct whose fields are unexported).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pykcm.util.log import Logger, get_logger

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

    def satisfied(self, key: str, logger: Logger = log) -> bool:
        record = self._records.get(key)
        v4 = logger.v(4)
        if record is None:  # never set, or deleted: a new controller starts clean
            if v4.enabled():
                v4.info("Controller either never recorded expectations, or the ttl expired", controller=key)
            return True
        if record.fulfilled():
            if v4.enabled():
                v4.info("Controller expectations fulfilled", expectations={})
            return True
        if record.expired(self.clock()):
            if v4.enabled():
                v4.info("Controller expectations expired", expectations={})
            return True
        if v4.enabled():
            v4.info("Controller still waiting on expectations", expectations={})
        return False

    def expect_creations(self, key: str, count: int, logger: Logger = log) -> None:
        self._set(key, count, 0, logger)

    def expect_deletions(self, key: str, pod_keys: list[str], logger: Logger = log) -> None:
        if (v4 := logger.v(4)).enabled():
            v4.info("Controller waiting on deletions", controller=key, keys=pod_keys)
        pending = self._pending_deletes.get(key)
        if pending:  # a sets.String: Go's JSON of a map, {"ns/a":{}}
            logger.error(None, "Clobbering existing delete keys", keys={k: {} for k in sorted(pending)})
        expected = set(pod_keys)
        self._pending_deletes[key] = expected
        self._set(key, 0, len(expected), logger)

    def creation_observed(self, key: str, logger: Logger = log) -> None:
        self.lower(key, 1, 0, logger)

    def deletion_observed(self, key: str, pod_key: str, logger: Logger = log) -> None:
        """Count `pod_key`'s deletion once, and only if we were waiting for it."""
        pending = self._pending_deletes.get(key)
        if pending is not None and pod_key in pending:
            if (v4 := logger.v(4)).enabled():
                v4.info("Controller received delete for pod", controller=key, key=pod_key)
            pending.discard(pod_key)
            self.lower(key, 0, 1, logger)

    def lower(self, key: str, add: int, delete: int, logger: Logger = log) -> None:
        record = self._records.get(key)
        if record is not None:
            record.add -= add
            record.delete -= delete
            if (v4 := logger.v(4)).enabled():
                v4.info("Lowered expectations", expectations={})

    def delete(self, key: str) -> None:
        """Forget everything about `key` (its controller was deleted or recreated)."""
        self._records.pop(key, None)
        self._pending_deletes.pop(key, None)

    def _set(self, key: str, add: int, delete: int, logger: Logger) -> None:
        self._records[key] = ControlleeExpectations(add, delete, self.clock())
        if (v4 := logger.v(4)).enabled():
            v4.info("Setting expectations", expectations={})
