"""When a request is sent again, as client-go's rest.withRetry decides (client-go rest/with_retry.go).

A response asks for a retry with an integer `Retry-After` header on a 429 or a 5xx: the
apiserver sets it for priority-and-fairness and max-in-flight throttling, a watch cache not yet
ready, and storage timeouts (500 ServerTimeout, Retry-After: 2). Without the header nothing is
retried: the caller gets the error (a controller re-queues its key). A GET whose connection broke
(reset, or closed) before the response's head is sent again after 1 s; writes are not, as they
may have been done, nor is a body cut after its head (client-go returns that read error at
once: withRetry sees only what client.Do returns, which ends at the head). A retry waits for
the client's rate limiter again, as client-go's does; a watch is retried the same way until
its response head arrives (a timeout too), not rate limited.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from pykcm.client.httpconnection import HTTPError, ServerDisconnected

MAX_RETRIES = 10  # client-go's default: rest.Config's maxRetries
BROKEN_CONNECTION_WAIT = 1  # seconds: client-go's artificial "Retry-After: 1" for a retryable error
_SECONDS = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.Atoi takes


@dataclass(frozen=True)
class Retry:
    wait: int  # seconds
    reason: str  # logged with the wait for the rate limiter, as client-go's getRetryReason


def after_response(attempt: int, status: int, headers: Mapping[str, str]) -> Retry | None:
    """Attempt number `attempt` (1 is the first) got `status`: the retry it asks for, or None."""
    if attempt > MAX_RETRIES or (status != 429 and status < 500):
        return None
    header = headers.get("retry-after", "").strip()
    if not _SECONDS.fullmatch(header):
        return None
    seconds = max(int(header), 0)
    reason = f"retries: {attempt}, retry-after: {seconds}s - retry-reason: "
    if status == 429:  # priority and fairness names the FlowSchema that throttled it
        flow_schema = headers.get("x-kubernetes-pf-flowschema-uid", "")
        return Retry(seconds, f'{reason}due to server-side throttling, FlowSchema UID: "{flow_schema}"')
    return Retry(seconds, f"{reason}{status}")


def after_error(attempt: int, method: str, err: BaseException, message: str, timeouts: bool = False) -> Retry | None:
    """Attempt `attempt` failed with `err`: a GET whose connection broke before the response's head
    is retried (with `timeouts`, a watch's, also one that timed out, as client-go's Watch does).
    After the head, its status and Retry-After decide, as client-go decides before reading the body."""
    if status := head_status(err):
        return after_response(attempt, status, err.headers if isinstance(err, HTTPError) else {})
    retryable = is_broken_connection(err) or (timeouts and isinstance(err, TimeoutError))
    if attempt > MAX_RETRIES or method != "GET" or not retryable:
        return None
    wait = BROKEN_CONNECTION_WAIT
    reason = f"retries: {attempt}, retry-after: {wait}s - retry-reason: due to retryable error, error: {message}"
    return Retry(wait, reason)


def head_status(err: BaseException) -> int:
    """The status of the response whose body `err` broke off, or 0 for an error before its head."""
    return err.status if isinstance(err, HTTPError) else 0


def is_connection_reset(err: BaseException) -> bool:
    """apimachinery's IsConnectionReset: the peer reset the connection (ECONNRESET), as opposed to
    closing it, refusing it or timing out."""
    return isinstance(err, ConnectionResetError) or (isinstance(err, ServerDisconnected) and err.reset)


def is_broken_connection(err: BaseException) -> bool:
    """apimachinery's IsConnectionReset or IsProbableEOF: the peer reset or closed the connection
    (not a refused connection nor a timeout)."""
    return isinstance(err, (ServerDisconnected, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError,
                            ssl.SSLZeroReturnError))
