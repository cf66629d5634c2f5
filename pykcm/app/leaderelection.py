"""Lease leader election with client-go's algorithm (tools/leaderelection) on asyncio.

The lock is a `coordination.k8s.io/v1` Lease. Candidates never trust the timestamps written in
it: a lease counts as held until `leaseDurationSeconds` have passed on the *local monotonic
clock* since this process last saw the record change. Writes carry the resourceVersion that
was read, so when two candidates race, the apiserver's Conflict makes one of them lose the
round. This tolerates clock skew between hosts (not skew *rate*). It does not fence by itself:
a leader that stops renewing must stop working within the renew deadline, which the manager
ensures by exiting, and leasethread.py runs it on its own thread and fences the leader's writes
with `renew_sent` (pykcm/client/fence.py). Unlike client-go, a leader whose renewal finds the
Lease naming another holder (or, deleted, created by another first) gives it up at once
(`on_lost`), not after the deadline; a Lease deleted and not yet re-created it creates again.

    elector = LeaderElector(LeaseLock(client, "kube-system", "pykcm", identity), config)
    if await elector.acquire(stop):       # standby until this returns
        lost = not await elector.renew(stop_renewing)   # renews every retry period
        ...
        await elector.release()           # on a clean shutdown: a standby takes over at once
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pykcm.app import metrics
from pykcm.app.options import LEADER_ELECTION_JITTER
from pykcm.client.errors import AlreadyExists, ApiError, NotFound, TransportError
from pykcm.client.events import NORMAL, EventRecorder
from pykcm.client.http import Timeout
from pykcm.client.resources import LEASES
from pykcm.client.rest import RestClient
from pykcm.util.backoff import jitter
from pykcm.util.log import get_logger

log = get_logger("leaderelection")

USER_AGENT_SUFFIX = "leader-election"
HEALTH_TOLERANCE = 20.0  # KCM's HealthzAdaptor: unhealthy once leaseDuration + 20 s pass without a renewal


def new_identity() -> str:
    """`<hostname>_<uuid>`: the uuid keeps two processes on one host apart."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def micro_time(now: datetime.datetime) -> str:
    """metav1.MicroTime's wire form: RFC 3339 in UTC with exactly six fractional digits."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class LeaderElectionRecord:
    """The Lease spec fields the algorithm reads and writes (client-go's LeaderElectionRecord)."""

    holder_identity: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    leader_transitions: int = 0

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> LeaderElectionRecord:
        spec = spec or {}
        return cls(
            holder_identity=spec.get("holderIdentity") or "",
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            leader_transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        # client-go writes the whole spec (an empty holder too, which is how a release reads).
        return {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.leader_transitions,
        }


@dataclass(frozen=True)
class LeaderElectionConfig:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    @property
    def request_timeout(self) -> float:
        """KCM gives the lock's client half the renew deadline (at least 1 s) per request."""
        return max(self.renew_deadline / 2, 1.0)


class LeaseLock:
    """Reads and writes one Lease, remembering the last object seen for optimistic updates."""

    def __init__(
        self,
        client: RestClient,
        namespace: str,
        name: str,
        identity: str,
        events: EventRecorder | None = None,
        request_timeout: float = 5.0,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.events = events
        self._timeout = Timeout(total=request_timeout)
        self.lease: dict[str, Any] | None = None

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def get(self) -> LeaderElectionRecord:
        """The current record; raises NotFound if the Lease does not exist."""
        self.lease = await self.client.request(
            "GET", LEASES.path(self.namespace, self.name), timeout=self._timeout
        )
        return LeaderElectionRecord.from_spec(self.lease.get("spec"))

    async def create(self, record: LeaderElectionRecord) -> None:
        body = {
            "apiVersion": LEASES.api_version,
            "kind": LEASES.kind,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.to_spec(),
        }
        self.lease = await self.client.request("POST", LEASES.path(self.namespace), body=body, timeout=self._timeout)

    async def update(self, record: LeaderElectionRecord) -> None:
        """PUT the record over the last Lease seen; its resourceVersion makes a racing write a Conflict."""
        if self.lease is None:
            raise RuntimeError("lease not initialized: get or create it first")
        body = {**self.lease, "spec": record.to_spec()}
        self.lease = await self.client.request(
            "PUT", LEASES.path(self.namespace, self.name), body=body, timeout=self._timeout
        )

    def record_event(self, message: str) -> None:
        if self.events is None or self.lease is None:
            return
        subject = {"kind": LEASES.kind, "apiVersion": LEASES.api_version, "metadata": self.lease["metadata"]}
        self.events.record(subject, NORMAL, "LeaderElection", f"{self.identity} {message}")


class LeaderElector:
    """client-go's LeaderElector: acquire, renew, release and a health check over one LeaseLock."""

    def __init__(
        self,
        lock: LeaseLock,
        config: LeaderElectionConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime.datetime] = _utcnow,
        may_write: Callable[[], str | None] = lambda: None,
        event_on_loss: bool = True,
        on_lost: Callable[[str], None] = lambda _reason: None,
        renew_interval: float | None = None,
    ) -> None:
        self.lock = lock
        self.config = config
        self.name = lock.name  # the metrics label, as KCM passes the lease name
        self._clock = clock
        self._wall_clock = wall_clock
        self.observed_record = LeaderElectionRecord()
        self._observed_raw: LeaderElectionRecord | None = None
        self.observed_time = 0.0
        # When the last successful write naming us as holder was sent (not answered): the fence's base.
        self.renew_sent = 0.0
        self._may_write = may_write  # a reason not to acquire or renew now (the event loop is wedged)
        self._refusal = ""
        self._event_on_loss = event_on_loss  # False: a fenced leader writes nothing once the lease may be gone
        # Called on this loop the moment a renewal finds the lease gone (the fence shuts then, not when
        # renew() has returned to the main loop); lost_reason says why.
        self._on_lost = on_lost
        self.lost_reason = ""
        self._leading = False  # within renew(): a deleted Lease or another holder is a lost lease
        # Between renewals (and retries): the retry period, or less so that a fence window never closes.
        self.renew_interval = config.retry_period if renew_interval is None else renew_interval
        self._reported_leader = ""
        metrics.leader_election_master_status.labels(self.name).set(0)
        # Present from the start, where client-go's appears on the first slow path: Prometheus'
        # advice for a known label, so that rate() reads 0 rather than no data.
        metrics.leader_election_slowpath.labels(self.name)

    @property
    def identity(self) -> str:
        return self.lock.identity

    def is_leader(self) -> bool:
        """Whether the record this process last saw (or wrote) names it as holder."""
        return self.observed_record.holder_identity == self.identity

    def _lease_valid(self, now: float) -> bool:
        return self.observed_time + self.observed_record.lease_duration_seconds > now

    def _set_observed(self, record: LeaderElectionRecord, sent: float | None = None) -> None:
        self.observed_record = record
        self.observed_time = self._clock()
        if sent is not None and record.holder_identity == self.identity:
            self.renew_sent = sent

    # -- one round ------------------------------------------------------------------------------------

    async def try_acquire_or_renew(self) -> bool:
        """One attempt to take or keep the lease; False means "not leader after this round"."""
        if self._lease_writes_paused():
            return False
        now = self._clock()
        stamp = micro_time(self._wall_clock())
        desired = LeaderElectionRecord(
            holder_identity=self.identity,
            lease_duration_seconds=int(self.config.lease_duration),
            acquire_time=stamp,
            renew_time=stamp,
        )
        # 1. Fast path: still leader by our own clock, so assume nobody wrote since our last write.
        if self.is_leader() and self._lease_valid(now):
            record = replace(
                desired,
                acquire_time=self.observed_record.acquire_time,
                leader_transitions=self.observed_record.leader_transitions,
            )
            sent = self._clock()
            try:
                await self.lock.update(record)
            except (ApiError, TransportError) as err:
                log.v(2).info("Failed to update lease optimistically, falling back to slow path", lock=self._desc(),
                              err=str(err))
            else:
                self._set_observed(record, sent)
                return True
        # 2. Read the lease, creating it if nobody has yet.
        try:
            current = await self.lock.get()
        except NotFound:  # never created, or deleted (by hand): created again, as client-go does
            return await self._create(desired)
        except (ApiError, TransportError) as err:
            log.error(err, "Error retrieving lease lock", lock=self._desc())
            return False
        # 3. A changed record restarts the expiry countdown, measured on our clock from now.
        if current != self._observed_raw:
            self._set_observed(current)
            self._observed_raw = current
        holder = current.holder_identity
        if self._leading and holder not in ("", self.identity):
            # It stays valid past our renew deadline (its countdown just restarted): waiting is double
            # leadership. An empty holder (cleared by hand) is free, so taken back below as before.
            return self._lose(f"lease taken by {holder}", "Lease taken by another candidate, stopping", holder=holder)
        if current.holder_identity and self._lease_valid(now) and not self.is_leader():
            log.v(4).info("Lease is held by and has not yet expired", lock=self._desc(), holder=current.holder_identity)
            return False
        # 4. Take over (one more transition) or renew what we hold.
        if self.is_leader():
            record = replace(desired, acquire_time=current.acquire_time, leader_transitions=current.leader_transitions)
            metrics.leader_election_slowpath.labels(self.name).inc()
        else:
            record = replace(desired, leader_transitions=current.leader_transitions + 1)
        sent = self._clock()
        try:
            await self.lock.update(record)
        except (ApiError, TransportError) as err:
            log.error(err, "Failed to update lease", lock=self._desc())
            return False
        self._set_observed(record, sent)
        return True

    async def _create(self, record: LeaderElectionRecord) -> bool:
        sent = self._clock()
        try:
            await self.lock.create(record)
        except AlreadyExists as err:
            if self._leading:  # deleted under us and created by another first: it leads now
                return self._lose("lease taken by another candidate", "Lease created by another candidate, stopping")
            log.error(err, "Error initially creating lease lock", lock=self._desc())
            return False
        except (ApiError, TransportError) as err:
            log.error(err, "Error initially creating lease lock", lock=self._desc())
            return False
        self._set_observed(record, sent)
        return True

    def _lose(self, reason: str, message: str, **kv: str) -> bool:
        """Give the lease up now, for `reason`: the caller's round returns this False."""
        self.lost_reason = reason
        self._on_lost(reason)
        log.error(None, message, lock=self._desc(), **kv)
        return False

    def _lease_writes_paused(self) -> bool:
        """Whether `may_write` forbids this round; logs when that starts and ends."""
        reason = self._may_write() or ""
        if reason != self._refusal:
            self._refusal = reason
            if reason:
                log.error(None, "Not renewing lease", lock=self._desc(), reason=reason)
            else:
                log.info("Renewing lease again", lock=self._desc())
        return bool(reason)

    # -- loops ----------------------------------------------------------------------------------------

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Try every retry period (jittered x1.2) until leader (True) or `stop` is set (False)."""
        # identity: pykcm's addition (client-go's line has the lock only), the one place it is said.
        log.info("Attempting to acquire leader lease...", lock=self._desc(), identity=self.identity)
        while not stop.is_set():
            succeeded = await self.try_acquire_or_renew()
            self._report_transition()
            if succeeded:
                self.lock.record_event("became leader")
                metrics.leader_election_master_status.labels(self.name).set(1)
                log.info("Successfully acquired lease", lock=self._desc(), identity=self.identity)
                return True
            log.v(4).info("Failed to acquire lease", lock=self._desc())
            await _sleep_unless(stop, jitter(self.config.retry_period, LEADER_ELECTION_JITTER))
        return False

    async def renew(self, stop: asyncio.Event) -> bool:
        """Renew every renew interval until `stop` is set (True) or the lease is lost (False).

        Each renewal retries every renew interval for up to the renew deadline; past it the lease
        may already have expired in a standby's eyes, so leadership is given up. A renewal that
        finds the Lease deleted or held by another gives it up at once (lost_reason says which).
        """
        self.lost_reason, self._leading = "", True
        try:
            while not stop.is_set():
                renewed = False
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.config.renew_deadline):
                        renewed = await self._poll_renew(stop)
                self._report_transition()
                if not renewed:
                    metrics.leader_election_master_status.labels(self.name).set(0)
                    if not self.lost_reason:  # else _lose said it; client-go's info line: the error is the manager's
                        log.info("Failed to renew lease", lock=self._desc(), err="context deadline exceeded")
                    if self._event_on_loss:
                        self.lock.record_event("stopped leading")
                    return False
                log.v(5).info("Successfully renewed lease", lock=self._desc())
                await _sleep_unless(stop, self.renew_interval)
            return True
        finally:
            self._leading = False

    async def _poll_renew(self, stop: asyncio.Event) -> bool:
        """Retry until renewed or lost; a shutdown in the meantime also ends the wait."""
        while not await self.try_acquire_or_renew():
            if self.lost_reason:
                return False
            await _sleep_unless(stop, self.renew_interval)
            if stop.is_set():
                return True
        return True

    async def release(self) -> bool:
        """Hand the lease back: empty holder, 1 s duration, so a standby need not wait for expiry."""
        if not self.is_leader():
            return True
        # Read first, as client-go's release does: a PUT over the Lease last renewed fails with a Conflict
        # once anything else wrote it (a label, a renewal whose answer was lost), and a standby then
        # waits out the whole lease.
        try:
            current = await self.lock.get()
        except NotFound:
            log.info("lease lock not found", lock=self._desc())
            return False
        except (ApiError, TransportError) as err:
            log.error(err, "error retrieving resource lock", lock=self._desc())
            return False
        if current.holder_identity != self.identity:  # taken over since: nothing of ours to hand back
            metrics.leader_election_master_status.labels(self.name).set(0)
            log.info("Lease already held by another candidate, not released", lock=self._desc(),
                     holder=current.holder_identity)
            return True
        stamp = micro_time(self._wall_clock())
        record = LeaderElectionRecord(
            holder_identity="",
            lease_duration_seconds=1,
            acquire_time=stamp,
            renew_time=stamp,
            leader_transitions=current.leader_transitions,
        )
        try:
            await self.lock.update(record)
        except (ApiError, TransportError) as err:
            log.error(err, "Failed to release lease", lock=self._desc())
            return False
        self._set_observed(record)
        metrics.leader_election_master_status.labels(self.name).set(0)
        self.lock.record_event("stopped leading")
        log.info("Released leader lease", lock=self._desc())
        return True

    # -- health ---------------------------------------------------------------------------------------

    def check(self, tolerance: float = HEALTH_TOLERANCE) -> str | None:
        """None if healthy; a reason when leading but not renewed for lease duration + tolerance.

        A standby is always healthy. A leader past this point should already have exited; the
        check catches a wedged process (client-go's HealthzAdaptor, see kubernetes#70819).
        """
        if not self.is_leader():
            return None
        if self._clock() - self.observed_time > self.config.lease_duration + tolerance:
            return f"failed election to renew leadership on lease {self.name}"
        return None

    def _report_transition(self) -> None:
        holder = self.observed_record.holder_identity
        if holder != self._reported_leader:
            self._reported_leader = holder
            if holder and holder != self.identity:
                log.info("New leader elected", lock=self._desc(), leader=holder)

    def _desc(self) -> str:
        return self.lock.describe()


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, returning early when `stop` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
